#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""GPU health (issue 11): the real daemon on a simulated node with faults injected into the fake NVML's
event set (tests/fakes/fake-nvml-events.c: FAKE_NVML_EVENT_FILE, FAKE_NVML_EVENTS). An injected XID
reaches the GPU's Health property, the Manager's Health/UnhealthyGpus/State, the nvidia.com/gpu.health
labels and the health.on-unhealthy hook within 1 s; a recoverable fault clears after a clean re-check, one
whose re-check fails stays until the check passes; a fatal one stays failed across re-checks until
ResetGpuHealth(); application XIDs are recorded but leave the GPU ok, and the configuration moves codes
either way; a GPU missing against probe.expect-gpus and an incomplete fabric registration degrade; an event
worker that crashes or hangs is restarted while D-Bus keeps answering. TAP output, figures as comments."""
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import NODES, Agent, Fail, TempDir, busctl, check, tap_main  # noqa: E402

_spec = importlib.util.spec_from_file_location("test_nvml", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                        "test-nvml.py"))
test_nvml = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(test_nvml)
Daemon, wait_until = test_nvml.Daemon, test_nvml.wait_until

from harness import timeout_scale  # noqa: E402
SCALE = timeout_scale()
AGENT_NAME = "org.gpunodeagent.Agent1"
AGENT_PATH = "/org/gpunodeagent/Agent1"
MANAGER = "org.gpunodeagent.Agent1.Manager"
GPU = "org.gpunodeagent.Agent1.Gpu"
LIMIT = 1.0 * SCALE


def note(fmt, *args):
    print("# " + fmt % args, flush=True)


def gpu_path(i):
    return "%s/gpu/%d" % (AGENT_PATH, i)


class Health:
    """A daemon on dgx-h100 with an event file, a hook that appends its environment to a file, and a fast
    re-check."""

    def __init__(self, tmp, dropin="", env=None, node="dgx-h100", hook=None, hook_yaml=None):
        self.events = os.path.join(tmp, "nvml-events")
        open(self.events, "w").close()
        self.hook_out = os.path.join(tmp, "hook.out")
        hook = hook or "env | grep ^GPU_NODE_AGENT_ >> %s; echo --- >> %s" % (self.hook_out, self.hook_out)
        hook_yaml = hook_yaml or "  on-unhealthy: '%s'\n" % hook
        dropin = "health:\n  recheck-delay: 200ms\n" + hook_yaml + dropin
        e = {"FAKE_NVML_EVENT_FILE": self.events}
        e.update(env or {})
        self.env = e
        self.d = Daemon(tmp, node, dropin=dropin, env=e)
        self.d.reconcile()  # health is watched from the end of the first pass on: let it settle

    def restart(self, between=None):
        """Stops the agent (SIGTERM), runs between(), starts a new one on the same node, bus and state."""
        self.d.stop_clean()
        if between:
            between()
        start = len(self.d.notify.messages)
        self.d.agent = Agent(self.d.node, self.d.bus, self.d.notify, extra_env=self.env)
        try:
            self.d.notify.wait_for("READY=1", 60 * SCALE, start)
        except Fail:
            raise Fail("no READY=1 after the restart; agent output:\n" + self.d.agent.output())
        self.d.reconcile()

    def inject(self, line):
        with open(self.events, "a") as f:
            f.write(line + "\n")
        return time.monotonic()

    def labels(self):
        try:
            with open(self.d.node.feature_file()) as f:
                return dict(line.strip().split("=", 1) for line in f if "=" in line and not line.startswith("#"))
        except FileNotFoundError:
            return {}

    def hook_runs(self):
        try:
            with open(self.hook_out) as f:
                text = f.read()
        except FileNotFoundError:
            return []
        runs = []
        for block in text.split("---\n"):
            env = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
            if env:
                runs.append(env)
        return runs

    def gpu_health(self, i):
        return json.loads(busctl(self.d.bus, "--json=short", "get-property", AGENT_NAME, gpu_path(i), GPU,
                                 "Health").stdout)["data"]

    def gpu_events(self, i):
        return json.loads(busctl(self.d.bus, "--json=short", "get-property", AGENT_NAME, gpu_path(i), GPU,
                                 "HealthEvents").stdout)["data"]

    def node_health(self):
        return json.loads(busctl(self.d.bus, "--json=short", "get-property", AGENT_NAME, AGENT_PATH, MANAGER,
                                 "Health").stdout)["data"]

    def wait(self, what, fn, timeout=LIMIT):
        try:
            wait_until(what, fn, timeout / SCALE)
        except Fail as e:
            raise Fail("%s\nagent output:\n%s" % (e, self.d.agent.output()[-4000:]))

    def close(self):
        self.d.stop_clean()
        self.d.close()


def test_fatal_xid_reaches_everything_and_sticks():
    with TempDir() as tmp:
        h = Health(tmp)
        try:
            check(h.gpu_health(3) == "ok", "GPU 3 Health before any fault: %r" % h.gpu_health(3))
            lab = h.labels()
            check(lab.get("nvidia.com/gpu.health") == "ok" and lab.get("nvidia.com/gpu-node-agent.unhealthy-gpus") == "0",
                  "health labels on a healthy node: %r" % {k: v for k, v in lab.items() if "health" in k})
            t0 = h.inject("xid 3 79")
            h.wait("GPU 3 Health failed", lambda: h.gpu_health(3).startswith("failed: XID 79"))
            t_bus = time.monotonic() - t0
            h.wait("gpu.health=failed label", lambda: h.labels().get("nvidia.com/gpu.health") == "failed")
            t_label = time.monotonic() - t0
            h.wait("the hook to run", lambda: h.hook_runs())
            t_hook = time.monotonic() - t0
            note("XID 79 on GPU 3: D-Bus %.0f ms, label %.0f ms, hook %.0f ms", t_bus * 1e3, t_label * 1e3, t_hook * 1e3)
            check(t_label <= LIMIT and t_hook <= LIMIT, "later than 1 s")
            lab = h.labels()
            check(lab.get("nvidia.com/gpu-node-agent.unhealthy-gpus") == "1", "unhealthy-gpus label %r" % lab)
            check(lab.get("nvidia.com/gpu-node-agent.state") == "degraded", "state label %r" % lab)
            h.d.expect("UnhealthyGpus", "u 1")
            h.d.expect("State", 's "degraded"')
            check("GPU 3 (0000:61:00.0) failed: XID 79" in h.node_health(), "Manager Health %r" % h.node_health())
            check(any("XID 79: GPU has fallen off the bus" in e for e in h.gpu_events(3)), "HealthEvents %r" % h.gpu_events(3))
            # gpunodectl shows it: the node's health in status, the GPU's verdict as a column and its reason.
            out = h.d.ctl("status")
            check("Health: failed: " in out and "XID 79" in out, "gpunodectl status:\n%s" % out)
            st = json.loads(h.d.ctl("status", "--json"))
            check(st.get("health", "").startswith("failed") and st.get("unhealthy_gpus") == 1, "status --json %r" % st)
            out = h.d.ctl("gpus")
            row = [line for line in out.splitlines() if line.startswith("3 ")]
            check(row and row[0].rstrip().endswith("failed") and "health: failed: XID 79" in out and
                  all(line.rstrip().endswith("ok") for line in out.splitlines() if line[:2] in ("0 ", "7 ")),
                  "gpunodectl gpus:\n%s" % out)
            gp = json.loads(h.d.ctl("gpus", "--json"))
            check(gp[3]["health"].startswith("failed: XID 79") and gp[0]["health"] == "ok", "gpus --json %r" % gp[3])
            run = h.hook_runs()[0]
            check(run.get("GPU_NODE_AGENT_GPU") == "3" and run.get("GPU_NODE_AGENT_HEALTH") == "failed" and
                  run.get("GPU_NODE_AGENT_GPU_PCI_ADDRESS") == "0000:61:00.0" and
                  run.get("GPU_NODE_AGENT_GPU_UUID", "").startswith("GPU-") and
                  "XID 79" in run.get("GPU_NODE_AGENT_REASON", ""), "hook environment %r" % run)
            # A re-check (each pass runs one) does not clear a fatal fault.
            h.d.reconcile()
            time.sleep(0.5 * SCALE)
            check(h.gpu_health(3).startswith("failed"), "after a re-check GPU 3 is %r" % h.gpu_health(3))
            for i in (0, 1, 2, 4, 5, 6, 7):
                check(h.gpu_health(i) == "ok", "GPU %d Health %r" % (i, h.gpu_health(i)))
            # Only root may say the GPU was reset.
            p = busctl(h.d.bus, "call", AGENT_NAME, AGENT_PATH, MANAGER, "ResetGpuHealth", "u", "3", user="nobody",
                       check_rc=None)
            check(p.returncode != 0 and h.gpu_health(3).startswith("failed"), "nobody could reset GPU health")
            busctl(h.d.bus, "call", AGENT_NAME, AGENT_PATH, MANAGER, "ResetGpuHealth", "u", "3")
            h.wait("GPU 3 ok after ResetGpuHealth", lambda: h.gpu_health(3) == "ok", 5)
            h.wait("gpu.health=ok label", lambda: h.labels().get("nvidia.com/gpu.health") == "ok", 5)
            h.wait("State ready", lambda: h.d.prop("State") == 's "ready"', 5)
            h.d.expect("Health", 's "ok"')
            # The fixture node has a kernel boot id (tests/fixtures/mknode.py), as every real node.
            check("Cannot read the kernel's boot id" not in h.d.agent.output(), "no boot id on the fixture node")
        finally:
            h.close()


def own_proc(tmp, node="dgx-h100", boot_id="4f0c1a5e-8a3b-4d2e-9a41-1b2c3d4e5f60"):
    """A copy of the fixture's proc tree whose kernel boot id the test sets; the drop-in that uses it."""
    proc = os.path.join(tmp, "proc")
    shutil.copytree(os.path.join(NODES, node, "proc"), proc, symlinks=True)
    set_boot_id(proc, boot_id)
    return proc, "paths:\n  proc: %s\n" % proc


