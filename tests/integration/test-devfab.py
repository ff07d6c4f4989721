#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Integration tests of the devices and fabric stages and of Unload(): the real daemon on a private
system-like bus that also carries tests/fake-systemd (it owns org.freedesktop.systemd1 there, so the
agent's StartUnit/StopUnit calls reach it as they would reach systemd), against simulated nodes.
Module removal runs through the kmod syscall trap preloaded into the daemon ($GNA_KMOD_TRAP), whose
state directory doubles as the node's sysfs. TAP output; GNA_TIMEOUT_SCALE stretches timeouts."""
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (Agent, BUILD, Bus, CTL, Fail, Node, Notify, SRC, Skip, TempDir, busctl, check,  # noqa: E402
                     get_property, run, tap_main)

from harness import timeout_scale  # noqa: E402
SCALE = timeout_scale()
FAKE_SYSTEMD = os.path.join(BUILD, "tests/fake-systemd/fake-systemd")
KMOD_TRAP = os.environ.get("GNA_KMOD_TRAP", os.path.join(BUILD, "tests/kmod/kmod-trap.so"))
FM = "nvidia-fabricmanager.service"
PD = "nvidia-persistenced.service"
FM_FAILED = ("nvidia-fabricmanager failed: GPUs on an NVSwitch system are unusable until it runs; "
             "see journalctl -u nvidia-fabricmanager")
# The kernel modules are not what these tests are about: the driver stage only reports them.
QUIET_DRIVER = "driver:\n  enabled: false\n"


class FabricBus(Bus):
    """The harness's private system bus with the fake systemd's policy included next to ours."""

    def __init__(self, tmp):
        self.sock = os.path.join(tmp, "system_bus_socket")
        conf = os.path.join(tmp, "bus.conf")
        with open(os.path.join(SRC, "tests/integration/system-like.conf.in")) as f:
            template = f.read()
        check("<include>@POLICY@</include>" in template, "system-like.conf.in has no <include>@POLICY@</include>")
        fake_policy = os.path.join(SRC, "tests/fake-systemd/org.freedesktop.systemd1.conf")
        with open(conf, "w") as f:
            f.write(template.replace("<include>@POLICY@</include>",
                                     "<include>@POLICY@</include>\n  <include>%s</include>" % fake_policy)
                    .replace("@SOCKET@", self.sock)
                    .replace("@POLICY@", os.path.join(SRC, "units/org.gpunodeagent.Agent1.conf")))
        self.log = open(os.path.join(tmp, "dbus-daemon.log"), "w")
        self.proc = subprocess.Popen(["dbus-daemon", "--config-file=" + conf, "--nofork", "--print-address"],
                                     stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.address = self.proc.stdout.readline().strip()
        check(self.address.startswith("unix:"), "dbus-daemon did not start")
        os.chmod(tmp, 0o755)


class FakeSystemd:
    def __init__(self, bus, units, tmp):
        args = [FAKE_SYSTEMD]
        for name, behaviour in units.items():
            args += ["--unit", "%s=%s" % (name, behaviour)]
        env = dict(os.environ, DBUS_SYSTEM_BUS_ADDRESS=bus.address)
        self.bus = bus
        self.log = open(os.path.join(tmp, "fake-systemd.log"), "w")
        self.proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.proc.stdout.readline().strip()
        check(line == "READY", "fake-systemd did not start (%r); see %s" % (line, self.log.name))

    def calls(self):
        p = busctl(self.bus, "--json=short", "call", "org.freedesktop.systemd1", "/org/gpunodeagent/FakeSystemd1",
                   "org.gpunodeagent.FakeSystemd1", "Calls")
        return json.loads(p.stdout)["data"][0]

    def starts(self, unit):
        return [c for c in self.calls() if c == "StartUnit %s replace" % unit]

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)
        self.proc.stdout.close()
        self.log.close()


class Env:
    """Bus, fake systemd (when units are given), notify listener and the agent on a node."""

    def __init__(self, tmp, node, yaml="", units=None, dropin=None, env=None, prepare=None):
        self.tmp = tmp
        self.bus = FabricBus(tmp)
        self.systemd = FakeSystemd(self.bus, units, tmp) if units is not None else None
        self.notify = Notify(tmp)
        self.node = Node(tmp, node, yaml)
        # Where the devices stage works and the holder walk looks, whatever the harness's default.
        with open(os.path.join(self.node.confd, "40-dev.yaml"), "w") as f:
            f.write("paths:\n  dev: %s\n" % self.node.dev)
        if dropin:
            with open(os.path.join(self.node.confd, "50-test.yaml"), "w") as f:
                f.write(dropin)
        if prepare:
            prepare(self)
        self.agent = Agent(self.node, self.bus, self.notify, extra_env=env, wrapper=[])
        try:
            self.notify.wait_for("READY=1", 60 * SCALE)
        except Fail:
            self.close()
            raise Fail("no READY=1; agent output:\n" + self.agent.output())

    def stages(self):
        st = json.loads(run([CTL, "--json", "status"], bus=self.bus, check_rc=0).stdout)
        return {s["name"]: s for s in st["stages"]}

    def stage(self, name):
        return self.stages()[name]

    def reconcile_and_wait(self, name):
        """Reconcile(), then wait until stage `name` has run again and finished."""
        before = self.stage(name)["started_usec"] or 0
        run([CTL, "reconcile"], bus=self.bus, check_rc=0)
        wait_until("stage %s to run again" % name,
                   lambda: (lambda s: (s["started_usec"] or 0) > before and s["state"] in ("done", "skipped", "failed"))
                   (self.stage(name)), 30)
        return self.stage(name)

    def close(self):
        """Stops everything; a clean exit of the agent (0 on SIGTERM: no sanitizer report, no crash)
        is checked unless the test already failed."""
        failing = sys.exc_info()[0] is not None
        rc = self.agent.proc.poll()
        if rc is None:
            self.agent.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.agent.proc.wait(30 * SCALE)
            except subprocess.TimeoutExpired:
                self.agent.proc.kill()
                self.agent.proc.wait()
        self.notify.close()
        if self.systemd:
            self.systemd.stop()
        self.bus.stop()
        if not failing:
            check(rc == 0, "agent exited %r on SIGTERM:\n%s" % (rc, self.agent.output()[-4000:]))


def wait_until(what, fn, timeout):
    deadline = time.monotonic() + timeout * SCALE
    while time.monotonic() < deadline:
        if fn():
            return
        time.sleep(0.05)
    raise Fail("timed out waiting for " + what)


def char_device(path):
    st = os.lstat(path)
    check(stat.S_ISCHR(st.st_mode), "%s is not a character device" % path)
    return os.major(st.st_rdev), os.minor(st.st_rdev), stat.S_IMODE(st.st_mode), st.st_ino


def proc_devices_major(node_root, name):
    with open(os.path.join(node_root, "proc/devices")) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 2 and parts[1] == name:
                return int(parts[0])
            if line.startswith("Block devices"):
                break
    raise Fail("%s not in the fixture's /proc/devices" % name)


def gpu_minors(node_root):
    minors = []
    gpus = os.path.join(node_root, "proc/driver/nvidia/gpus")
    for bdf in sorted(os.listdir(gpus)):
        with open(os.path.join(gpus, bdf, "information")) as f:
            for line in f:
                if line.startswith("Device Minor:"):
                    minors.append(int(line.split(":")[1]))
    return minors


def test_devices_nodes_and_second_pass():
    if os.geteuid() != 0:
        raise Skip("creating device nodes (mknod) needs root")
    with TempDir() as tmp:
        e = Env(tmp, "dgx-h100", QUIET_DRIVER + "fabric:\n  persistenced: off\n  fabricmanager: off\n")
        try:
            s = e.stage("devices")
            check(s["state"] == "done", "devices stage: %r" % s)
            dev, root = e.node.dev, e.node.node
            minors = gpu_minors(root)
            check(len(minors) == 8, "fixture lists %d GPUs" % len(minors))
            uvm, caps = proc_devices_major(root, "nvidia-uvm"), proc_devices_major(root, "nvidia-caps")
            nvswitch = proc_devices_major(root, "nvidia-nvswitch")
            # The fixture's driver lists no nvswitch devices under /proc yet: only the control node.
            expect = {"nvidiactl": (195, 255, 0o666), "nvidia-uvm": (uvm, 0, 0o666),
                      "nvidia-nvswitchctl": (nvswitch, 255, 0o666),
                      "nvidia-uvm-tools": (uvm, 1, 0o666),
                      # mig/config and mig/monitor: the driver's own modes (no capabilities files here)
                      "nvidia-caps/nvidia-cap1": (caps, 1, 0o400), "nvidia-caps/nvidia-cap2": (caps, 2, 0o444)}
            for n in minors:
                expect["nvidia%d" % n] = (195, n, 0o666)
            inodes = {}
            for name, (major, minor, mode) in expect.items():
                got = char_device(os.path.join(dev, name))
                check(got[:3] == (major, minor, mode), "%s is %d:%d %o, wanted %d:%d %o" % ((name,) + got[:3] +
                                                                                          (major, minor, mode)))
                inodes[name] = got[3]
                link = os.path.join(dev, "char", "%d:%d" % (major, minor))
                check(os.readlink(link) == "../" + name, "%s -> %s, wanted ../%s" % (link, os.readlink(link), name))
            made = set(os.listdir(dev)) | {"nvidia-caps/" + n for n in os.listdir(os.path.join(dev, "nvidia-caps"))}
            check(made == set(expect) | {"char", "nvidia-caps"}, "nodes made: %r" % sorted(made))
            check("created" in s["message"], "first pass message does not say it created nodes: " + s["message"])

            # A node with the wrong device number is replaced; everything else is left as it is.
            os.unlink(os.path.join(dev, "nvidia1"))
            os.mknod(os.path.join(dev, "nvidia1"), 0o666 | stat.S_IFCHR, os.makedev(1, 3))
            s = e.reconcile_and_wait("devices")
            check(s["state"] == "done" and "1 replaced" in s["message"], "second pass: %r" % s)
            check(char_device(os.path.join(dev, "nvidia1"))[:2] == (195, 1), "wrong nvidia1 not replaced")
            for name, ino in inodes.items():
                if name != "nvidia1":
                    check(char_device(os.path.join(dev, name))[3] == ino, "%s was re-created (new inode)" % name)

            s = e.reconcile_and_wait("devices")
            check(s["state"] == "done" and "created" not in s["message"] and "replaced" not in s["message"]
                  and "unchanged" in s["message"], "third pass touched nodes: %r" % s)
        finally:
            e.close()


def test_devices_mig_caps_from_nvml():
    """The nvml stage runs after devices: the capability nodes of the MIG devices NVML reports are made in
    the first pass as soon as the snapshot is in (not one pass later), and a second pass changes nothing."""
    if os.geteuid() != 0:
        raise Skip("creating device nodes (mknod) needs root")
    with TempDir() as tmp:
        e = Env(tmp, "a30", QUIET_DRIVER + "fabric:\n  persistenced: off\n")
        try:
            caps = os.path.join(e.node.dev, "nvidia-caps")
            # Exactly the GI and CI access nodes of the MIG devices the agent reports, by mig-minors.
            with open(os.path.join(e.node.node, "proc/driver/nvidia-caps/mig-minors")) as f:
                minors = dict(line.split() for line in f if line.strip())
            gpus = json.loads(run([CTL, "--json", "gpus"], bus=e.bus, check_rc=0).stdout)
            devices = gpus[0]["mig_devices"]
            check(len(devices) == 3, "fixture's MIG devices: %r" % devices)
            want = {"nvidia-cap1", "nvidia-cap2"}
            for d in devices:
                want.add("nvidia-cap" + minors["gpu0/gi%d/access" % d["gi_id"]])
                want.add("nvidia-cap" + minors["gpu0/gi%d/ci%d/access" % (d["gi_id"], d["ci_id"])])
            first = set(os.listdir(caps))
            check(first == want, "first pass made caps %r, wanted %r" % (sorted(first), sorted(want)))
            inodes = {n: os.lstat(os.path.join(caps, n)).st_ino for n in want}
            s = e.reconcile_and_wait("devices")
            check(s["state"] == "done", "devices: %r" % s)
            second = set(os.listdir(caps))
            check(second == want, "MIG capability nodes %r, wanted %r" % (sorted(second), sorted(want)))
            check(all(os.lstat(os.path.join(caps, n)).st_ino == i for n, i in inodes.items()),
                  "the second pass replaced capability nodes that were right")
            check(char_device(os.path.join(caps, sorted(want - {"nvidia-cap1", "nvidia-cap2"})[0]))[2] == 0o444,
                  "access node mode is not the driver's 0444")
        finally:
            e.close()


def test_devices_disabled_and_oneshot_fabric():
    with TempDir() as tmp:
        e = Env(tmp, "h200", QUIET_DRIVER + "devices:\n  enabled: false\n", units={})
        try:
            s = e.stage("devices")
            check(s["state"] == "skipped" and "devices.enabled is false" in s["message"], "devices: %r" % s)
            check(os.listdir(e.node.dev) == [], "devices disabled but %r created" % os.listdir(e.node.dev))
        finally:
            e.close()
        # --oneshot: no bus, so no fabric.
        out = oneshot(tmp, QUIET_DRIVER + "devices:\n  enabled: false\n", 0)
        check("Stage fabric: running → skipped: no system bus (--oneshot)" in out, "oneshot fabric reason:\n" + out)

    with TempDir() as tmp:
        # A paths.dev that does not exist is named as the problem.
        missing = os.path.join(tmp, "no-such-dev")
        out = oneshot(tmp, QUIET_DRIVER, 1, dropin="paths:\n  dev: %s\n" % missing)
        check("Stage devices: running → failed: Cannot create the NVIDIA device nodes: %s is not a directory "
              "(No such file or directory); set paths.dev (or --root) to where devtmpfs is mounted." % missing in out,
              "missing paths.dev not named:\n" + out)

    if os.geteuid() == 0 and shutil.which("setpriv"):
        with TempDir() as tmp:
            # Root without CAP_MKNOD (a unit with a trimmed CapabilityBoundingSet=): the stage fails and
            # says which capability is missing.
            dev = os.path.join(tmp, "dev")
            os.makedirs(dev)
            out = oneshot(tmp, QUIET_DRIVER, 1, dropin="paths:\n  dev: %s\n" % dev,
                          wrapper=["setpriv", "--bounding-set=-mknod", "--inh-caps=-mknod"])
            check("Stage devices: running → failed: Cannot create the device node %s/nvidia-caps/nvidia-cap1: "
                  "Operation not permitted. Creating device nodes needs CAP_MKNOD: run gpu-node-agent as root, and "
                  "do not drop CAP_MKNOD or set PrivateDevices= in its unit." % dev in out,
                  "missing CAP_MKNOD not named:\n" + out)


def oneshot(tmp, yaml, rc, dropin=None, wrapper=()):
    node = Node(tmp, "h200", yaml)
    if dropin:
        with open(os.path.join(node.confd, "40-dev.yaml"), "w") as f:
            f.write(dropin)
    p = subprocess.run(list(wrapper) + [os.environ.get("GNA_AGENT", os.path.join(BUILD, "gpu-node-agent"))] +
                       node.args() +
                       ["--oneshot"], env=dict(os.environ, **node.nvml_env), capture_output=True, text=True,
                       timeout=60)
    out = p.stdout + p.stderr
    check(p.returncode == rc, "--oneshot exited %d, wanted %d:\n%s" % (p.returncode, rc, out))
    return out


def test_fabric_starts_and_waits():
    with TempDir() as tmp:
        e = Env(tmp, "dgx-h100", QUIET_DRIVER + "devices:\n  enabled: false\n", units={FM: "ok", PD: "ok"})
        try:
            s = e.stage("fabric")
            check(s["state"] == "done", "fabric: %r" % s)
            for what in ("4 NVSwitches", FM + " started", PD + " started"):
                check(what in s["message"], "fabric message lacks %r: %s" % (what, s["message"]))
            # Waited for: the fabric manager was watched after its job finished, so the stage took
            # at least the watch period, and nvml (after it) ran only then.
            check(s["finished_usec"] - s["started_usec"] >= 9_000_000, "fabric manager not watched: %r" % s)
            check(e.stage("nvml")["started_usec"] >= s["finished_usec"], "nvml ran before the fabric stage ended")
            calls = e.systemd.calls()
            check(calls.index("StartUnit %s replace" % FM) < calls.index("StartUnit %s replace" % PD),
                  "start order: %r" % calls)

            # Running units are not started again.
            s = e.reconcile_and_wait("fabric")
            check(s["state"] == "done" and FM + " is running" in s["message"] and PD + " is running" in s["message"],
                  "second pass: %r" % s)
            check(len(e.systemd.starts(FM)) == 1 and len(e.systemd.starts(PD)) == 1,
                  "units started again: %r" % e.systemd.calls())
            check(get_property(e.bus, "State") == 's "ready"', "node not ready with the fabric up")
        finally:
            e.close()


def test_fabric_manager_failure_degrades():
    with TempDir() as tmp:
        # No retry within the test: the failed stage must stay failed while we look at it.
        e = Env(tmp, "dgx-h100",
                QUIET_DRIVER + "devices:\n  enabled: false\nengine:\n  retry-min: 1h\n  retry-max: 1h\n",
                units={FM: "fail", PD: "ok"})
        try:
            s = e.stage("fabric")
            check(s["state"] == "failed" and s["message"].startswith(FM_FAILED), "fabric: %r" % s)
            check(get_property(e.bus, "State") == 's "degraded"', "node not degraded")
            p = run([CTL, "wait-ready", "--timeout=1"], bus=e.bus)
            check(p.returncode == 1 and FM_FAILED in p.stderr, "wait-ready: %d %s" % (p.returncode, p.stderr))
        finally:
            e.close()


def test_fabric_not_installed_and_version():
    with TempDir() as tmp:
        # One GPU, no NVSwitch: only persistenced matters, and it is not installed.
        e = Env(tmp, "h200", QUIET_DRIVER + "devices:\n  enabled: false\n", units={})
        try:
            s = e.stage("fabric")
            check(s["state"] == "done" and "not an NVSwitch system" in s["message"] and
                  PD + " is not installed; not started" in s["message"], "fabric: %r" % s)
            check(e.systemd.starts(PD) == [], "a missing unit was started")
        finally:
            e.close()

    with TempDir() as tmp:
        # The dpkg database says fabric manager 550.90.07; the driver in /proc is 550.127.05.
        root = os.path.join(tmp, "root")
        os.makedirs(os.path.join(root, "var/lib/dpkg"))
        with open(os.path.join(root, "var/lib/dpkg/status"), "w") as f:
            f.write("Package: nvidia-fabricmanager-dev-550\nStatus: install ok installed\nVersion: 550.54.15-1\n\n"
                    "Package: nvidia-fabricmanager-550\nStatus: install ok installed\nVersion: 550.90.07-1\n\n"
                    "Package: zlib1g\nStatus: install ok installed\nVersion: 1:1.2.13.dfsg-1\n")
        e = Env(tmp, "dgx-h100", QUIET_DRIVER + "devices:\n  enabled: false\n", units={FM: "ok", PD: "ok"},
                dropin="paths:\n  root: %s\n" % root)
        try:
            s = e.stage("fabric")
            check(s["state"] == "failed" and
                  "nvidia-fabricmanager 550.90.07 does not match the NVIDIA driver 550.127.05" in s["message"] and
                  "install nvidia-fabricmanager 550.127.05" in s["message"], "fabric: %r" % s)
            check(e.systemd.starts(FM) == [], "a mismatching fabric manager was started")
        finally:
            e.close()


def prepare_unload(e):
    """The node's /sys and /proc copied, so that the kmod trap (state = our sys) can unload modules
    and the holder walk (our proc) sees the test's holder process next to the driver's files."""
    e.sys = os.path.join(e.tmp, "sys")
    e.proc = os.path.join(e.tmp, "proc")
    shutil.copytree(os.path.join(e.node.node, "sys"), e.sys, symlinks=True)
    shutil.copytree(os.path.join(e.node.node, "proc"), e.proc, symlinks=True)
    with open(os.path.join(e.node.confd, "50-unload.yaml"), "w") as f:
        f.write("paths:\n  sys: %s\n  proc: %s\n" % (e.sys, e.proc))
    # The kernel counts module holders and open files in refcnt, not bound devices: nothing but
    # nvidia_uvm uses nvidia here.
    for mod in os.listdir(os.path.join(e.sys, "module")):
        holders = os.path.join(e.sys, "module", mod, "holders")
        if os.path.isdir(holders):
            with open(os.path.join(e.sys, "module", mod, "refcnt"), "w") as f:
                f.write("%d\n" % len(os.listdir(holders)))
    # With devices disabled the test owns <dev>; the holder walk matches nodes by name.
    with open(os.path.join(e.node.dev, "nvidia0"), "w"):
        pass


def test_unload_refused_then_done():
    if not os.path.exists(KMOD_TRAP):
        raise Fail("%s is missing: build the tests first" % KMOD_TRAP)
    with TempDir() as tmp:
        env = {"LD_PRELOAD": KMOD_TRAP, "GNA_KMOD_TRAP_STATE": os.path.join(tmp, "sys"),
               # An ASan build of the agent: the trap comes first in the library list.
               "ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "") + ":verify_asan_link_order=0"}
        e = Env(tmp, "h200", QUIET_DRIVER + "devices:\n  enabled: false\n", units={PD: "ok"}, env=env,
                prepare=prepare_unload)
        holder = None
        try:
            check(e.stage("fabric")["state"] == "done", "fabric: %r" % e.stage("fabric"))
            check(len(e.systemd.starts(PD)) == 1, "persistenced not started: %r" % e.systemd.calls())
            mods = get_property(e.bus, "Modules")
            check(mods.startswith('a(sss) 2 "nvidia" "live" "550.127.05"'), "Modules before: " + mods)
            st = run([CTL, "driver", "status"], bus=e.bus, check_rc=0).stdout
            check("DKMS: idle" in st and "nvidia-uvm live  550.127.05" in st, "driver status:\n" + st)
            node0 = os.path.join(e.node.dev, "nvidia0")
            holder = subprocess.Popen([sys.executable, "-c", "import os, sys, time\n"
                                       "fd = os.open(sys.argv[1], os.O_RDONLY)\nprint('open', flush=True)\n"
                                       "time.sleep(600)\n", node0], stdout=subprocess.PIPE, text=True)
            check(holder.stdout.readline().strip() == "open", "holder did not start")
            os.symlink("/proc/%d" % holder.pid, os.path.join(e.proc, str(holder.pid)))

            # As nobody: denied by the policy, exit 4.
            p = run([CTL, "driver", "unload"], bus=e.bus, user="nobody")
            check(p.returncode == 4, "unload as nobody exited %d: %s" % (p.returncode, p.stderr))

            p = run([CTL, "driver", "unload"], bus=e.bus)
            want = "The GPU is in use: process %d (python3, %s)" % (holder.pid, node0)
            check(p.returncode == 1 and want in p.stderr, "refusal: %d %r, wanted %r" % (p.returncode, p.stderr, want))
            check("StopUnit %s replace" % PD in e.systemd.calls(), "persistenced not stopped before the holder check")
            check(os.path.exists(os.path.join(e.sys, "module/nvidia/initstate")), "refused, but nvidia is gone")
            # The refusal hands the node back to the stages: persistenced comes back.
            wait_until("persistenced started again", lambda: len(e.systemd.starts(PD)) == 2, 30)
            wait_until("the pass to end", lambda: get_property(e.bus, "Stage") == 's "ready"', 30)

            holder.kill()
            holder.wait()
            holder = None
            p = run([CTL, "--json", "driver", "unload"], bus=e.bus)
            check(p.returncode == 0, "unload failed: %d %s" % (p.returncode, p.stderr))
            out = json.loads(p.stdout)
            check(out == {"units_stopped": [PD], "modules_unloaded": ["nvidia-uvm", "nvidia"]}, "reply: %r" % out)
            with open(os.path.join(e.sys, ".trap/log")) as f:
                log = [line.strip() for line in f if line.startswith("unload")]
            check(log == ["unload nvidia_uvm", "unload nvidia"], "trap log: %r" % log)
            # Not loaded any more (and, as this node has no module tree, not loadable either).
            mods = get_property(e.bus, "Modules")
            check('"nvidia" "live"' not in mods and '"nvidia" "missing"' in mods, "Modules after unload: " + mods)
            st = json.loads(run([CTL, "--json", "driver", "status"], bus=e.bus, check_rc=0).stdout)
            check({"name": "nvidia", "state": "missing", "detail": "no module for kernel 6.1.0-27-amd64"}
                  in st["modules"], "driver status: %r" % st)

            # Without a driver the node cannot run GPU work: degraded (and so labelled), not ready.
            wait_until("State degraded after Unload()", lambda: get_property(e.bus, "State") == 's "degraded"', 30)
            check(not os.path.exists(os.path.join(e.node.run, "gpu-node-agent/ready")), "the ready file is still there")
            # Held: a pass leaves the driver alone until Reconcile().
            busctl(e.bus, "call", "org.gpunodeagent.Agent1", "/org/gpunodeagent/Agent1",
                   "org.gpunodeagent.Agent1.Manager", "Unload")
            p = run([CTL, "driver", "unload"], bus=e.bus, check_rc=0)
            check("not loaded; nothing to unload" in p.stdout, "second unload: " + p.stdout)
            s = e.reconcile_and_wait("fabric")
            check(s["state"] == "done" and len(e.systemd.starts(PD)) == 3, "Reconcile did not release the hold")
        finally:
            if holder:
                holder.kill()
                holder.wait()
            e.close()




def test_unload_during_hung_nvml_call():
    """Unload() while the nvml stage waits for an NVML call that never returns: the worker (which holds
    /dev/nvidia* open too) is killed, the stage says why, and the modules come out."""
    if not os.path.exists(KMOD_TRAP):
        raise Fail("%s is missing: build the tests first" % KMOD_TRAP)
    with TempDir() as tmp:
        env = {"LD_PRELOAD": KMOD_TRAP, "GNA_KMOD_TRAP_STATE": os.path.join(tmp, "sys"),
               "ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "") + ":verify_asan_link_order=0",
               # The second pass hangs in its first call that is made on every pass.
               "FAKE_NVML_HANG": "nvmlDeviceGetMigMode:2"}
        e = Env(tmp, "h200", QUIET_DRIVER + "devices:\n  enabled: false\n", units={PD: "ok"}, env=env,
                dropin="nvml:\n  timeout: 5min\n", prepare=prepare_unload)
        try:
            busctl(e.bus, "call", "org.gpunodeagent.Agent1", "/org/gpunodeagent/Agent1",
                   "org.gpunodeagent.Agent1.Manager", "Reconcile")
            wait_until("the nvml call to hang", lambda: "nvmlDeviceGetMigMode hangs" in e.agent.output(), 20)
            check(e.stage("nvml")["state"] == "running", "nvml: %r" % e.stage("nvml"))
            p = run([CTL, "--json", "driver", "unload"], bus=e.bus)
            check(p.returncode == 0, "unload failed: %d %s%s" % (p.returncode, p.stdout, p.stderr))
            check(json.loads(p.stdout)["modules_unloaded"] == ["nvidia-uvm", "nvidia"], "reply: " + p.stdout)
            s = e.stage("nvml")
            check(s["state"] in ("failed", "skipped"), "nvml after Unload(): %r" % s)
            check(e.agent.proc.poll() is None, "the agent died")
            wait_until("the pass to end", lambda: get_property(e.bus, "Stage") == 's "ready"', 30)
        finally:
            e.close()


def test_unload_slow_and_hung_removal():
    """nvidia's exit takes 3 s in the kernel: Unload()'s removals run in a child process, so D-Bus reads
    answer at once meanwhile and the call answers when they are done. Then a removal that does not come
    back (a 10 min exit): D-Bus still answers, and SIGTERM ends the daemon at once."""
    if not os.path.exists(KMOD_TRAP):
        raise Fail("%s is missing: build the tests first" % KMOD_TRAP)
    for delay, hung in (("3000", False), ("600000", True)):
        with TempDir() as tmp:
            env = {"LD_PRELOAD": KMOD_TRAP, "GNA_KMOD_TRAP_STATE": os.path.join(tmp, "sys"),
                   "ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "") + ":verify_asan_link_order=0",
                   "GNA_KMOD_TRAP_DELAY": "nvidia:%s@unload" % delay}
            e = Env(tmp, "h200", QUIET_DRIVER + "devices:\n  enabled: false\n", units={PD: "ok"}, env=env,
                    prepare=prepare_unload)
            call = None
            try:
                call = subprocess.Popen(["busctl", "--address=" + e.bus.address, "--timeout=60", "call",
                                         "org.gpunodeagent.Agent1", "/org/gpunodeagent/Agent1",
                                         "org.gpunodeagent.Agent1.Manager", "Unload"],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                log = os.path.join(e.sys, ".trap/log")
                wait_until("nvidia_uvm to be removed (nvidia's removal is next)",
                           lambda: os.path.exists(log) and "unload nvidia_uvm" in open(log).read(), 20)
                worst = 0.0
                for _ in range(10):
                    t0 = time.monotonic()
                    get_property(e.bus, "Stage")
                    worst = max(worst, time.monotonic() - t0)
                    time.sleep(0.1)
                print("# D-Bus reads during a %s ms removal of nvidia: slowest %.0f ms (busctl included)"
                      % (delay, worst * 1e3))
                check(worst < 1.0 * SCALE, "a D-Bus read took %.2f s during the removal" % worst)
                # No NVML process may start while the driver is taken out (one would hold the GPU through
                # the removal): a MIG read now is refused, saying why.
                p = run([CTL, "mig", "export"], bus=e.bus)
                check(p.returncode != 0 and "being removed" in p.stderr,
                      "mig export during Unload(): %d %s %s" % (p.returncode, p.stdout, p.stderr))
                if not hung:
                    out, err = call.communicate(timeout=30 * SCALE)
                    check(call.returncode == 0 and '"nvidia"' in out, "Unload(): %d %s %s" % (call.returncode, out, err))
                    with open(log) as f:
                        removed = [line.strip() for line in f if line.startswith("unload")]
                    check(removed == ["unload nvidia_uvm", "unload nvidia"], "trap log: %r" % removed)
                    continue
                check(call.poll() is None, "Unload() answered while the removal hangs")
                t0 = time.monotonic()
                e.agent.proc.send_signal(signal.SIGTERM)
                rc = e.agent.proc.wait(10 * SCALE)
                took = time.monotonic() - t0
                print("# SIGTERM during a hung removal: exit %d after %.0f ms" % (rc, took * 1e3))
                check(took < 5 * SCALE, "the daemon took %.1f s to exit on SIGTERM during a hung removal" % took)
                call.kill()
                call.wait()
            finally:
                if call and call.poll() is None:
                    call.kill()
                    call.wait()
                e.close()


TESTS = [
    test_devices_nodes_and_second_pass,
    test_devices_mig_caps_from_nvml,
    test_devices_disabled_and_oneshot_fabric,
    test_fabric_starts_and_waits,
    test_fabric_manager_failure_degrades,
    test_fabric_not_installed_and_version,
    test_unload_refused_then_done,
    test_unload_during_hung_nvml_call,
    test_unload_slow_and_hung_removal,
]


def main():
    return tap_main(TESTS, sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
