#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""D-Bus latency while the agent prepares a slow node. The fake NVML gets a realistic latency model
(FAKE_NVML_DELAY: nvmlInit per GPU, per-GPU reads), the daemon is started, and one client reads a Manager
property every 10 ms over one connection until READY=1: p50/p99/max of those round trips, the time to
READY=1, and the sum of the injected latencies (the physical floor of the NVML part). Also reports
`gpunodectl status` run once while the nvml stage works. Prints a Markdown table.

Usage: bench/bench-latency.py [--build DIR] [--nodes gen-8,gen-64] [--init-ms-per-gpu N]
Needs a build with tests enabled and root (private system bus)."""
import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time

import dbus

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
GPUS = {"gen-1": 1, "gen-8": 8, "gen-16": 16, "gen-64": 64}
READ_MS = 20  # each of nvmlDeviceGetName and nvmlDeviceGetMemoryInfo, per GPU


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(SRC, "build"))
    ap.add_argument("--nodes", default="gen-8,gen-64")
    ap.add_argument("--init-ms-per-gpu", type=int, default=0,
                    help="nvmlInit per GPU (default: 2000 ms, 250 ms on nodes of more than 16 GPUs)")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    os.environ.setdefault("GNA_AGENT", os.path.join(build, "gpu-node-agent"))
    os.environ.setdefault("GNA_CTL", os.path.join(build, "gpunodectl"))
    os.environ.setdefault("GNA_FIXTURE_NODES", os.path.join(build, "tests/fixtures/nodes"))
    os.environ.setdefault("GNA_FIXTURE_PCI_IDS", os.path.join(SRC, "tests/fixtures/pci.ids"))
    os.environ.setdefault("GNA_FAKE_NVML", os.path.join(build, "tests/fakes/libnvidia-ml.so.1"))
    sys.path.insert(0, os.path.join(SRC, "tests/integration"))
    from harness import CTL, Agent, Bus, Node, Notify  # noqa: E402

    print("| node | nvmlInit per GPU | injected NVML latency | time to READY=1 | D-Bus reads | p50 | p99 | max |")
    print("|---|---|---|---|---|---|---|---|")
    statuses = []
    for node in a.nodes.split(","):
        n_gpus = GPUS[node]
        init_ms = a.init_ms_per_gpu or (2000 if n_gpus <= 16 else 250)
        floor_s = (init_ms * n_gpus + 2 * READ_MS * n_gpus) / 1000
        delays = "nvmlInit_v2:*:%d/gpu,nvmlDeviceGetName:*:%d,nvmlDeviceGetMemoryInfo:*:%d" % (init_ms, READ_MS,
                                                                                           READ_MS)
        with tempfile.TemporaryDirectory(prefix="gna-bench-") as tmp:
            bus = Bus(tmp)
            notify = Notify(tmp)
            nd = Node(tmp, node)
            t0 = time.monotonic()
            agent = Agent(nd, bus, notify, extra_env={"FAKE_NVML_DELAY": delays},
                          extra_args=["--log-level", "warning"])
            times, ready = [], []
            try:
                conn = None
                while conn is None and time.monotonic() - t0 < 10:
                    try:
                        conn = dbus.bus.BusConnection(bus.address)
                        props = dbus.Interface(conn.get_object("org.gpunodeagent.Agent1", "/org/gpunodeagent/Agent1",
                                                               introspect=False), "org.freedesktop.DBus.Properties")
                        props.Get("org.gpunodeagent.Agent1.Manager", "Stage", timeout=5)
                    except dbus.exceptions.DBusException:
                        conn = None
                        time.sleep(0.01)

                def status_midway():
                    time.sleep(min(3.0, floor_s / 2))
                    p = subprocess.run([CTL, "status", "--no-pager"], capture_output=True, text=True,
                                       env=dict(os.environ, DBUS_SYSTEM_BUS_ADDRESS=bus.address), timeout=10)
                    statuses.append((node, p.stdout.strip()))
                th = threading.Thread(target=status_midway)
                th.start()
                done = threading.Event()

                def wait_ready():
                    notify.wait_for("READY=1", 600)
                    ready.append(time.monotonic() - t0)
                    done.set()
                threading.Thread(target=wait_ready, daemon=True).start()
                names = ["Stage", "State", "Stages", "GpuCount"]
                while not done.is_set():
                    s = time.monotonic()
                    props.Get("org.gpunodeagent.Agent1.Manager", names[len(times) % 4], timeout=10)
                    times.append((time.monotonic() - s) * 1000)
                    time.sleep(0.01)
                th.join()
                conn.close()
            finally:
                agent.stop()
                notify.close()
                bus.stop()
        s = sorted(times)
        print("| %s | %d ms | %.1f s | %.1f s (+%.1f %%) | %d | %.2f ms | %.2f ms | %.2f ms |"
              % (node, init_ms, floor_s, ready[0], (ready[0] / floor_s - 1) * 100, len(s), s[len(s) // 2],
                 s[min(len(s) - 1, int(len(s) * 0.99))], s[-1]), flush=True)
    for node, out in statuses:
        print("\n`gpunodectl status` on %s while it prepares:\n\n```\n%s\n```" % (node, out))


if __name__ == "__main__":
    main()