def set_boot_id(proc, boot_id):
    os.makedirs(os.path.join(proc, "sys/kernel/random"), exist_ok=True)
    with open(os.path.join(proc, "sys/kernel/random/boot_id"), "w") as f:
        f.write(boot_id + "\n")


def state_records(h):
    path = os.path.join(h.d.node.state, "gpu-health")
    try:
        with open(path) as f:
            return [line.rstrip("\n") for line in f if not line.startswith("#")]
    except FileNotFoundError:
        return None


def test_fatal_fault_survives_agent_restart():
    """A failed GPU is recorded in <state>/gpu-health (boot id, PCI address, UUID, time, reason) and comes back
    failed after an agent restart in the same boot, with its reason; a record from another boot (the reboot
    reset the GPU) or for another UUID (GPU replaced) is dropped; ResetGpuHealth() removes it."""
    with TempDir() as tmp:
        proc, dropin = own_proc(tmp)
        h = Health(tmp, dropin=dropin)
        try:
            check(state_records(h) is None, "gpu-health on a healthy node: %r" % state_records(h))
            uuid = json.loads(busctl(h.d.bus, "--json=short", "get-property", AGENT_NAME, gpu_path(3), GPU,
                                     "Uuid").stdout)["data"]
            h.inject("xid 3 79")
            h.wait("GPU 3 failed", lambda: h.gpu_health(3).startswith("failed: XID 79"))
            h.wait("the failed GPU recorded", lambda: state_records(h) is not None)
            rec = state_records(h)
            check(len(rec) == 2 and rec[0] == "boot 4f0c1a5e-8a3b-4d2e-9a41-1b2c3d4e5f60" and
                  rec[1].startswith("gpu 0000:61:00.0 %s " % uuid) and "XID 79: GPU has fallen off the bus" in rec[1],
                  "gpu-health after XID 79 on GPU 3: %r" % rec)
            before = h.gpu_health(3)

            for n in (1, 2):
                h.restart()
                h.wait("GPU 3 failed after restart %d" % n, lambda: h.gpu_health(3).startswith("failed"), 5)
                got = h.gpu_health(3)
                check(got == before + ", recorded before the agent restarted",
                      "GPU 3 after restart %d: %r (before: %r)" % (n, got, before))
                check(h.labels().get("nvidia.com/gpu.health") == "failed" and h.d.prop("State") == 's "degraded"',
                      "labels/State after restart %d: %r %s" % (n, h.labels().get("nvidia.com/gpu.health"),
                                                                h.d.prop("State")))
                check(any("restored after an agent restart" in e for e in h.gpu_events(3)),
                      "HealthEvents after restart %d: %r" % (n, h.gpu_events(3)))
                check(all(h.gpu_health(i) == "ok" for i in (0, 1, 2, 4, 5, 6, 7)), "other GPUs after the restart")
                check(state_records(h) == rec, "gpu-health after restart %d: %r, was %r" % (n, state_records(h), rec))
            note("restored after two restarts: %s", h.gpu_health(3))

            # Another GPU at the address (a new UUID): the record is not its.
            path = os.path.join(h.d.node.state, "gpu-health")

            def replace_gpu():
                with open(path) as f:
                    text = f.read()
                with open(path, "w") as f:
                    f.write(text.replace(uuid, "GPU-00000000-0000-0000-0000-0000000000aa"))
            h.restart(replace_gpu)
            h.wait("GPU 3 ok (replaced)", lambda: h.gpu_health(3) == "ok", 5)
            h.wait("the replaced GPU's record dropped", lambda: state_records(h) is None, 5)
            check("(replaced): dropping the record" in h.d.agent.output(), "no log of the replaced GPU")

            # The node rebooted (a new boot id): every GPU was reset.
            h.inject("xid 3 48")
            h.wait("GPU 3 failed (DBE XID)", lambda: h.gpu_health(3).startswith("failed: XID 48"))
            h.wait("XID 48 recorded", lambda: state_records(h) and "XID 48" in state_records(h)[1])
            h.restart(lambda: set_boot_id(proc, "9d8e7f60-1111-4222-8333-944455556666"))
            h.wait("GPU 3 ok after a reboot", lambda: h.gpu_health(3) == "ok", 5)
            h.wait("the other boot's record dropped", lambda: state_records(h) is None, 5)
            check("recorded in an earlier boot" in h.d.agent.output(), "no log of the earlier boot's record")
            h.wait("gpu.health=ok label", lambda: h.labels().get("nvidia.com/gpu.health") == "ok", 5)

            # ResetGpuHealth() removes the record: the next restart starts ok.
            h.inject("xid 3 79")
            h.wait("GPU 3 failed again", lambda: h.gpu_health(3).startswith("failed: XID 79"))
            h.wait("recorded again", lambda: state_records(h) is not None)
            check(state_records(h)[0] == "boot 9d8e7f60-1111-4222-8333-944455556666", "boot %r" % state_records(h))
            busctl(h.d.bus, "call", AGENT_NAME, AGENT_PATH, MANAGER, "ResetGpuHealth", "u", "3")
            h.wait("the record removed by ResetGpuHealth", lambda: state_records(h) is None, 5)
            h.restart()
            time.sleep(0.5 * SCALE)
            check(h.gpu_health(3) == "ok", "GPU 3 after ResetGpuHealth and a restart: %r" % h.gpu_health(3))
        finally:
            h.close()


