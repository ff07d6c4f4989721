#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Integration tests of MIG management: the real daemon with mig.selected set applies the geometry at
start (stage mig done, labels nvidia.com/mig.config and mig.config.state), stopping the hook units
(mig.hooks.stop-units) on tests/fake-systemd around the change and starting them again in reverse order;
a restart re-applies nothing; kill -9 in the middle of an apply (while the GPU reset child runs) and a
restart: the journal is found, the interrupted GPU rolled back, the stopped units started again, the
config applied and all of it reported. Reuses test-devfab.py's private bus with the fake systemd. TAP."""
import importlib.util
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (Agent, BUILD, Fail, Node, Notify, SRC, TempDir, busctl, check, tap_main)  # noqa: E402

_spec = importlib.util.spec_from_file_location("devfab", os.path.join(os.path.dirname(__file__), "test-devfab.py"))
devfab = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(devfab)

from harness import timeout_scale  # noqa: E402
SCALE = timeout_scale()
CTL_FAKE = os.path.join(BUILD, "tests/fakes/fake-nvml-ctl")
CONFIG = os.path.join(SRC, "tests/fixtures/mig-parted/config-default.yaml")
UNITS = ["nvidia-dcgm.service", "kubelet.service"]
YAML = ("driver:\n  enabled: false\nfabric:\n  persistenced: off\n  fabricmanager: off\n"
        "mig:\n  config-file: %s\n  selected: all-balanced\n  hooks:\n    stop-units: [%s]\n" % (CONFIG, ", ".join(UNITS)))




def labels(node):
    out = {}
    with open(node.feature_file()) as f:
        for line in f:
            if "=" in line and not line.startswith("#"):
                k, v = line.strip().split("=", 1)
                out[k] = v
    return out


class Setup:
    """Private bus + fake systemd with the hook units running + a node; agents are started by the test."""

    def __init__(self, tmp, reset_program):
        self.tmp = tmp
        self.bus = devfab.FabricBus(tmp)
        self.systemd = devfab.FakeSystemd(self.bus, {u: "ok" for u in UNITS}, tmp)
        for u in UNITS:
            busctl(self.bus, "call", "org.freedesktop.systemd1", "/org/freedesktop/systemd1",
                   "org.freedesktop.systemd1.Manager", "StartUnit", "ss", u, "replace")
        self.node = Node(tmp, "a100-sxm", YAML)
        with open(os.path.join(self.node.confd, "40-dev.yaml"), "w") as f:
            f.write("paths:\n  dev: %s\n" % self.node.dev)
        # The fake library holds <dev>/nvidiactl and <dev>/nvidia<minor> open as the real one does, and
        # fake-nvml-ctl (the reset program) refuses to reset a GPU any other process holds, as the driver
        # does: the agent's own NVML processes must let go of the GPU around the reset.
        # (Plain files of their own: the devices stage makes <paths.dev>'s nodes, which open as ENXIO here.)
        held = os.path.join(tmp, "held-dev")
        os.makedirs(held)
        for name in ["nvidiactl"] + ["nvidia%d" % i for i in range(8)]:
            open(os.path.join(held, name), "a").close()
        self.env = {"GNA_MIG_RESET_PROGRAM": reset_program, "FAKE_NVML_DEV": held}
        self.notify = None
        self.agent = None

    def start(self, wait_ready=True):
        if os.path.exists(os.path.join(self.tmp, "notify")):
            os.unlink(os.path.join(self.tmp, "notify"))
        self.notify = Notify(self.tmp)
        self.agent = Agent(self.node, self.bus, self.notify, extra_env=self.env, wrapper=[])
        if wait_ready:
            try:
                self.notify.wait_for("READY=1", 60 * SCALE)
            except Fail:
                raise Fail("no READY=1; agent output:\n" + self.agent.output())

    def wait_gpu_held(self):
        """Waits until one of the agent's processes holds GPU 0 open again (the health event worker)."""
        node = os.path.join(self.env["FAKE_NVML_DEV"], "nvidia0")
        deadline = time.monotonic() + 30 * SCALE
        while True:
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    fds = os.listdir("/proc/%s/fd" % pid)
                    if any(os.readlink("/proc/%s/fd/%s" % (pid, fd)) == node for fd in fds):
                        return
                except OSError:
                    continue
            check(time.monotonic() < deadline, "no agent process holds %s after the apply:\n%s"
                  % (node, self.agent.output()[-3000:]))
            time.sleep(0.1)

    def stop_agent(self, sig=signal.SIGTERM):
        rc = self.agent.stop(sig)
        self.notify.close()
        return rc

    def hook_calls(self):
        calls = [c for c in self.systemd.calls() if c.split()[0] in ("StartUnit", "StopUnit")]
        return calls[len(UNITS):]  # after the test's own starts

    def stage(self, name):
        st = devfab.Env.stages(self)
        return st[name]

    def close(self):
        if self.agent and self.agent.proc.poll() is None:
            self.agent.proc.kill()
            self.agent.proc.wait()
        if self.notify:
            self.notify.close()
        self.systemd.stop()
        self.bus.stop()


