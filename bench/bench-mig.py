#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Benchmarks MIG management (issues 5 and 14): NVML calls, split into writes and reads, and wall time of the
mig stage when the real daemon applies a MIG config at start against the fake NVML, in eight cases, four
per node, run in this order on one temporary node each:

  8x A100-SXM4-40GB (node a100-sxm)            8x H100 80GB (node gen-8)
  a. MIG disabled -> all-balanced (+ resets)   e. MIG disabled -> all-balanced (no reset on H100)
  b. restarted: all-balanced again (no-op)     f. restarted: all-balanced again (no-op)
  c. GPU 7 changed to 7x 1g.5gb                g. GPU 7 changed to 7x 1g.10gb
  d. all-1g.5gb                                h. all-1g.10gb

(c and g: tests/fixtures/mig-bench/one-gpu-changed.yaml). The wall time is the mig stage's
started/finished times from the Stages property (it includes the GPU resets and, after a change, the
NVML re-read and the device nodes), plus start -> READY=1 for the whole first pass. Medians of --runs
timed runs at log level warning without the call trace; then one more run of each case at log level debug
with FAKE_NVML_TRACE pointing at the daemon's own (append-mode) log, so the fake's "<symbol> <rc>" lines
fall between the daemon's "Stage mig: pending -> running" and "Stage mig: running -> done" lines and the
mig stage's calls can be told from the other stages'. The traced runs are made under each of the fake's
placement policies (FAKE_NVML_FIT best, first, last): a failed write under any of them fails the bench.
Then the same eight cases with `--oneshot` (the whole run: every stage, start to exit), counting every
NVML call of the run. GPU resets are child processes (GNA_MIG_RESET_PROGRAM),
not NVML calls of the daemon: in the traced run a wrapper appends "reset <args>" to the same log and runs
fake-nvml-ctl. Writes are nvmlDeviceSetMigMode, every *Create* and *Destroy* entry point, and resets.
nvmlShutdown is counted as a call.

Targets (issue 14): the mig stage from MIG off to all-balanced on 8x A100 <= 288 calls, a re-apply <= 134,
0 writes on a re-apply, 0 failed writes under every placement policy.