def test_state_file_symlink_and_garbage():
    """A symlink planted at <state>/gpu-health is neither read nor written through (the target stays as it
    was; the link is replaced by our own file); a malformed file is logged and the agent starts clean."""
    with TempDir() as tmp:
        proc, dropin = own_proc(tmp)
        h = Health(tmp, dropin=dropin)
        try:
            uuid = json.loads(busctl(h.d.bus, "--json=short", "get-property", AGENT_NAME, gpu_path(3), GPU,
                                     "Uuid").stdout)["data"]
            path = os.path.join(h.d.node.state, "gpu-health")
            victim = os.path.join(tmp, "victim")
            bait = ("boot 4f0c1a5e-8a3b-4d2e-9a41-1b2c3d4e5f60\ngpu 0000:61:00.0 %s 1700000000 XID 79: planted; "
                    "reset the GPU (nvidia-smi -r)\n" % uuid)

            def plant():
                with open(victim, "w") as f:
                    f.write(bait)
                os.symlink(victim, path)
            h.restart(plant)
            time.sleep(0.5 * SCALE)
            check(h.gpu_health(3) == "ok", "GPU 3 with a planted symlink: %r (the link was followed)" % h.gpu_health(3))
            check("it is a symlink, which is not followed" in h.d.agent.output(), "no log of the refused symlink:\n%s"
                  % h.d.agent.output()[-3000:])
            h.inject("xid 3 79")
            h.wait("GPU 3 failed", lambda: h.gpu_health(3).startswith("failed: XID 79"))
            h.wait("gpu-health replaced by a regular file", lambda: not os.path.islink(path) and os.path.isfile(path))
            with open(victim) as f:
                check(f.read() == bait, "the symlink's target was written to")
            check(any(line.startswith("gpu 0000:61:00.0 %s " % uuid) for line in state_records(h)),
                  "gpu-health %r" % state_records(h))

            def garbage():
                with open(path, "w") as f:
                    f.write("gpu 0000:61:00.0\nnonsense\n")
            h.restart(garbage)
            time.sleep(0.5 * SCALE)
            check(h.gpu_health(3) == "ok", "GPU 3 with a malformed gpu-health: %r" % h.gpu_health(3))
            check("ignoring a malformed line" in h.d.agent.output(), "no log of the malformed file")
            h.wait("the malformed file removed", lambda: state_records(h) is None, 5)
        finally:
            h.close()