def test_apply_at_start_with_hooks():
    with TempDir() as tmp:
        s = Setup(tmp, CTL_FAKE)
        try:
            s.start()
            st = s.stage("mig")
            check(st["state"] == "done", "mig stage: %r\n%s" % (st, s.agent.output()[-3000:]))
            check(st["message"].startswith("all-balanced: success: GPU 0 (0000:07:00.0): "
                                           "2g.10gb@0, 1g.5gb@2, 1g.5gb@3, 3g.20gb@4;"), st["message"])
            lab = labels(s.node)
            check(lab.get("nvidia.com/mig.config") == "all-balanced", "labels: %r" % lab)
            check(lab.get("nvidia.com/mig.config.state") == "success", "labels: %r" % lab)
            calls = s.hook_calls()
            check(calls == ["StopUnit nvidia-dcgm.service replace", "StopUnit kubelet.service replace",
                            "StartUnit kubelet.service replace", "StartUnit nvidia-dcgm.service replace"],
                  "hook unit calls: %r" % calls)
            out = s.agent.output()
            check("Stopped kubelet.service for the MIG change." in out, out[-3000:])
            # The resets went through with the agent's NVML processes closed, and they came back after.
            check(out.count("closing the agent's NVML processes for its reset") == 8, out[-3000:])
            s.wait_gpu_held()
            check(s.stop_agent() == 0, "agent exit status")

            # A restart finds the node as configured: no NVML writes, no hooks.
            s.start()
            check(s.hook_calls() == calls, "hooks ran again: %r" % s.hook_calls())
            st = s.stage("mig")
            check(st["state"] == "done" and "all-balanced: success" in st["message"], "mig stage: %r" % st)
            check(s.stop_agent() == 0, "agent exit status")
        finally:
            s.close()


def test_kill_during_apply_then_recovered():
    with TempDir() as tmp:
        marker = os.path.join(tmp, "reset-started")
        slow = os.path.join(tmp, "slow-reset")
        with open(slow, "w") as f:
            f.write("#!/bin/sh\necho $$ > %s\nsleep 60\nexec %s \"$@\"\n" % (marker, CTL_FAKE))
        os.chmod(slow, 0o755)
        s = Setup(tmp, slow)
        try:
            s.start(wait_ready=False)
            devfab.wait_until("the GPU reset to start", lambda: os.path.exists(marker) and open(marker).read(), 30)
            journal = os.path.join(s.node.state, "mig-journal")
            check(os.path.exists(journal), "no journal while applying")
            s.agent.proc.kill()
            s.agent.proc.wait()
            s.notify.close()
            os.killpg(int(open(marker).read()), signal.SIGKILL)  # the reset never happened
            with open(journal) as f:
                text = f.read()
            check(text.startswith("begin config=all-balanced\ngpu pci=0000:07:00.0 index=0 mig=0 pending=0\n"), text)
            check("unit name=kubelet.service\n" in text and "\nend " not in text, text)
            # GPU 0's mode change is pending: what the crash left behind.
            show = subprocess.run([CTL_FAKE, "show"], env=dict(os.environ, **s.node.nvml_env), capture_output=True,
                                  text=True)
            check("pending" in show.stdout or "enabled" in show.stdout, show.stdout + show.stderr)

            s.env["GNA_MIG_RESET_PROGRAM"] = CTL_FAKE
            s.start()
            st = s.stage("mig")
            check(st["state"] == "done", "mig stage: %r\n%s" % (st, s.agent.output()[-3000:]))
            check(st["message"].startswith("An interrupted apply of MIG config all-balanced was found (1 step "
                                           "journaled); rolling the GPUs it had not finished back to their previous "
                                           "layout.: "), st["message"])
            check("all-balanced: success: GPU 0 (0000:07:00.0): 2g.10gb@0" in st["message"], st["message"])
            check("An interrupted apply of MIG config all-balanced was found" in s.agent.output(), "not logged")
            check(not os.path.exists(journal), "journal left behind")
            lab = labels(s.node)
            check(lab.get("nvidia.com/mig.config.state") == "success", "labels: %r" % lab)
            # The units the killed agent had stopped run again.
            calls = s.hook_calls()
            check(calls.count("StartUnit kubelet.service replace") >= 1 and
                  calls.count("StartUnit nvidia-dcgm.service replace") >= 1, "hook unit calls: %r" % calls)
            check(s.stop_agent() == 0, "agent exit status")
        finally:
            s.close()


TESTS = [
    test_apply_at_start_with_hooks,
    test_kill_during_apply_then_recovered,
]


def main():
    return tap_main(TESTS, sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
