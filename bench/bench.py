#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Benchmarks the real daemon on simulated nodes of 1, 2, 8, 16 and 64 GPUs and on an 8-GPU node with every GPU
in MIG mode (7 devices each): time from start to READY=1 (the labels and the CDI spec are written before it,
in the same pass) with the time each stage of that first pass took (the Stages property), peak RSS, wakeups
(context switches) over an idle period, and the NVML calls per labelling pass (the fake NVML's call trace) for
the first pass and for a Reconcile() pass. Prints a Markdown table.

Devices are named from the machine's own udev hwdb and pci.ids, as on a real host (paths.pci-ids unset), so
the figures include what the name look-ups cost there; --pci-ids FILE sets paths.pci-ids instead (e.g. the
tests' 1.3 KB fixture, tests/fixtures/pci.ids, to see the look-ups' share).

Usage: bench/bench.py [--build DIR] [--idle SECONDS] [--runs N] [--nodes gen-1,gen-8-mig] [--pci-ids FILE]
Needs a build with tests enabled (the fixture nodes and the fake NVML are built there) and root (private
system bus)."""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)

# Per node: the number of GPUs and a configuration drop-in. The MIG node is labelled with the mixed
# strategy, the one that reads every MIG device's attributes.
NODES = {
    "gen-1": (1, ""),
    "gen-2": (2, ""),
    "gen-8": (8, ""),
    "gen-16": (16, ""),
    "gen-64": (64, ""),
    "gen-8-mig": (8, "labels:\n  mig-strategy: mixed\n"),
}


def proc_status(pid):
    out = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k] = v.strip()
    return out


def switches(pid):
    """Context switches of every thread of pid: each is a wakeup of the process."""
    total = 0
    for tid in os.listdir("/proc/%d/task" % pid):
        s = proc_status_task(pid, tid)
        total += int(s["voluntary_ctxt_switches"]) + int(s["nonvoluntary_ctxt_switches"])
    return total


def proc_status_task(pid, tid):
    out = {}
    with open("/proc/%d/task/%s/status" % (pid, tid)) as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k] = v.strip()
    return out


def trace_lines(path):
    """NVML calls so far: the fake NVML appends one line per entry-point call."""
    try:
        with open(path) as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def wait_pass_end(notify, start, timeout):
    """Waits until a pass that started after message `start` has finished: the labels stage, the last one,
    has run and STATUS= has left "Running stage" after it (it also says Ready between two stages)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        notify.drain(0.05)
        msgs = notify.messages[start:]
        labels = [i for i, m in enumerate(msgs) if m.startswith("STATUS=Running stage labels")]
        if labels and any(m.startswith(("STATUS=Ready", "STATUS=Degraded", "STATUS=Failed"))
                          for m in msgs[labels[-1]:]):
            return
    raise RuntimeError("the Reconcile pass did not finish within %ds" % timeout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(SRC, "build"))
    ap.add_argument("--idle", type=float, default=30.0)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--nodes", default=",".join(NODES))
    ap.add_argument("--pci-ids", default=None,
                    help="paths.pci-ids for the agent (default: unset, the system's hwdb and pci.ids)")
    a = ap.parse_args()

    build = os.path.abspath(a.build)
    os.environ.setdefault("GNA_SOURCE_ROOT", SRC)
    os.environ.setdefault("GNA_BUILD_ROOT", build)
    os.environ.setdefault("GNA_AGENT", os.path.join(build, "gpu-node-agent"))
    os.environ.setdefault("GNA_CTL", os.path.join(build, "gpunodectl"))
    os.environ.setdefault("GNA_FIXTURE_NODES", os.path.join(build, "tests/fixtures/nodes"))
    os.environ.setdefault("GNA_FAKE_NVML", os.path.join(build, "tests/fakes/libnvidia-ml.so.1"))
    sys.path.insert(0, os.path.join(SRC, "tests/integration"))
    from harness import Agent, Bus, Node, Notify, busctl  # noqa: E402

    def start(tmp, node, trace=None):
        bus = Bus(tmp)
        notify = Notify(tmp)
        n = Node(tmp, node, pci_ids=a.pci_ids)
        if NODES.get(node, (0, ""))[1]:
            with open(os.path.join(n.confd, "50-bench.yaml"), "w") as f:
                f.write(NODES[node][1])
        env = {"FAKE_NVML_TRACE": trace} if trace else {}
        t0 = time.monotonic()
        agent = Agent(n, bus, notify, extra_env=env, extra_args=["--log-level", "warning"])
        notify.wait_for("READY=1", 60)
        return bus, notify, agent, (time.monotonic() - t0) * 1000

    def stage_ms(bus):
        """{stage: milliseconds} of the stages that ran, from the Stages property's start/finish times."""
        p = busctl(bus, "--json=short", "get-property", "org.gpunodeagent.Agent1", "/org/gpunodeagent/Agent1",
                   "org.gpunodeagent.Agent1.Manager", "Stages")
        return {s[0]: (s[3] - s[2]) / 1000 for s in json.loads(p.stdout)["data"] if s[2] and s[3] >= s[2]}

    rows = []
    for node in a.nodes.split(","):
        ready_ms, rss_kb, stages = [], [], {}
        # Timed runs without the call trace: its file appends would be part of the time.
        for _ in range(a.runs):
            with tempfile.TemporaryDirectory(prefix="gna-bench-") as tmp:
                bus, notify, agent, ms = start(tmp, node)
                ready_ms.append(ms)
                for name, v in stage_ms(bus).items():
                    stages.setdefault(name, []).append(v)
                rss_kb.append(int(proc_status(agent.proc.pid)["VmHWM"].split()[0]))
                agent.stop()
                notify.close()
                bus.stop()
        # One more run with the trace: NVML calls of the first pass, while idle, and of a Reconcile pass.
        with tempfile.TemporaryDirectory(prefix="gna-bench-") as tmp:
            trace = os.path.join(tmp, "nvml.trace")
            bus, notify, agent, _ = start(tmp, node, trace)
            pid = agent.proc.pid
            first = trace_lines(trace)
            wake = idle_calls = None
            if a.idle > 0:
                time.sleep(0.5)  # let the coalesced PropertiesChanged go out
                before, calls_before = switches(pid), trace_lines(trace)
                time.sleep(a.idle)
                wake, idle_calls = switches(pid) - before, trace_lines(trace) - calls_before
            calls_before = trace_lines(trace)
            mark = len(notify.messages)
            busctl(bus, "call", "org.gpunodeagent.Agent1", "/org/gpunodeagent/Agent1",
                   "org.gpunodeagent.Agent1.Manager", "Reconcile")
            wait_pass_end(notify, mark, 60)
            again = trace_lines(trace) - calls_before
            rss_kb.append(int(proc_status(pid)["VmHWM"].split()[0]))
            agent.stop()
            notify.close()
            bus.stop()
        # Stages that took under 0.5 ms are left out of the breakdown.
        breakdown = ", ".join("%s %.1f" % (name, statistics.median(v)) for name, v in stages.items()
                              if statistics.median(v) >= 0.5)
        rows.append((node, statistics.median(ready_ms), min(ready_ms), breakdown, max(rss_kb), wake, first, again,
                     idle_calls))

    print("| node | GPUs | start → READY=1 median (min) | of which stages, median ms | peak RSS | wakeups in %gs idle "
          "| NVML calls: first pass | NVML calls: Reconcile pass | NVML calls while idle |" % a.idle)
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for node, med, mn, breakdown, rss, wake, first, again, idle_calls in rows:
        gpus = NODES[node][0] if node in NODES else node.split("-")[-1]
        print("| %s | %s | %.1f ms (%.1f ms) | %s | %.1f MiB | %s | %d | %d | %s |"
              % (node, gpus, med, mn, breakdown, rss / 1024, "n/a" if wake is None else wake, first, again,
                 "n/a" if idle_calls is None else idle_calls))
    return 0


if __name__ == "__main__":
    sys.exit(main())