def test_reset_by_the_agent_clears_a_fatal_fault():
    """The GPU reset that a MIG mode change runs (mig.reset, the reset program) is the operator's remedy too:
    the GPU's fatal fault and its record go, and the re-check that follows finds it ok."""
    with TempDir() as tmp:
        config = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              "fixtures/mig-parted/config-default.yaml")
        h = Health(tmp, node="a100-sxm", dropin="mig:\n  config-file: %s\n" % config,
                   env={"GNA_MIG_RESET_PROGRAM": test_nvml.FAKE_NVML_CTL})
        try:
            h.inject("xid 0 79")
            h.inject("xid 1 79")
            h.wait("GPUs 0 and 1 failed", lambda: h.gpu_health(0).startswith("failed: XID 79") and
                   h.gpu_health(1).startswith("failed: XID 79"))
            h.wait("both recorded", lambda: state_records(h) and len(state_records(h)) == 3)
            # Only GPU 0 changes its MIG mode (and is reset for it).
            with open(os.path.join(tmp, "one.yaml"), "w") as f:
                f.write("version: v1\nmig-configs:\n  first-enabled:\n    - devices: [0]\n      mig-enabled: true\n"
                        "      mig-devices: {}\n    - devices: [1, 2, 3, 4, 5, 6, 7]\n      mig-enabled: false\n")
            p = busctl(h.d.bus, "--timeout=120", "call", AGENT_NAME, AGENT_PATH, MANAGER, "ApplyMigConfig", "ssb",
                       "first-enabled", os.path.join(tmp, "one.yaml"), "false")
            note("ApplyMigConfig: %s", p.stdout.strip())
            check("reset to activate the MIG mode change" in h.d.agent.output(),
                  "no GPU reset in the apply: %s\n%s" % (p.stdout, h.d.agent.output()[-3000:]))
            h.wait("GPU 0 ok after the agent reset it", lambda: h.gpu_health(0) == "ok", 5)
            check(any("reset by the agent (MIG mode change)" in e for e in h.gpu_events(0)),
                  "HealthEvents of GPU 0: %r" % h.gpu_events(0))
            check(h.gpu_health(1).startswith("failed: XID 79"), "GPU 1 (not reset) is %r" % h.gpu_health(1))
            h.wait("only GPU 1 recorded", lambda: state_records(h) and len(state_records(h)) == 2 and
                   " 0000:" in state_records(h)[1] and all("XID 79" in r for r in state_records(h)[1:]), 5)
        finally:
            h.close()


def test_recoverable_fault_clears_after_recheck():
    with TempDir() as tmp:
        h = Health(tmp)
        try:
            t0 = h.inject("xid 5 94")
            h.wait("GPU 5 degraded", lambda: h.gpu_health(5).startswith("degraded: XID 94"))
            note("XID 94 (recoverable) on GPU 5: degraded after %.0f ms", (time.monotonic() - t0) * 1e3)
            h.wait("GPU 5 ok after its re-check", lambda: h.gpu_health(5) == "ok", 5)
            note("re-check passed %.0f ms after the XID (health.recheck-delay 200ms)", (time.monotonic() - t0) * 1e3)
            check(any("re-check passed" in e for e in h.gpu_events(5)), "events %r" % h.gpu_events(5))
            h.wait("gpu.health back to ok", lambda: h.labels().get("nvidia.com/gpu.health") == "ok", 5)
            # A recoverable fault whose re-check fails (row remapping pending) stays until it passes.
            h.inject("remap 2 0 1 1 0")
            h.inject("xid 2 63")
            h.wait("GPU 2 degraded", lambda: h.gpu_health(2).startswith("degraded"))
            time.sleep(1.0 * SCALE)
            check("row remapping pending" in h.gpu_health(2), "GPU 2 after a failing re-check: %r" % h.gpu_health(2))
            h.inject("remap 2 0 1 0 0")  # the operator reset the GPU: the remap is applied
            h.d.reconcile()
            h.wait("GPU 2 ok once the re-check passes", lambda: h.gpu_health(2) == "ok", 5)
            h.inject("remap 1 0 4 0 1")
            h.d.reconcile()
            h.wait("GPU 1 failed on a row remapping failure", lambda: "row remapping failed" in h.gpu_health(1), 5)
        finally:
            h.close()


