#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""GPU health benchmark (issue 11): how long an XID takes from NVML to the NFD feature file, and how often
the daemon wakes up while its event worker is armed and nothing happens. The real daemon runs on a
simulated node on a private bus with the fake NVML's event injection (FAKE_NVML_EVENT_FILE): after the
first pass and the worker's registration, the daemon's context switches (all its threads; the worker is
another process and not counted) are counted over --idle seconds; then, per round, a reset-class XID
(48) is appended for each GPU in turn and the time until the feature file shows the new
gpu-node-agent.unhealthy-gpus count is measured (the file is polled every 0.5 ms); ResetGpuHealth() on
every GPU ends the round. Prints a Markdown table; exits 1 when the worst latency exceeds --limit-ms or
the idle daemon woke up.

Usage: bench/bench-health.py [--build DIR] [--nodes gen-8,dgx-h100] [--rounds 3] [--idle 10]
Needs a build with tests enabled and root (private system bus)."""
import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)


def switches(pid):
    total = 0
    for tid in os.listdir("/proc/%d/task" % pid):
        with open("/proc/%d/task/%s/status" % (pid, tid)) as f:
            for line in f:
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    total += int(line.split()[1])
    return total


def unhealthy(path):
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("nvidia.com/gpu-node-agent.unhealthy-gpus="):
                    return int(line.split("=", 1)[1])
    except FileNotFoundError:
        pass
    return -1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(SRC, "build"))
    ap.add_argument("--nodes", default="gen-8,dgx-h100")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--idle", type=float, default=10.0)
    ap.add_argument("--limit-ms", type=float, default=100.0)
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    os.environ.setdefault("GNA_AGENT", os.path.join(build, "gpu-node-agent"))
    os.environ.setdefault("GNA_CTL", os.path.join(build, "gpunodectl"))
    os.environ.setdefault("GNA_FIXTURE_NODES", os.path.join(build, "tests/fixtures/nodes"))
    os.environ.setdefault("GNA_FIXTURE_PCI_IDS", os.path.join(SRC, "tests/fixtures/pci.ids"))
    os.environ.setdefault("GNA_FAKE_NVML", os.path.join(build, "tests/fakes/libnvidia-ml.so.1"))
    sys.path.insert(0, os.path.join(SRC, "tests/integration"))
    import importlib.util
    from harness import TempDir, busctl
    spec = importlib.util.spec_from_file_location("test_nvml", os.path.join(SRC, "tests/integration/test-nvml.py"))
    test_nvml = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(test_nvml)

    rows, ok = [], True
    for node in a.nodes.split(","):
        with TempDir() as tmp:
            events = os.path.join(tmp, "events")
            open(events, "w").close()
            d = test_nvml.Daemon(tmp, node, env={"FAKE_NVML_EVENT_FILE": events})
            try:
                d.reconcile()
                time.sleep(0.5)  # the worker registers and answers its first check
                n_gpus = int(d.prop("GpuCount").split()[1])
                pid = d.agent.proc.pid
                before = switches(pid)
                time.sleep(a.idle)
                wake = switches(pid) - before
                ff = d.node.feature_file()
                lat = []
                for _ in range(a.rounds):
                    for g in range(n_gpus):
                        want = unhealthy(ff) + 1
                        t0 = time.monotonic()
                        with open(events, "a") as f:
                            f.write("xid %d 48\n" % g)
                        while unhealthy(ff) != want:
                            if time.monotonic() - t0 > 5:
                                raise SystemExit("no label change 5 s after XID 48 on GPU %d" % g)
                            time.sleep(0.0005)
                        lat.append((time.monotonic() - t0) * 1e3)
                    for g in range(n_gpus):
                        busctl(d.bus, "call", "org.gpunodeagent.Agent1", "/org/gpunodeagent/Agent1",
                               "org.gpunodeagent.Agent1.Manager", "ResetGpuHealth", "u", str(g))
                    t0 = time.monotonic()
                    while unhealthy(ff) != 0 and time.monotonic() - t0 < 5:
                        time.sleep(0.005)
                lat.sort()
                p50, p95, worst = lat[len(lat) // 2], lat[min(len(lat) - 1, int(len(lat) * 0.95))], lat[-1]
                rows.append((node, n_gpus, wake, len(lat), p50, p95, worst))
                ok = ok and worst <= a.limit_ms and wake == 0
                d.stop_clean()
            finally:
                d.close()
    print("| node | GPUs | daemon wakeups in %gs idle (events armed) | XIDs | XID → feature file p50 | p95 | max |" % a.idle)
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for node, n, wake, k, p50, p95, worst in rows:
        print("| %s | %d | %d | %d | %.1f ms | %.1f ms | %.1f ms |" % (node, n, wake, k, p50, p95, worst))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