Each temporary node gets a kernel boot id (the fixtures' proc trees have none; a host always has one): it
keys the MIG profile cache in the state directory, which b and f use after a and e wrote it.

Each case's result is checked before it is reported: the stage succeeded, and the fake's state
(fake-nvml-ctl show) is unchanged by b and changed only on GPU 7 by c.

Usage: bench/bench-mig.py [--build DIR] [--runs N] [--tmpdir DIR] [--reads]
GNA_WRAPPER (as in the integration tests) runs the daemon under a command, e.g. a script around
strace -f -c that passes SIGTERM on to the daemon (strace does not); the times then include it.
Needs a build with tests enabled (fixture nodes, fake NVML, fake-nvml-ctl) and root (private system bus).
Prints a Markdown table."""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
CONFIG_DEFAULT = os.path.join(SRC, "tests/fixtures/mig-parted/config-default.yaml")
ONE_CHANGED = os.path.join(SRC, "tests/fixtures/mig-bench/one-gpu-changed.yaml")

# Stages that would need a real host or a systemd manager are off; the bench measures the mig stage.
BASE_YAML = "driver:\n  enabled: false\nfabric:\n  persistenced: off\n  fabricmanager: off\n"

# (key, description, node, config file, selected config, fresh node)
CASES = [
    ("a", "8× A100-40GB: disabled → all-balanced", "a100-sxm", CONFIG_DEFAULT, "all-balanced", True),
    ("b", "8× A100-40GB: all-balanced re-applied (restart)", "a100-sxm", CONFIG_DEFAULT, "all-balanced", False),
    ("c", "8× A100-40GB: GPU 7 changed to 7× 1g.5gb", "a100-sxm", ONE_CHANGED, "all-balanced-gpu7-1g", False),
    ("d", "8× A100-40GB: → all-1g.5gb", "a100-sxm", CONFIG_DEFAULT, "all-1g.5gb", False),
    ("e", "8× H100 80GB: disabled → all-balanced", "gen-8", CONFIG_DEFAULT, "all-balanced", True),
    ("f", "8× H100 80GB: all-balanced re-applied (restart)", "gen-8", CONFIG_DEFAULT, "all-balanced", False),
    ("g", "8× H100 80GB: GPU 7 changed to 7× 1g.10gb", "gen-8", ONE_CHANGED, "all-balanced-gpu7-1g-h100", False),
    ("h", "8× H100 80GB: → all-1g.10gb", "gen-8", CONFIG_DEFAULT, "all-1g.10gb", False),
]
NO_OP = ("b", "f")
GPU7 = ("c", "g")
FITS = ("best", "first", "last")

# Issue 14: 1/5 of mig-parted's calls for the same change on 8x A100 (1441 and 669).
TARGET_CHANGE, TARGET_REAPPLY = 288, 134

TRACE_RE = re.compile(r"^(nvml\w+) (-?\d+)$")
STAGE_RE = re.compile(r"Stage mig: (\w+) → (\w+)")
# Write classes, in the table's order; everything else the fake traces is a read.
WRITES = [("SetMigMode", re.compile(r"SetMigMode$")),
          ("GI create", re.compile(r"^nvmlDeviceCreateGpuInstance")),
          ("CI create", re.compile(r"^nvmlGpuInstanceCreateComputeInstance")),
          ("CI destroy", re.compile(r"^nvmlComputeInstanceDestroy$")),
          ("GI destroy", re.compile(r"^nvmlGpuInstanceDestroy$"))]


class BenchError(Exception):
    pass


def write_class(symbol):
    for name, rx in WRITES:
        if rx.search(symbol):
            return name
    # The health watcher's event set (nvmlEventSetCreate/Wait/Free, RegisterEvents) changes no GPU state.
    if symbol.startswith("nvmlEventSet") or symbol == "nvmlDeviceRegisterEvents":
        return None
    if "Create" in symbol or "Destroy" in symbol or "Set" in symbol:
        raise BenchError("NVML call %s is neither a read nor a write this bench knows; add it to WRITES" % symbol)
    return None


def parse_log(text):
    """Counts from an interleaved daemon log + fake NVML trace: calls inside the mig stage (writes by class,
    reads, failed calls) and outside it."""
    inside = False
    seen_stage = False
    mig = {name: 0 for name, _ in WRITES}
    mig.update({"reset": 0, "reads": 0, "failed": 0, "by_symbol": {}})
    other = {"reads": 0, "writes": 0}
    for line in text.splitlines():
        m = STAGE_RE.search(line)
        if m:
            if m.group(2) == "running":
                inside, seen_stage = True, True
            elif m.group(1) == "running":
                inside = False
            continue
        if line.startswith("reset "):
            if not inside:
                raise BenchError("a GPU reset ran outside the mig stage: %r" % line)
            mig["reset"] += 1
            continue
        m = TRACE_RE.match(line)
        if not m:
            continue
        cls = write_class(m.group(1))
        if not inside:
            other["writes" if cls else "reads"] += 1
            continue
        if cls and m.group(2) != "0":
            raise BenchError("NVML write %s failed (return code %s)" % (m.group(1), m.group(2)))
        if cls:
            mig[cls] += 1
        else:
            mig["reads"] += 1
            sym = "%s %s" % (m.group(1), "ok" if m.group(2) == "0" else "rc=" + m.group(2))
            mig["by_symbol"][sym] = mig["by_symbol"].get(sym, 0) + 1
            mig["failed"] += m.group(2) != "0"
    if not seen_stage:
        raise BenchError("the mig stage never ran (no 'Stage mig: … → running' in the debug log)")
    mig["writes"] = sum(mig[name] for name, _ in WRITES) + mig["reset"]
    return mig, other


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(SRC, "build"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tmpdir", help="where the temporary nodes go (default: $TMPDIR or /tmp); a tmpfs "
                    "such as /dev/shm takes the fsyncs of the journal and the atomic writes out of the time")
    ap.add_argument("--reads", action="store_true", help="also list the mig stage's reads by entry point")
    a = ap.parse_args()

    build = os.path.abspath(a.build)
    os.environ.setdefault("GNA_SOURCE_ROOT", SRC)
    os.environ.setdefault("GNA_BUILD_ROOT", build)
    os.environ.setdefault("GNA_AGENT", os.path.join(build, "gpu-node-agent"))
    os.environ.setdefault("GNA_FIXTURE_NODES", os.path.join(build, "tests/fixtures/nodes"))
    os.environ.setdefault("GNA_FIXTURE_PCI_IDS", os.path.join(SRC, "tests/fixtures/pci.ids"))
    os.environ.setdefault("GNA_FAKE_NVML", os.path.join(build, "tests/fakes/libnvidia-ml.so.1"))
    ctl_fake = os.path.join(build, "tests/fakes/fake-nvml-ctl")
    sys.path.insert(0, os.path.join(SRC, "tests/integration"))
    from harness import AGENT, WRAPPER, Bus, Node, Notify, busctl  # noqa: E402

    if os.geteuid() != 0:
        print("bench-mig: needs root (the private system bus's policy)", file=sys.stderr)
        return 1
    for p in (AGENT, ctl_fake):
        if not os.access(p, os.X_OK):
            print("bench-mig: %s is missing; build first (ninja -C %s)" % (p, build), file=sys.stderr)
            return 1

    def show(node):
        """fake-nvml-ctl show, split per GPU: {index line prefix: block}."""
        p = subprocess.run([ctl_fake, "show"], env=dict(os.environ, **node.nvml_env), capture_output=True,
                           text=True, check=True)
        blocks, cur = {}, None
        for line in p.stdout.splitlines():
            if line.startswith("GPU "):
                cur = " ".join(line.split()[:2])
                blocks[cur] = []
            if cur:
                blocks[cur].append(line)
        return {k: "\n".join(v) for k, v in blocks.items()}

    def run_oneshot(tmp, node, case):
        """`gpu-node-agent --oneshot` for one case, traced; returns the counts of the whole run."""
        key, _, _, config, selected, _ = case
        with open(os.path.join(node.confd, "50-bench.yaml"), "w") as f:
            f.write("mig:\n  config-file: %s\n  selected: %s\n  reset: auto\n" % (config, selected))
        log_path = os.path.join(tmp, "oneshot-%s.log" % key)
        reset = os.path.join(tmp, "reset-traced")
        with open(reset, "w") as f:
            f.write('#!/bin/sh\necho "reset $*" >> "$FAKE_NVML_TRACE"\nexec %s "$@"\n' % ctl_fake)
        os.chmod(reset, 0o755)
        env = dict(os.environ)
        for k in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "JOURNAL_STREAM", "FAKE_NVML_TRACE", "DBUS_SYSTEM_BUS_ADDRESS"):
            env.pop(k, None)
        env.update(node.nvml_env)
        env.update(FAKE_NVML_TRACE=log_path, GNA_MIG_RESET_PROGRAM=reset)
        with open(log_path, "a") as log:
            p = subprocess.run(WRAPPER + [AGENT] + node.args() + ["--oneshot", "--log-level", "info"], env=env,
                               stdout=log, stderr=subprocess.STDOUT, timeout=300)
        with open(log_path) as f:
            text = f.read()
        if "Stage mig: running → done" not in text:
            raise BenchError("case %s --oneshot: the mig stage did not finish (exit %d); see %s"
                             % (key, p.returncode, log_path))
        total = {"calls": 0, "writes": 0, "reset": 0}
        for line in text.splitlines():
            if line.startswith("reset "):
                total["reset"] += 1
                continue
            m = TRACE_RE.match(line)
            if not m:
                continue
            total["calls"] += 1
            if write_class(m.group(1)):
                if m.group(2) != "0":
                    raise BenchError("case %s --oneshot: NVML write %s failed (%s)" % (key, m.group(1), m.group(2)))
                total["writes"] += 1
        return total

    def run_case(tmp, bus, node, case, traced, fit=None):
        """Starts the daemon for one case, waits for READY=1, returns (mig stage ms, start→ready ms,
        stage message, log path)."""
        key, _, _, config, selected, _ = case
        with open(os.path.join(node.confd, "50-bench.yaml"), "w") as f:
            f.write("mig:\n  config-file: %s\n  selected: %s\n  reset: auto\n" % (config, selected))
        sock = os.path.join(tmp, "notify")
        if os.path.exists(sock):
            os.unlink(sock)
        notify = Notify(tmp)
        log_path = os.path.join(tmp, "agent-%s%s%s.log" % (key, "-traced" if traced else "", "-" + fit if fit else ""))
        env = dict(os.environ)
        for k in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "JOURNAL_STREAM", "FAKE_NVML_TRACE"):
            env.pop(k, None)
        env.update(node.nvml_env)
        env.update(DBUS_SYSTEM_BUS_ADDRESS=bus.address, NOTIFY_SOCKET=notify.path)
        if fit:
            env.update(FAKE_NVML_FIT=fit)
        if traced:
            # Same file, both in append mode: the trace lines land between the daemon's log lines in order.
            reset = os.path.join(tmp, "reset-traced")
            with open(reset, "w") as f:
                f.write('#!/bin/sh\necho "reset $*" >> "$FAKE_NVML_TRACE"\nexec %s "$@"\n' % ctl_fake)
            os.chmod(reset, 0o755)
            env.update(FAKE_NVML_TRACE=log_path, GNA_MIG_RESET_PROGRAM=reset)
        else:
            env.update(GNA_MIG_RESET_PROGRAM=ctl_fake)
        level = "debug" if traced else "warning"
        with open(log_path, "a") as log:
            t0 = time.monotonic()
            proc = subprocess.Popen(WRAPPER + [AGENT] + node.args() + ["--log-level", level], env=env, stdout=log,
                                    stderr=subprocess.STDOUT)
        try:
            notify.wait_for("READY=1", 60)
            ready_ms = (time.monotonic() - t0) * 1000
            p = busctl(bus, "--json=short", "get-property", "org.gpunodeagent.Agent1", "/org/gpunodeagent/Agent1",
                       "org.gpunodeagent.Agent1.Manager", "Stages")
            stages = {s[0]: s for s in json.loads(p.stdout)["data"]}
        except Exception:
            proc.kill()
            proc.wait()
            with open(log_path) as f:
                sys.stderr.write(f.read()[-4000:])
            raise
        finally:
            notify.close()
        proc.terminate()
        try:
            rc = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise BenchError("case %s: the daemon did not exit within 60s of SIGTERM" % key)
        if rc != 0:
            raise BenchError("case %s: the daemon exited %d; see %s" % (key, rc, log_path))
        st = stages.get("mig")
        if not st or st[1] != "done" or ": success" not in st[4]:
            raise BenchError("case %s: mig stage %r" % (key, st))
        return (st[3] - st[2]) / 1000, ready_ms, st[4], log_path

    def run_sequence(cases, traced, fit=None, oneshot=False):
        """Runs cases in order on one temporary node; returns {key: (mig ms, ready ms, counts or None,
        message)}, or with oneshot {key: whole-run counts}."""
        out = {}
        with tempfile.TemporaryDirectory(prefix="gna-bench-mig-", dir=a.tmpdir) as tmp:
            bus = None if oneshot else Bus(tmp)
            try:
                node = Node(tmp, cases[0][2], BASE_YAML)
                # The fixtures' proc trees have no kernel boot id, which a host always has and which keys
                # the MIG profile cache (<paths.state>/mig-profiles): a copy with one.
                proc = os.path.join(tmp, "proc")
                shutil.copytree(os.path.join(os.environ["GNA_FIXTURE_NODES"], cases[0][2], "proc"), proc,
                                symlinks=True)
                os.makedirs(os.path.join(proc, "sys/kernel/random"), exist_ok=True)
                with open(os.path.join(proc, "sys/kernel/random/boot_id"), "w") as f:
                    f.write(str(uuid.uuid4()) + "\n")
                with open(os.path.join(node.confd, "10-bench-proc.yaml"), "w") as f:
                    f.write("paths:\n  proc: %s\n" % proc)
                for case in cases:
                    before = show(node)
                    key = case[0]
                    if oneshot:
                        out[key] = run_oneshot(tmp, node, case)
                    else:
                        mig_ms, ready_ms, message, log_path = run_case(tmp, bus, node, case, traced, fit)
                    after = show(node)
                    if key in NO_OP and after != before:
                        raise BenchError("case %s changed the fake NVML state:\n%s" % (key, "\n".join(after.values())))
                    if key in GPU7:
                        changed = [g for g in before if before[g] != after[g]]
                        if changed != ["GPU 7"]:
                            raise BenchError("case %s changed %r, not GPU 7 alone" % (key, changed))
                    if oneshot:
                        continue
                    counts = None
                    if traced:
                        with open(log_path) as f:
                            counts = parse_log(f.read())
                    out[key] = (mig_ms, ready_ms, counts, message)
            finally:
                if bus:
                    bus.stop()
        return out

    sequences = [[c for c in CASES if c[2] == "a100-sxm"], [c for c in CASES if c[2] == "gen-8"]]
    timed = {c[0]: ([], []) for c in CASES}
    for _ in range(a.runs):
        for seq in sequences:
            for key, (mig_ms, ready_ms, _, _) in run_sequence(seq, False).items():
                timed[key][0].append(mig_ms)
                timed[key][1].append(ready_ms)
    traced = {}
    by_fit = {}
    for fit in FITS:
        by_fit[fit] = {}
        for seq in sequences:
            by_fit[fit].update(run_sequence(seq, True, fit))
    traced = by_fit["best"]
    oneshot = {}
    for seq in sequences:
        oneshot.update(run_sequence(seq, False, oneshot=True))

    print("| case | mig stage, median (min) | start → READY=1, median | NVML writes: SetMigMode / GI create / "
          "CI create / CI destroy / GI destroy / GPU resets | writes | NVML calls in the mig stage "
          "(of them failed) | the same under FIT first / last | NVML calls of the other stages | --oneshot: "
          "NVML calls / writes of the whole run |")
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for key, desc, *_ in CASES:
        mig_ms, ready_ms = timed[key]
        mig, other = traced[key][2]
        if other["writes"]:
            raise BenchError("case %s: %d NVML writes outside the mig stage" % (key, other["writes"]))
        if key in NO_OP and mig["writes"]:
            raise BenchError("case %s: %d NVML writes on a re-apply" % (key, mig["writes"]))
        per = " / ".join(str(mig[name]) for name, _ in WRITES + [("reset", None)])
        fits = " / ".join("%d" % (by_fit[f][key][2][0]["reads"] + by_fit[f][key][2][0]["writes"]) for f in FITS[1:])
        o = oneshot[key]
        print("| %s. %s | %.1f ms (%.1f ms) | %.1f ms | %s | %d | %d (%d) | %s | %d | %d / %d |"
              % (key, desc, statistics.median(mig_ms), min(mig_ms), statistics.median(ready_ms), per,
                 mig["writes"], mig["reads"] + mig["writes"], mig["failed"], fits, other["reads"], o["calls"],
                 o["writes"] + o["reset"]))
    print()
    print("Failed NVML writes under FAKE_NVML_FIT=%s: 0 (the bench stops at the first one)." % "/".join(FITS))
    print()
    for node, off, again in (("8× A100-40GB", "a", "b"), ("8× H100 80GB", "e", "f")):
        calls = {k: traced[k][2][0]["reads"] + traced[k][2][0]["writes"] for k in (off, again)}
        print("Targets (issue 14), %s: MIG off → all-balanced %d NVML calls in the mig stage (≤ %d: %s); "
              "re-applied at a restart %d (≤ %d: %s)." % (node, calls[off], TARGET_CHANGE,
                                                          "met" if calls[off] <= TARGET_CHANGE else "not met",
                                                          calls[again], TARGET_REAPPLY,
                                                          "met" if calls[again] <= TARGET_REAPPLY else "not met"))
    print()
    for key, *_ in CASES:
        print("- %s: %s" % (key, traced[key][3][:300]))
        if a.reads:
            for sym, n in sorted(traced[key][2][0]["by_symbol"].items(), key=lambda kv: -kv[1]):
                print("    %5d %s" % (n, sym))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as e:
        print("bench-mig: %s" % e, file=sys.stderr)
        sys.exit(1)