def metrics(path):
    """The node_exporter textfile as {(series, gpu): value}."""
    out = {}
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("#") or "{" not in line:
                    continue
                name, rest = line.split("{", 1)
                labels, value = rest.rsplit("}", 1)
                gpu = [kv.split("=", 1)[1].strip('"') for kv in labels.split(",") if kv.startswith("gpu=")]
                out[(name, gpu[0] if gpu else None)] = float(value)
    except FileNotFoundError:
        pass
    return out


def runs_of(h, gpu):
    return [r for r in h.hook_runs() if r.get("GPU_NODE_AGENT_GPU") == str(gpu)]


def test_hook_on_lasting_changes_and_storms():
    """health.on-unhealthy is told the changes that last (issue 27): recoverable XIDs that their re-check
    clears (109, 94) never run it; a fatal XID runs it once, and a storm of 500 fatal XIDs once; a recovery
    runs it with HEALTH=ok and the old state. A storm of 500 application XIDs makes one journal line and,
    when the 10 s window ends, one count; the counters see all 500."""
    with TempDir() as tmp:
        prom = os.path.join(tmp, "gna.prom")
        h = Health(tmp, dropin="metrics:\n  textfile: %s\n" % prom)
        try:
            t_storm = h.inject("\n".join(["xid 0 13"] * 500 + ["xid 2 48"] * 500))
            h.wait("GPU 2 failed by the storm", lambda: h.gpu_health(2).startswith("failed: XID 48"))
            h.wait("every XID counted", lambda: metrics(prom).get(("gpu_node_agent_xid_events_total", "0")) == 500 and
                   metrics(prom).get(("gpu_node_agent_xid_events_total", "2")) == 500, 5)
            t_counted = time.monotonic()
            for xid, gpu in ((109, 5), (94, 6)):
                h.inject("xid %d %d" % (gpu, xid))
                h.wait("GPU %d degraded by XID %d" % (gpu, xid), lambda: h.gpu_health(gpu).startswith("degraded: XID %d" % xid))
            h.wait("GPUs 5 and 6 ok after their re-checks", lambda: h.gpu_health(5) == "ok" and h.gpu_health(6) == "ok", 5)
            h.inject("xid 3 79")
            h.wait("GPU 3 failed", lambda: h.gpu_health(3).startswith("failed: XID 79"))
            h.wait("the hook for GPU 3", lambda: runs_of(h, 3), 5)
            time.sleep(0.5 * SCALE)  # a second run, or one for a cleared fault, would show by now
            runs = h.hook_runs()
            check(sorted(r["GPU_NODE_AGENT_GPU"] for r in runs) == ["2", "3"],
                  "hook runs, wanted one for GPU 2 (the storm) and one for GPU 3:\n%s" % json.dumps(runs, indent=1))
            r3 = runs_of(h, 3)[0]
            check(r3["GPU_NODE_AGENT_HEALTH"] == "failed" and r3["GPU_NODE_AGENT_OLD_HEALTH"] == "ok" and
                  r3["GPU_NODE_AGENT_XID"] == "79" and r3["GPU_NODE_AGENT_GPU_PCI_ADDRESS"] == "0000:61:00.0" and
                  r3["GPU_NODE_AGENT_UNHEALTHY_GPUS"] == "2" and "XID 79" in r3["GPU_NODE_AGENT_REASON"],
                  "GPU 3's run: %r" % r3)
            busctl(h.d.bus, "call", AGENT_NAME, AGENT_PATH, MANAGER, "ResetGpuHealth", "u", "3")
            h.wait("the recovery run for GPU 3", lambda: len(runs_of(h, 3)) == 2, 5)
            r3 = runs_of(h, 3)[1]
            check(r3["GPU_NODE_AGENT_HEALTH"] == "ok" and r3["GPU_NODE_AGENT_OLD_HEALTH"] == "failed" and
                  r3["GPU_NODE_AGENT_REASON"] == "" and r3["GPU_NODE_AGENT_XID"] == "" and
                  r3["GPU_NODE_AGENT_UNHEALTHY_GPUS"] == "1", "GPU 3's recovery run: %r" % r3)
            # One line for the first XID of each code, then the count of the others when the window ends.
            # (A storm that takes more than the 10 s window to arrive, as under valgrind, makes one more
            # of each per window; the total stays exact.)
            windows = 1 + int((t_counted - t_storm) / 10)

            def journal(xid, gpu, pci):
                out = h.d.agent.output()
                more = re.findall(r"XID %d on GPU %d \(%s\): (\d+) more in the last 10 s\." % (xid, gpu, pci), out)
                return out.count("GPU %s: XID %d (" % (pci, xid)), sum(int(m) for m in more)
            h.wait("the storm's counts in the journal", lambda: all(sum(journal(*a)) == 500 for a in
                                                                    ((13, 0, "0000:1b:00.0"), (48, 2, "0000:52:00.0"))),
                   15 * SCALE)
            for a in ((13, 0, "0000:1b:00.0"), (48, 2, "0000:52:00.0")):
                first, more = journal(*a)
                check(first <= windows, "XID %d on GPU %d: %d lines in the journal for a storm of 500 in %d window(s)"
                      % (a[0], a[1], first, windows))
            note("storm of 1000 XIDs counted %.1f s after it began, its counts logged %.1f s after", t_counted - t_storm,
                 time.monotonic() - t_storm)
        finally:
            h.close()


