#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Benchmarks the real daemon on simulated nodes of 1, 8, 16 and 64 GPUs: time from start to READY=1,
peak RSS, and wakeups (context switches) over an idle period. Prints a Markdown table.

Usage: bench/bench.py [--build DIR] [--idle SECONDS] [--runs N]
Needs a build with tests enabled (the fixture nodes are generated there) and root (private system bus)."""
import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(SRC, "build"))
    ap.add_argument("--idle", type=float, default=30.0)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--nodes", default="gen-1,gen-8,gen-16,gen-64")
    a = ap.parse_args()

    build = os.path.abspath(a.build)
    os.environ.setdefault("GNA_SOURCE_ROOT", SRC)
    os.environ.setdefault("GNA_BUILD_ROOT", build)
    os.environ.setdefault("GNA_AGENT", os.path.join(build, "gpu-node-agent"))
    os.environ.setdefault("GNA_CTL", os.path.join(build, "gpunodectl"))
    os.environ.setdefault("GNA_FIXTURE_NODES", os.path.join(build, "tests/fixtures/nodes"))
    os.environ.setdefault("GNA_FIXTURE_PCI_IDS", os.path.join(SRC, "tests/fixtures/pci.ids"))
    sys.path.insert(0, os.path.join(SRC, "tests/integration"))
    from harness import Agent, Bus, Node, Notify  # noqa: E402

    rows = []
    for node in a.nodes.split(","):
        ready_ms, rss_kb, wake = [], [], None
        for run in range(a.runs):
            with tempfile.TemporaryDirectory(prefix="gna-bench-") as tmp:
                bus = Bus(tmp)
                notify = Notify(tmp)
                n = Node(tmp, node)
                t0 = time.monotonic()
                agent = Agent(n, bus, notify, extra_args=["--log-level", "warning"])
                notify.wait_for("READY=1", 60)
                ready_ms.append((time.monotonic() - t0) * 1000)
                pid = agent.proc.pid
                if run == a.runs - 1 and a.idle > 0:
                    time.sleep(0.5)  # let the coalesced PropertiesChanged go out
                    before = switches(pid)
                    time.sleep(a.idle)
                    wake = switches(pid) - before
                rss_kb.append(int(proc_status(pid)["VmHWM"].split()[0]))
                agent.stop()
                notify.close()
                bus.stop()
        rows.append((node, statistics.median(ready_ms), min(ready_ms), max(rss_kb), wake))

    print("| node | GPUs | start → READY=1 median (min) | peak RSS | wakeups in %gs idle |" % a.idle)
    print("| --- | ---: | ---: | ---: | ---: |")
    for node, med, mn, rss, wake in rows:
        gpus = node.split("-")[-1]
        print("| %s | %s | %.1f ms (%.1f ms) | %.1f MiB | %s |" % (node, gpus, med, mn, rss / 1024,
                                                                "n/a" if wake is None else wake))
    return 0


if __name__ == "__main__":
    sys.exit(main())