def test_hook_one_run_at_a_time_latest_state_wins():
    """A GPU that fails, recovers and fails again while its hook runs is told once (it was told failed, and
    failed is what it is); the runs of one GPU never overlap; the next recovery is told after the run ends."""
    with TempDir() as tmp:
        log = os.path.join(tmp, "runs")
        h = Health(tmp, hook="echo \"start $GPU_NODE_AGENT_GPU $GPU_NODE_AGENT_HEALTH\" >> %s; sleep 1; "
                   "echo \"end $GPU_NODE_AGENT_GPU\" >> %s" % (log, log))

        def lines():
            try:
                with open(log) as f:
                    return f.read().splitlines()
            except FileNotFoundError:
                return []
        try:
            h.inject("xid 1 79")
            h.wait("the hook started", lambda: lines(), 5)
            busctl(h.d.bus, "call", AGENT_NAME, AGENT_PATH, MANAGER, "ResetGpuHealth", "u", "1")
            h.wait("GPU 1 ok", lambda: h.gpu_health(1) == "ok", 5)
            time.sleep(0.4)  # the re-check that confirms the recovery
            h.inject("xid 1 79")
            h.wait("GPU 1 failed again", lambda: h.gpu_health(1).startswith("failed"))
            time.sleep(2.0 * SCALE)
            check(lines() == ["start 1 failed", "end 1"], "runs while one ran: %r" % lines())
            busctl(h.d.bus, "call", AGENT_NAME, AGENT_PATH, MANAGER, "ResetGpuHealth", "u", "1")
            h.wait("the recovery told", lambda: len(lines()) == 4, 5)
            check(lines() == ["start 1 failed", "end 1", "start 1 ok", "end 1"], "runs: %r" % lines())
        finally:
            h.close()


SLURM_EXAMPLE_MARK = "On Slurm, drain the node when a GPU's fault lasts"


def slurm_example():
    """The Slurm example of docs/configuration.md, as a user copies it."""
    docs = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "docs/configuration.md")
    with open(docs) as f:
        text = f.read()
    check(SLURM_EXAMPLE_MARK in text, "docs/configuration.md lost its Slurm example")
    block = text.split(SLURM_EXAMPLE_MARK, 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    check(block.startswith("health:\n"), "the Slurm example is not a health: block:\n" + block)
    return block[len("health:\n"):]


def test_slurm_example_drains_and_resumes():
    """The documented Slurm hook against stand-ins for scontrol and sinfo (slurmctld is not installed
    here): a lasting fault drains the node with a gpu-node-agent: reason; a recoverable XID that clears
    does not; the node is resumed only when its last unhealthy GPU recovers, and an operator's drain is
    never resumed."""
    with TempDir() as tmp:
        bindir = os.path.join(tmp, "bin")
        os.makedirs(bindir)
        calls = os.path.join(tmp, "scontrol.calls")
        reason = os.path.join(tmp, "reason")
        with open(os.path.join(bindir, "scontrol"), "w") as f:
            f.write("#!/bin/sh\nprintf '%%s\\n' \"$*\" >> %s\n"
                    "case \"$*\" in *state=drain*) printf '%%s\\n' \"${*##*reason=}\" > %s;; "
                    "*state=resume*) : > %s;; esac\n" % (calls, reason, reason))
        with open(os.path.join(bindir, "sinfo"), "w") as f:
            f.write("#!/bin/sh\ncat %s 2>/dev/null\n" % reason)
        for tool in ("scontrol", "sinfo"):
            os.chmod(os.path.join(bindir, tool), 0o755)

        def scontrol():
            try:
                with open(calls) as f:
                    return f.read().splitlines()
            except FileNotFoundError:
                return []
        h = Health(tmp, hook_yaml=slurm_example(), env={"PATH": bindir + ":" + os.environ["PATH"]})
        host = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
        try:
            h.inject("xid 4 109")
            h.wait("GPU 4 ok after its re-check", lambda: h.gpu_health(4) == "ok", 5)
            h.inject("xid 2 79")
            h.wait("a drain", lambda: scontrol(), 5)
            c = scontrol()
            check(len(c) == 1 and c[0].startswith("update nodename=%s state=drain reason=gpu-node-agent: GPU 2 failed: "
                                                  "XID 79" % host), "scontrol calls: %r" % c)
            h.inject("xid 3 48")
            h.wait("the second drain", lambda: len(scontrol()) == 2, 5)
            busctl(h.d.bus, "call", AGENT_NAME, AGENT_PATH, MANAGER, "ResetGpuHealth", "u", "2")
            h.wait("GPU 2 ok", lambda: h.gpu_health(2) == "ok", 5)
            time.sleep(1.5 * SCALE)  # GPU 3 is still failed: no resume
            check(len(scontrol()) == 2, "scontrol calls with GPU 3 still failed: %r" % scontrol())
            busctl(h.d.bus, "call", AGENT_NAME, AGENT_PATH, MANAGER, "ResetGpuHealth", "u", "3")
            h.wait("the resume", lambda: len(scontrol()) == 3, 5)
            check(scontrol()[2] == "update nodename=%s state=resume" % host, "scontrol calls: %r" % scontrol())
            # An operator's drain (another reason) is not resumed by a GPU's recovery.
            with open(reason, "w") as f:
                f.write("maintenance by an operator\n")
            h.inject("xid 5 79")
            h.wait("GPU 5's drain", lambda: len(scontrol()) == 4, 5)
            with open(reason, "w") as f:
                f.write("maintenance by an operator\n")
            busctl(h.d.bus, "call", AGENT_NAME, AGENT_PATH, MANAGER, "ResetGpuHealth", "u", "5")
            h.wait("GPU 5 ok", lambda: h.gpu_health(5) == "ok", 5)
            time.sleep(1.5 * SCALE)
            check(len(scontrol()) == 4, "an operator's drain was resumed: %r" % scontrol())
        finally:
            h.close()


def test_xid_classes_and_configuration():
    with TempDir() as tmp:
        h = Health(tmp, dropin="  xid:\n    ignore: [48]\n    fatal: [31]\n")
        try:
            h.inject("xid 0 13")  # application error: recorded, the GPU stays ok
            h.wait("XID 13 recorded", lambda: any("XID 13" in e for e in h.gpu_events(0)))
            check(h.gpu_health(0) == "ok", "after XID 13 GPU 0 is %r" % h.gpu_health(0))
            h.inject("xid 0 48")  # a reset XID, ignored by configuration
            h.wait("XID 48 recorded", lambda: any("XID 48" in e for e in h.gpu_events(0)))
            check(h.gpu_health(0) == "ok", "after ignored XID 48 GPU 0 is %r" % h.gpu_health(0))
            h.inject("xid 1 31")  # an application XID made fatal by configuration
            h.wait("GPU 1 failed on XID 31", lambda: h.gpu_health(1).startswith("failed: XID 31"))
            h.inject("dbe 6")
            h.wait("GPU 6 failed on a DBE", lambda: h.gpu_health(6).startswith("failed: double-bit ECC"))
            h.inject("xid 4 43 2")  # in MIG GPU instance 2 (NVML names the parent and the instance)
            h.wait("XID 43 in a GPU instance", lambda: any("XID 43 in MIG GPU instance 2" in e for e in h.gpu_events(4)))
            h.inject("sbe 7")
            h.wait("SBE recorded", lambda: any("single-bit" in e for e in h.gpu_events(7)))
            check(h.gpu_health(7) == "ok", "after an SBE GPU 7 is %r" % h.gpu_health(7))
            h.d.expect("UnhealthyGpus", "u 2")
        finally:
            h.close()
    # A bad list entry is an error that names the key and says what to write.
    with TempDir() as tmp:
        d = Daemon(tmp, "dgx-h100", dropin="health:\n  xid:\n    fatal: [79, foo]\n", wait_ready=False)
        try:
            d.agent.proc.wait(30 * SCALE)
            out = d.agent.output()
            check("health.xid.fatal: 'foo' is not an XID" in out, "no clear error for a bad XID:\n" + out[-2000:])
        finally:
            d.close()


def test_slow_hook_ended_with_the_agent():
    """A hook that is still running when the agent stops does not keep it (or itself) alive."""
    with TempDir() as tmp:
        pidfile = os.path.join(tmp, "hook.pid")
        h = Health(tmp, hook="echo $$ > %s; exec sleep 60" % pidfile)
        try:
            h.inject("xid 1 79")
            h.wait("the hook to start", lambda: os.path.exists(pidfile) and open(pidfile).read().strip(), 5)
            pid = int(open(pidfile).read())
            t0 = time.monotonic()
            h.d.stop_clean()
            note("agent exit with a hook running: %.0f ms", (time.monotonic() - t0) * 1e3)

            def gone():
                try:
                    with open("/proc/%d/stat" % pid) as f:
                        return f.read().split()[2] == "Z"
                except FileNotFoundError:
                    return True
            wait_until("the hook process to end", gone, 5)
        finally:
            h.d.close()


def test_gpu_vanishes():
    """A GPU falls off the bus: the XID 79 event fails it at once, the next check finds NVML has lost it (both
    reasons shown); ResetGpuHealth() while it is still lost keeps it failed; once it answers again and the
    operator says it was reset, it is ok."""
    with TempDir() as tmp:
        h = Health(tmp)
        try:
            h.inject("lost 6")
            h.wait("GPU 6 failed", lambda: h.gpu_health(6).startswith("failed: XID 79"))
            h.d.reconcile()
            h.wait("the check to find it lost", lambda: "NVML: GPU is lost" in h.gpu_health(6), 5)
            busctl(h.d.bus, "call", AGENT_NAME, AGENT_PATH, MANAGER, "ResetGpuHealth", "u", "6")
            time.sleep(0.5 * SCALE)
            check(h.gpu_health(6).startswith("failed: lost"), "reset while lost: %r" % h.gpu_health(6))
            h.inject("back 6")
            busctl(h.d.bus, "call", AGENT_NAME, AGENT_PATH, MANAGER, "ResetGpuHealth", "u", "6")
            h.wait("GPU 6 ok once it answers", lambda: h.gpu_health(6) == "ok", 5)
            p = busctl(h.d.bus, "call", AGENT_NAME, AGENT_PATH, MANAGER, "ResetGpuHealth", "u", "42", check_rc=None)
            check(p.returncode != 0 and "There is no GPU 42" in p.stderr, "ResetGpuHealth(42): %r" % p.stderr)
        finally:
            h.close()


def test_expect_gpus_and_fabric():
    with TempDir() as tmp:
        h = Health(tmp, dropin="probe:\n  expect-gpus: 9\n")
        try:
            h.wait("node health degraded", lambda: "expected 9 GPUs (probe.expect-gpus), found 8" in h.node_health(), 5)
            h.wait("gpu.health=degraded", lambda: h.labels().get("nvidia.com/gpu.health") == "degraded", 5)
            h.d.expect("State", 's "degraded"')
            h.d.expect("UnhealthyGpus", "u 0")
        finally:
            h.close()
    with TempDir() as tmp:
        desc = os.path.join(tmp, "nvml.yaml")
        src = os.path.join(test_nvml.NODES if hasattr(test_nvml, "NODES") else "", "dgx-h100", "nvml.yaml")
        from harness import NODES
        with open(os.path.join(NODES, "dgx-h100", "nvml.yaml")) as f:
            text = f.read()
        # GPU 0's fabric registration never completes (as on the B200s whose FM said ready).
        marker = '  - pci: "0000:1b:00.0"\n'
        check(marker in text or marker.replace('"', "") in text, "unexpected dgx-h100 nvml.yaml:\n" + text[:400])
        text = text.replace(marker, marker + '    fabric: {cluster_uuid: "a1b2c3d4-e5f6-0718-293a-4b5c6d7e8f90", clique: 7, '
                            'state: in-progress}\n', 1)
        with open(desc, "w") as f:
            f.write(text)
        del src
        h = Health(tmp, env={"FAKE_NVML_DESCRIPTION": desc})
        try:
            h.wait("GPU 0 degraded by its fabric", lambda: "fabric registration not complete (in progress)" in h.gpu_health(0), 5)
        finally:
            h.close()


def test_timed_event_and_idle():
    """FAKE_NVML_EVENTS: an XID on GPU 3 at T = 1.5 s after the worker armed; before it, the idle daemon
    does not wake up while the worker blocks in the wait."""
    with TempDir() as tmp:
        h = Health(tmp, env={"FAKE_NVML_EVENTS": "3:xid:48@3000"})
        try:
            pid = h.d.agent.proc.pid
            time.sleep(0.3)

            def switches():
                total = 0
                for tid in os.listdir("/proc/%d/task" % pid):
                    with open("/proc/%d/task/%s/status" % (pid, tid)) as f:
                        for line in f:
                            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                                total += int(line.split()[1])
                return total
            before = switches()
            time.sleep(1.0)
            idle = switches() - before
            note("main loop wakeups in 1 s with events armed: %d", idle)
            check(h.gpu_health(3) == "ok", "GPU 3 unhealthy before its timed XID")
            # 0 on the daemon itself; valgrind (GNA_WRAPPER) adds wakeups of its own.
            limit = 5 if os.environ.get("GNA_WRAPPER") else 0
            check(idle <= limit, "the daemon woke up %d times in 1 s of idle (limit %d)" % (idle, limit))
            h.wait("timed XID 48 on GPU 3", lambda: h.gpu_health(3).startswith("failed: XID 48"), 5)
        finally:
            h.close()


def test_worker_crash_and_hang():
    with TempDir() as tmp:
        crash = os.path.join(tmp, "crash")
        open(crash, "w").close()
        h = Health(tmp, env={"FAKE_NVML_CRASH": "nvmlEventSetWait_v2:1", "FAKE_NVML_CRASH_FILE": crash})
        try:
            h.wait("the crash to be reported", lambda: "GPU event worker crashed with signal SEGV" in h.d.agent.output(), 5)
            t = [time.monotonic()]
            h.d.prop("State")
            note("D-Bus read while the event worker crash-loops: %.0f ms", (time.monotonic() - t[0]) * 1e3)
            os.unlink(crash)  # the library works again: the next restart arms
            h.wait("a restarted worker", lambda: "restarting it in" in h.d.agent.output(), 5)
            time.sleep(4.5 * SCALE)  # backoff 1 s, 2 s: at most one more restart
            t0 = h.inject("xid 4 79")
            h.wait("an XID seen by the restarted worker", lambda: h.gpu_health(4).startswith("failed"), 2)
            note("after restart: XID seen in %.0f ms", (time.monotonic() - t0) * 1e3)
        finally:
            h.close()
    with TempDir() as tmp:
        hang = os.path.join(tmp, "hang")
        open(hang, "w").close()
        h = Health(tmp, dropin="nvml:\n  timeout: 1s\n",
                   env={"FAKE_NVML_HANG": "nvmlDeviceRegisterEvents:1", "FAKE_NVML_HANG_FILE": hang})
        try:
            h.wait("the hang to be reported", lambda: "did not register for events within nvml.timeout" in h.d.agent.output(), 5)
            t0 = time.monotonic()
            h.d.prop("State")
            read_ms = (time.monotonic() - t0) * 1e3
            note("D-Bus read while the event worker hangs: %.0f ms", read_ms)
            check(read_ms < 100 * SCALE, "a D-Bus read took %.0f ms while the worker hung" % read_ms)
            os.unlink(hang)
            time.sleep(4.5 * SCALE)
            h.inject("xid 2 95")
            h.wait("an XID seen by the worker after the hang", lambda: h.gpu_health(2).startswith("failed: XID 95"), 2)
        finally:
            h.close()


if __name__ == "__main__":
    tap_main([test_fatal_xid_reaches_everything_and_sticks, test_recoverable_fault_clears_after_recheck,
              test_hook_on_lasting_changes_and_storms, test_hook_one_run_at_a_time_latest_state_wins,
              test_slurm_example_drains_and_resumes,
              test_xid_classes_and_configuration, test_slow_hook_ended_with_the_agent, test_gpu_vanishes, test_expect_gpus_and_fabric, test_timed_event_and_idle,
              test_worker_crash_and_hang, test_fatal_fault_survives_agent_restart,
              test_state_file_symlink_and_garbage, test_reset_by_the_agent_clears_a_fatal_fault], sys.argv[1:])
