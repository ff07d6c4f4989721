#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Integration tests of the driver stage: the real daemon loads kernel modules from a fixture module
tree (tests/kmod/mkmodtree.py) into a stand-in kernel (tests/fakes/kmod-trap.c, preloaded) and builds
missing ones with a stand-in dkms (tests/fakes-dkms/dkms). TAP output.

How the pieces combine: each test copies a simulated node (tests/fixtures/nodes) and a module tree into
its temporary directory. The config's paths.sys/proc point at the node copy and paths.root at the tree
copy (so modules, modprobe.d and firmware come from the tree); the trap's state directory is the node
copy's sys/, so the /sys/module/<name> the trap writes on a "load" is exactly <paths.sys>/module/<name>
where the agent checks the state. The trap's log (<node>/sys/.trap/log) lists every load in order."""
import os
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (AGENT, FAKE_NVML, Agent, BUILD, Bus, Fail, LatencyProbe, NODES, Node, Notify, SRC, TempDir,  # noqa: E402
                     check, get_property, tap_main)

from harness import timeout_scale  # noqa: E402
SCALE = timeout_scale()
TREES = os.environ.get("GNA_KMOD_FIXTURES", os.path.join(BUILD, "tests/kmod/trees"))
TRAP = os.environ.get("GNA_KMOD_TRAP", os.path.join(BUILD, "tests/kmod/kmod-trap.so"))
FAKE_DKMS = os.path.join(SRC, "tests/fakes-dkms/dkms")
DEPMOD = shutil.which("depmod") or "/usr/sbin/depmod"
KVER = "6.1.0-18-amd64"        # tests/kmod/mkmodtree.py KVER, also dgx-h100-noload.node's kernel
VERSION = "550.54.15"          # mkmodtree.py VERSION
SECURE_BOOT_VAR = "firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"


def asan_instrumented():
    p = subprocess.run(["ldd", AGENT], capture_output=True, text=True)
    return "libasan" in p.stdout


class Case:
    """A node copy + module tree copy + config for one test, and ways to run the agent on it."""

    def __init__(self, tmp, node="dgx-h100-noload", tree="upstream", driver_yaml="", dkms=True):
        self.tmp = tmp
        self.node_dir = os.path.join(tmp, "node")
        shutil.copytree(os.path.join(NODES, node), self.node_dir, symlinks=True)
        self.sys = os.path.join(self.node_dir, "sys")
        self.root = os.path.join(tmp, "root")
        if tree:
            shutil.copytree(os.path.join(TREES, tree), self.root, symlinks=True)
        else:
            os.makedirs(self.root)
        self.dkms_state = os.path.join(self.root, "var/lib/dkms")
        self.node = Node(tmp, self.node_dir)
        with open(os.path.join(self.node.confd, "50-driver.yaml"), "w") as f:
            f.write("paths:\n  root: %s\ndriver:\n  dkms:\n    program: %s\n" % (self.root, FAKE_DKMS))
        # The test's own driver keys in a later drop-in: mappings merge key by key.
        with open(os.path.join(self.node.confd, "60-case.yaml"), "w") as f:
            f.write("driver:\n" + driver_yaml if driver_yaml else "")
        self.env = {
            "LD_PRELOAD": TRAP,
            "GNA_KMOD_TRAP_STATE": self.sys,
            "GNA_FAKE_DKMS_STATE": self.dkms_state,
            "GNA_FAKE_DKMS_MODULES_DIR": os.path.join(self.root, "lib/modules"),
            "GNA_FAKE_DKMS_DEPMOD_BASE": self.root,
            "GNA_FAKE_DKMS_LOG": os.path.join(tmp, "dkms.calls"),
        }
        if asan_instrumented():
            # The trap comes first in the library list, which ASan refuses unless told not to check.
            self.env["ASAN_OPTIONS"] = os.environ.get("ASAN_OPTIONS", "") + ":verify_asan_link_order=0"

    def module_dir(self):
        return os.path.join(self.root, "lib/modules", KVER)

    def headers(self):
        os.makedirs(os.path.join(self.module_dir(), "build"), exist_ok=True)

    def remove_driver_modules(self):
        """Takes the nvidia*.ko out of the tree (as before DKMS built them); they become what the fake
        dkms "builds"."""
        src = os.path.join(self.tmp, "ko-src")
        os.makedirs(src)
        dkms_dir = os.path.join(self.module_dir(), "updates/dkms")
        for f in os.listdir(dkms_dir):
            if f.startswith("nvidia"):
                shutil.move(os.path.join(dkms_dir, f), os.path.join(src, f))
        subprocess.run([DEPMOD, "-C", os.path.join(self.root, "etc/depmod.d"), "-b", self.root, KVER], check=True)
        self.env["GNA_FAKE_DKMS_KO_SRC"] = src

    def dkms_add(self, name="nvidia", version=VERSION):
        src = os.path.join(self.dkms_state, name, version, "source")
        os.makedirs(src)
        with open(os.path.join(src, "dkms.conf"), "w") as f:
            f.write('PACKAGE_NAME="%s"\nPACKAGE_VERSION="%s"\nAUTOINSTALL="yes"\n' % (name, version))

    def module_live(self, name, version=None):
        """A module that is already loaded in the stand-in kernel (e.g. ib_core after MOFED started)."""
        d = os.path.join(self.sys, "module", name)
        os.makedirs(os.path.join(d, "holders"), exist_ok=True)
        with open(os.path.join(d, "initstate"), "w") as f:
            f.write("live\n")
        with open(os.path.join(d, "refcnt"), "w") as f:
            f.write("0\n")
        if version:
            with open(os.path.join(d, "version"), "w") as f:
                f.write(version + "\n")

    def trap_log(self):
        try:
            with open(os.path.join(self.sys, ".trap/log")) as f:
                return f.read().splitlines()
        except FileNotFoundError:
            return []

    def loads(self):
        return [line.split()[1] for line in self.trap_log() if line.startswith("load ")]

    def load_args(self, name):
        for line in self.trap_log():
            if line.startswith("load %s" % name):
                return line.split(None, 2)[2] if len(line.split(None, 2)) > 2 else ""
        raise Fail("%s was not loaded; trap log: %r" % (name, self.trap_log()))

    def full_env(self, extra=None):
        env = dict(os.environ)
        env.pop("NOTIFY_SOCKET", None)
        env.update(self.node.nvml_env)
        env.update(self.env)
        env.update(extra or {})
        return env

    def oneshot(self, extra_env=None, timeout=60, args=()):
        p = subprocess.run([AGENT, "--oneshot"] + self.node.args() + list(args), env=self.full_env(extra_env),
                           capture_output=True, text=True, timeout=timeout * SCALE)
        out = p.stdout + p.stderr
        no_sanitizer_report(out)
        return p.returncode, out

    def stage_state(self):
        with open(os.path.join(self.node.run, "gpu-node-agent/state")) as f:
            for line in f:
                if line.startswith("STAGE_driver="):
                    return line.strip().split("=", 1)[1]
        raise Fail("no STAGE_driver in the state file")


def no_sanitizer_report(output):
    """Other stages may fail on these nodes, so the exit code says little; a sanitizer's report does."""
    for marker in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:"):
        check(marker not in output, "sanitizer report:\n" + output)


def stage_message(output, state):
    """The message of the driver stage's last transition to state, from the agent's log."""
    found = None
    for line in output.splitlines():
        i = line.find("Stage driver: ")
        if i >= 0 and ("→ %s" % state) in line:
            found = line[i:].split(": ", 2)[2] if line[i:].count(": ") >= 2 else ""
    if found is None:
        raise Fail("the driver stage never became %s; agent output:\n%s" % (state, output))
    return found


def expect_stage(case, output, state):
    check(case.stage_state() == state, "driver stage is %s, wanted %s; output:\n%s"
          % (case.stage_state(), state, output))
    return stage_message(output, state)


# ---- tests ------------------------------------------------------------------------------------


def test_fast_path_already_live():
    with TempDir() as tmp:
        # dgx-h100: nvidia and nvidia_uvm live, as after Debian's boot-time load.
        c = Case(tmp, node="dgx-h100", tree=None)
        _, out = c.oneshot()
        msg = expect_stage(c, out, "done")
        check("nvidia 550.127.05 already loaded for kernel 6.1.0-27-amd64" in msg, "message: " + msg)
        check("waits for ib_core" in msg, "peermem skip reason missing: " + msg)
        check(c.trap_log() == [], "the fast path touched the kernel: %r" % c.trap_log())
        with open(os.path.join(c.node.state, "driver.state")) as f:
            record = f.read()
        check("6.1.0-27-amd64" in record and "550.127.05" in record, "driver.state: " + record)

        # Second start: the record matches, nothing to do.
        _, out = c.oneshot()
        msg = expect_stage(c, out, "done")
        check("unchanged since the last check" in msg, "second start not on the fast path: " + msg)
        check(c.trap_log() == [], "the fast path touched the kernel: %r" % c.trap_log())

        # driver.version that differs from the loaded driver: refused in words, nothing unloaded.
        with open(os.path.join(c.node.confd, "70-version.yaml"), "w") as f:
            f.write("driver:\n  version: 535.161.07\n")
        _, out = c.oneshot()
        msg = expect_stage(c, out, "failed")
        check("loaded NVIDIA driver is 550.127.05, but driver.version is 535.161.07" in msg, "message: " + msg)
        check(c.trap_log() == [], "a version mismatch touched the kernel: %r" % c.trap_log())


def test_cold_load_order_and_options():
    with TempDir() as tmp:
        c = Case(tmp, driver_yaml="  modeset: true\n  parameters:\n    nvidia: NVreg_EnableGpuFirmware=0\n"
                 "    nvidia-modeset: hdmi_deepcolor=1\n")
        sb = os.path.join(c.sys, SECURE_BOOT_VAR)
        os.makedirs(os.path.dirname(sb))
        with open(sb, "wb") as f:
            f.write(b"\x06\x00\x00\x00\x01")
        os.makedirs(os.path.join(c.sys, "kernel/security"))
        with open(os.path.join(c.sys, "kernel/security/lockdown"), "w") as f:
            f.write("none [integrity] confidentiality\n")
        _, out = c.oneshot()
        msg = expect_stage(c, out, "done")
        check(c.loads() == ["ipmi_msghandler", "ipmi_devintf", "nvidia", "nvidia_uvm", "nvidia_modeset"],
              "load order: %r" % c.loads())
        args = c.load_args("nvidia")
        check("NVreg_DeviceFileMode=0660" in args and "NVreg_EnableGpuFirmware=0" in args,
              "nvidia options (modprobe.d + driver.parameters): " + args)
        check("uvm_perf_prefetch_enable=0" in c.load_args("nvidia_uvm"), "nvidia-uvm modprobe.d option lost")
        check("hdmi_deepcolor=1" in c.load_args("nvidia_modeset"), "nvidia-modeset parameter lost")
        check("loaded nvidia, nvidia-uvm, nvidia-modeset (driver %s) for kernel %s" % (VERSION, KVER) in msg,
              "message: " + msg)
        check("Secure Boot on, kernel lockdown integrity" in msg, "Secure Boot state not reported: " + msg)
        check("signed by DKMS module signing key" in out, "module signer not reported:\n" + out)

        # Restart: live and recorded, so nothing is loaded again.
        n = len(c.trap_log())
        _, out = c.oneshot()
        msg = expect_stage(c, out, "done")
        check(len(c.trap_log()) == n, "restart loaded again: %r" % c.trap_log()[n:])
        check("unchanged since the last check" in msg, "restart not on the fast path: " + msg)


def test_debian_naming():
    with TempDir() as tmp:
        c = Case(tmp, tree="debian")
        _, out = c.oneshot()
        expect_stage(c, out, "done")
        check(c.loads()[-2:] == ["nvidia", "nvidia_uvm"], "loads: %r" % c.loads())
        args = c.load_args("nvidia")
        # "options nvidia-current …" applies to the file, "options nvidia …" to the kernel name.
        check("NVreg_EnableGpuFirmware=1" in args and "NVreg_DeviceFileMode=0660" in args, "nvidia options: " + args)


def test_missing_firmware():
    with TempDir() as tmp:
        c = Case(tmp, tree="no-firmware")
        _, out = c.oneshot()
        msg = expect_stage(c, out, "failed")
        check("gsp_ga10x.bin" in msg, "missing firmware not named: " + msg)
        check("nvidia" not in c.loads(), "loaded without its firmware: %r" % c.loads())
    with TempDir() as tmp:
        # GSP turned off: the proprietary module does not need the file.
        c = Case(tmp, tree="no-firmware", driver_yaml="  parameters:\n    nvidia: NVreg_EnableGpuFirmware=0\n")
        _, out = c.oneshot()
        expect_stage(c, out, "done")
        check("nvidia" in c.loads(), "not loaded with GSP off: %r" % c.loads())


def write_secure_boot(c, on):
    sb = os.path.join(c.sys, SECURE_BOOT_VAR)
    os.makedirs(os.path.dirname(sb), exist_ok=True)
    with open(sb, "wb") as f:
        f.write(b"\x06\x00\x00\x00" + (b"\x01" if on else b"\x00"))


def test_ekeyrejected():
    with TempDir() as tmp:
        c = Case(tmp)
        write_secure_boot(c, True)
        _, out = c.oneshot({"GNA_KMOD_TRAP_FAIL": "nvidia:EKEYREJECTED"})
        msg = expect_stage(c, out, "failed")
        check("Secure Boot rejected it" in msg and "mokutil --import" in msg, "message: " + msg)
        check("DKMS module signing key" in msg, "signer not named: " + msg)
        check(not os.path.exists(os.path.join(c.sys, "module/nvidia/initstate")), "nvidia left loaded")
    with TempDir() as tmp:
        # Secure Boot off, module.sig_enforce=1: that is what is named, not Secure Boot.
        c = Case(tmp)
        write_secure_boot(c, False)
        os.makedirs(os.path.join(c.sys, "module/module/parameters"))
        with open(os.path.join(c.sys, "module/module/parameters/sig_enforce"), "w") as f:
            f.write("Y\n")
        _, out = c.oneshot({"GNA_KMOD_TRAP_FAIL": "nvidia:EKEYREJECTED"})
        msg = expect_stage(c, out, "failed")
        check("module.sig_enforce=1; Secure Boot is off" in msg and "Secure Boot rejected" not in msg,
              "message: " + msg)


def test_partial_load_rolled_back():
    with TempDir() as tmp:
        c = Case(tmp)
        _, out = c.oneshot({"GNA_KMOD_TRAP_FAIL": "nvidia_uvm:EINVAL"})
        msg = expect_stage(c, out, "failed")
        check("nvidia-uvm" in msg and "Unloaded nvidia again" in msg, "message: " + msg)
        check("unload nvidia" in c.trap_log(), "nvidia not unloaded after the failure: %r" % c.trap_log())
        check(not os.path.exists(os.path.join(c.sys, "module/nvidia/initstate")), "nvidia left loaded")


def test_peermem():
    with TempDir() as tmp:
        c = Case(tmp, tree="peermem-stub")
        c.module_live("ib_core")
        _, out = c.oneshot()
        msg = expect_stage(c, out, "done")
        check("built without InfiniBand support" in msg and "rebuild it against the installed MOFED/ib_core" in msg,
              "stub not explained: " + msg)
        check("nvidia_peermem" not in c.loads(), "the stub was loaded: %r" % c.loads())
    with TempDir() as tmp:
        c = Case(tmp)
        _, out = c.oneshot()
        msg = expect_stage(c, out, "done")
        check("waits for ib_core" in msg, "no ib_core reason: " + msg)
        check("nvidia_peermem" not in c.loads(), "peermem loaded without ib_core")
        # ib_core comes back (MOFED restarted): the next pass, on the fast path, loads peermem.
        c.module_live("ib_core")
        _, out = c.oneshot()
        msg = expect_stage(c, out, "done")
        check(c.loads()[-1:] == ["nvidia_peermem"], "peermem not loaded after ib_core: %r" % c.loads())
        check("nvidia-peermem loaded" in msg, "message: " + msg)


def test_disabled_and_no_gpu():
    with TempDir() as tmp:
        c = Case(tmp, driver_yaml="  enabled: false\n")
        _, out = c.oneshot()
        msg = expect_stage(c, out, "skipped")
        check("driver.enabled: false" in msg, "message: " + msg)
        check(c.trap_log() == [], "disabled stage loaded modules")
    with TempDir() as tmp:
        c = Case(tmp, node="no-gpu")
        _, out = c.oneshot()
        check(expect_stage(c, out, "skipped") == "no NVIDIA GPU", "no-gpu message")


def test_dkms_build_while_dbus_answers():
    with TempDir() as tmp:
        c = Case(tmp, tree="stale")       # modules built for 6.1.0-17-amd64
        c.headers()
        c.dkms_add()
        # What the build "produces": the same modules built for the running kernel.
        src = os.path.join(tmp, "ko-src")
        shutil.copytree(os.path.join(TREES, "upstream/lib/modules", KVER, "updates/dkms"), src)
        c.env.update({"GNA_FAKE_DKMS_KO_SRC": src, "GNA_FAKE_DKMS_DURATION": "3"})
        bus = Bus(tmp)
        notify = Notify(tmp)
        agent = Agent(c.node, bus, notify, extra_env=c.env, wrapper=[])
        try:
            deadline = time.monotonic() + 20 * SCALE
            while not any("building" in s for s in notify.statuses()):
                check(time.monotonic() < deadline, "no building STATUS=: %r\n%s" % (notify.statuses(), agent.output()))
                check(agent.proc.poll() is None, "agent died:\n" + agent.output())
                time.sleep(0.05)
            start = time.monotonic()
            stages = get_property(bus, "Stages")
            took = time.monotonic() - start
            check(took < 1.0 * SCALE, "Stages took %.2fs during the build" % took)
            check('"driver" "running"' in stages and "building" in stages and KVER in stages,
                  "Stages during the build: " + stages)
            dkms_state = get_property(bus, "DkmsState")
            check(dkms_state.startswith('s "building') and KVER in dkms_state, "DkmsState: " + dkms_state)
            ready = notify.wait_for("READY=1", 30 * SCALE)
            # The build's progress pushed the unit's start timeout out (EXTEND_TIMEOUT_USEC=) before
            # READY=1: under the installed unit a build longer than 90 s is otherwise killed.
            check(any(msg.startswith("EXTEND_TIMEOUT_USEC=") for msg in notify.messages[:ready]),
                  "no EXTEND_TIMEOUT_USEC= before READY=1 during the build: %r" % notify.messages[:ready])
            modules = get_property(bus, "Modules")
            check(modules.startswith("a(sss) 4 ") and '"nvidia (installed)" "same" "%s (' % VERSION in modules and '"nvidia" "live" "%s"' % VERSION in modules
                  and '"nvidia-uvm" "live" "%s"' % VERSION in modules and '"nvidia-peermem" "skipped"' in modules,
                  "Modules: " + modules)
            dkms_state = get_property(bus, "DkmsState")
            check(dkms_state.startswith('s "built: Built and installed'), "DkmsState after: " + dkms_state)
            out = agent.output()
            msg = stage_message(out, "done")
            check("built with DKMS" in msg and "loaded nvidia, nvidia-uvm" in msg, "message: " + msg)
            check("dkms: Building module:" in out, "dkms output not streamed:\n" + out)
            check("vermagic" in out or "built for kernel 6.1.0-17-amd64" in out or "6.1.0-17-amd64" in out,
                  "why a build was needed is not logged:\n" + out)
            check(c.loads()[-2:] == ["nvidia", "nvidia_uvm"], "loads after the build: %r" % c.loads())
            with open(c.env["GNA_FAKE_DKMS_LOG"]) as f:
                check(f.read().splitlines() == ["autoinstall -k " + KVER], "dkms calls")
            rc = agent.stop()
            check(rc == 0, "agent exited %d on SIGTERM:\n%s" % (rc, agent.output()))
            no_sanitizer_report(agent.output())
        finally:
            if agent.proc.poll() is None:
                agent.proc.kill()
                agent.proc.wait()
            notify.close()
            bus.stop()


def test_slow_insert_while_dbus_answers():
    """nvidia's init takes 3 s (it probes every GPU): the insert runs in a child process, so D-Bus reads
    answer at once meanwhile and the stage says what it is doing."""
    with TempDir() as tmp:
        c = Case(tmp)
        c.env["GNA_KMOD_TRAP_DELAY"] = "nvidia:3000"
        bus = Bus(tmp)
        notify = Notify(tmp)
        agent = Agent(c.node, bus, notify, extra_env=c.env, wrapper=[])
        try:
            deadline = time.monotonic() + 20 * SCALE
            while not any("loading the NVIDIA kernel modules" in s for s in notify.statuses()):
                check(time.monotonic() < deadline, "no loading STATUS=: %r\n%s" % (notify.statuses(), agent.output()))
                check(agent.proc.poll() is None, "agent died:\n" + agent.output())
                time.sleep(0.02)
            worst = 0.0
            for _ in range(10):
                start = time.monotonic()
                stages = get_property(bus, "Stages")
                worst = max(worst, time.monotonic() - start)
                time.sleep(0.1)
            print("# D-Bus Stages reads during a 3 s insert: slowest %.0f ms (busctl included)" % (worst * 1e3))
            check(worst < 1.0 * SCALE, "Stages took %.2fs during the insert" % worst)
            check('"driver" "running"' in stages, "Stages during the insert: " + stages)
            notify.wait_for("READY=1", 30 * SCALE)
            check(c.loads()[2:4] == ["nvidia", "nvidia_uvm"], "loads: %r" % c.loads())
            msg = stage_message(agent.output(), "done")
            check("loaded nvidia, nvidia-uvm" in msg, "message: " + msg)
            rc = agent.stop()
            check(rc == 0, "agent exited %d on SIGTERM:\n%s" % (rc, agent.output()))
            no_sanitizer_report(agent.output())
        finally:
            if agent.proc.poll() is None:
                agent.proc.kill()
                agent.proc.wait()
            notify.close()
            bus.stop()


def test_admin_modprobe_r_respected():
    """An administrator's `modprobe -r nvidia-uvm nvidia` outside the agent: automatic passes (here the
    feature file's expiry refresh; on a host also the module uevents) leave the driver unloaded; the
    stage says why; Reconcile() loads it again."""
    with TempDir() as tmp:
        c = Case(tmp)
        with open(os.path.join(c.node.confd, "70-refresh.yaml"), "w") as f:
            f.write("labels:\n  expiry: 2s\n")
        bus = Bus(tmp)
        notify = Notify(tmp)
        agent = Agent(c.node, bus, notify, extra_env=c.env, wrapper=[])
        try:
            notify.wait_for("READY=1", 30 * SCALE)
            check(c.loads().count("nvidia") == 1, "loads: %r" % c.loads())
            # What rmmod leaves: no /sys/module/<name> for the removed modules.
            for name in ("nvidia_uvm", "nvidia"):
                shutil.rmtree(os.path.join(c.sys, "module", name))
            agent.wait_output("unloaded outside the agent", 20 * SCALE, "no automatic pass noticed it")
            # More automatic passes: still not loaded back.
            n = agent.output().count("Stage driver:")
            deadline = time.monotonic() + 20 * SCALE
            while agent.output().count("Stage driver:") < n + 2:
                check(time.monotonic() < deadline, "no further passes:\n" + agent.output())
                time.sleep(0.1)
            check(c.loads().count("nvidia") == 1, "the agent loaded nvidia back: %r" % c.loads())
            msg = stage_message(agent.output(), "skipped")
            check("unloaded outside the agent" in msg and "gpunodectl reconcile" in msg, "message: " + msg)
            # The administrator asks for it back.
            subprocess.run(["busctl", "--address=" + bus.address, "call", "org.gpunodeagent.Agent1",
                            "/org/gpunodeagent/Agent1", "org.gpunodeagent.Agent1.Manager", "Reconcile"], check=True)
            deadline = time.monotonic() + 20 * SCALE
            while c.loads().count("nvidia") < 2:
                check(time.monotonic() < deadline, "Reconcile did not load it:\n" + agent.output())
                time.sleep(0.1)
            rc = agent.stop()
            check(rc == 0, "agent exited %d:\n%s" % (rc, agent.output()))
            no_sanitizer_report(agent.output())
        finally:
            if agent.proc.poll() is None:
                agent.proc.kill()
                agent.proc.wait()
            notify.close()
            bus.stop()


def test_slow_peermem_insert_while_dbus_answers():
    """nvidia-peermem's init takes 3 s: the optional insert runs in a child process like the driver's, so
    D-Bus reads answer at once meanwhile, the stage says what it is doing, and it ends with peermem
    loaded."""
    with TempDir() as tmp:
        c = Case(tmp)
        c.module_live("ib_core")
        c.env["GNA_KMOD_TRAP_DELAY"] = "nvidia_peermem:3000"
        bus = Bus(tmp)
        notify = Notify(tmp)
        agent = Agent(c.node, bus, notify, extra_env=c.env, wrapper=[])
        try:
            deadline = time.monotonic() + 30 * SCALE
            while not any("inserting nvidia-peermem" in s for s in notify.statuses()):
                check(time.monotonic() < deadline, "no peermem STATUS=: %r\n%s" % (notify.statuses(), agent.output()))
                check(agent.proc.poll() is None, "agent died:\n" + agent.output())
                time.sleep(0.02)
            worst = 0.0
            for _ in range(10):
                start = time.monotonic()
                stages = get_property(bus, "Stages")
                worst = max(worst, time.monotonic() - start)
                time.sleep(0.1)
            print("# D-Bus Stages reads during a 3 s nvidia-peermem insert: slowest %.0f ms (busctl included)"
                  % (worst * 1e3))
            check(worst < 1.0 * SCALE, "Stages took %.2fs during the peermem insert" % worst)
            check('"driver" "running"' in stages, "Stages during the peermem insert: " + stages)
            notify.wait_for("READY=1", 30 * SCALE)
            check(c.loads()[-1:] == ["nvidia_peermem"], "loads: %r" % c.loads())
            msg = stage_message(agent.output(), "done")
            check("nvidia-peermem loaded" in msg, "message: " + msg)
            rc = agent.stop()
            check(rc == 0, "agent exited %d on SIGTERM:\n%s" % (rc, agent.output()))
            no_sanitizer_report(agent.output())
        finally:
            if agent.proc.poll() is None:
                agent.proc.kill()
                agent.proc.wait()
            notify.close()
            bus.stop()


def installed_nvml(tmp):
    """The user-space driver of the installed version in <tmp>/lib (libnvidia-ml.so.1 →
    libnvidia-ml.so.VERSION, the fake NVML); returns the libnvidia-ml.so.1 path."""
    libdir = os.path.join(tmp, "lib")
    os.makedirs(libdir)
    shutil.copy(os.path.realpath(FAKE_NVML), os.path.join(libdir, "libnvidia-ml.so." + VERSION))
    os.symlink("libnvidia-ml.so." + VERSION, os.path.join(libdir, "libnvidia-ml.so.1"))
    return os.path.join(libdir, "libnvidia-ml.so.1")


def test_version_truth():
    """The loaded driver (550.127.05, as left by the boot before an upgrade) is not the one installed for the running
    kernel (550.54.15 in the tree) nor the user-space library: said with the fix instead of "already
    loaded"; driver.reload-on-mismatch: when-idle reloads it once nothing holds the GPU, and waits,
    naming the holder, while a process has /dev/nvidia0 open."""
    def case(tmp, yaml=""):
        c = Case(tmp, driver_yaml=yaml)
        c.module_live("nvidia", "550.127.05")
        c.module_live("nvidia_uvm", "550.127.05")
        os.symlink("../../nvidia_uvm", os.path.join(c.sys, "module/nvidia/holders/nvidia_uvm"))
        with open(os.path.join(c.sys, "module/nvidia/refcnt"), "w") as f:
            f.write("1\n")
        with open(os.path.join(c.node.confd, "70-nvml.yaml"), "w") as f:
            f.write("nvml:\n  library: %s\n" % installed_nvml(tmp))
        return c

    with TempDir() as tmp:
        c = case(tmp)
        _, out = c.oneshot()
        msg = expect_stage(c, out, "failed")
        check("nvidia 550.127.05 is loaded but %s is installed" % VERSION in msg
              and "as is the user-space library" in msg and "libnvidia-ml.so." + VERSION in msg
              and "Driver/library version mismatch" in msg
              and "reboot or run `gpunodectl driver reload` to load %s" % VERSION in msg, "message: " + msg)
        check("already loaded" not in msg, "said already loaded: " + msg)
        check(c.trap_log() == [], "never must not touch the kernel: %r" % c.trap_log())

    with TempDir() as tmp:
        c = case(tmp, "  reload-on-mismatch: when-idle\n")
        # A process with /dev/nvidia0 open: the reload waits and says who.
        dev = os.path.join(c.node_dir, "dev")
        os.makedirs(dev, exist_ok=True)
        with open(os.path.join(c.node.confd, "71-dev.yaml"), "w") as f:
            f.write("paths:\n  dev: %s\n" % dev)
        node0 = os.path.join(dev, "nvidia0")
        open(node0, "w").close()
        holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nf = open(sys.argv[1])\n"
                                   "print('open', flush=True)\ntime.sleep(60)\n", node0],
                                  stdout=subprocess.PIPE, text=True)
        try:
            check(holder.stdout.readline().strip() == "open", "holder did not start")
            os.symlink("/proc/%d" % holder.pid, os.path.join(c.node_dir, "proc", str(holder.pid)))
            _, out = c.oneshot()
            msg = expect_stage(c, out, "failed")
            check("when-idle waits until no process uses a GPU" in msg and "process %d" % holder.pid in msg,
                  "message: " + msg)
            check(c.trap_log() == [], "reloaded under a holder: %r" % c.trap_log())
        finally:
            holder.kill()
            holder.wait()
        os.unlink(os.path.join(c.node_dir, "proc", str(holder.pid)))
        # Idle now: the old driver goes, the installed one comes.
        _, out = c.oneshot()
        msg = expect_stage(c, out, "done")
        log = c.trap_log()
        check("unload nvidia_uvm" in log and "unload nvidia" in log, "old driver not unloaded: %r" % log)
        check(c.loads()[-2:] == ["nvidia", "nvidia_uvm"], "installed driver not loaded: %r" % log)
        check("reloading now" in out and "(driver %s)" % VERSION in msg, "message: " + msg)


def own_children(pid):
    """The pids whose parent is pid (a walk of the real /proc)."""
    kids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                stat = f.read()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
            kids.append(int(d))
    return kids


def holds_node(pid, dev):
    try:
        fds = os.listdir("/proc/%d/fd" % pid)
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink("/proc/%d/fd/%s" % (pid, fd)).startswith(dev + "/nvidia"):
                return True
        except OSError:
            pass
    return False


def test_reload_when_idle_ignores_own_nvml():
    reload_when_idle(wedged=False)


def test_reload_waits_for_a_wedged_worker_off_the_loop():
    """The same reload with the health event worker wedged in a driver call (nvmlEventSetWait_v2 hangs
    and holds SIGTERM back, as a process inside the driver does): the agent kills it after 1 s and goes
    on, and meanwhile answers D-Bus at once — the wait for its own processes is a timer on the loop, not
    a sleep in it (that sleep took D-Bus reads to over 1 s)."""
    reload_when_idle(wedged=True)


def when_idle_case(tmp):
    """driver.reload-on-mismatch: when-idle on a node with GPUs and NVML, running the tree's kernel with the
    tree's driver loaded (the loaded version then comes from <sys>/module/nvidia/version). FAKE_NVML_DEV
    makes the fake library hold <dev>/nvidiactl and <dev>/nvidia<minor> open as the real one does, and the
    kmod trap refuses to remove nvidia while any process has such a node open, as the kernel does.
    Returns the Case."""
    c = Case(tmp, node="dgx-h100", driver_yaml="  reload-on-mismatch: when-idle\n")
    with open(os.path.join(c.node_dir, "proc/sys/kernel/osrelease"), "w") as f:
        f.write(KVER + "\n")
    os.unlink(os.path.join(c.node_dir, "proc/driver/nvidia/version"))
    c.module_live("nvidia", VERSION)
    c.module_live("nvidia_uvm", VERSION)
    with open(os.path.join(c.sys, "module/nvidia/refcnt"), "w") as f:
        f.write("1\n")
    for n in ["nvidiactl"] + ["nvidia%d" % i for i in range(8)]:
        open(os.path.join(c.node.dev, n), "w").close()
    with open(os.path.join(c.node.confd, "70-nvml.yaml"), "w") as f:
        f.write("nvml:\n  library: %s\ndevices:\n  enabled: false\n" % installed_nvml(tmp))
    c.env["FAKE_NVML_DEV"] = c.node.dev
    c.env["GNA_KMOD_TRAP_DEV"] = c.node.dev
    return c


def mismatch_pass(c, agent, bus, done_before):
    """The loaded nvidia becomes 550.127.05 (installed: VERSION); Reconcile() runs a pass; returns the
    agent's output once the driver stage finished it (its done_before+1-th verdict)."""
    from harness import CTL, run
    for m in ("nvidia", "nvidia_uvm"):
        # Atomically, as sysfs shows it: a pass running meanwhile (the event worker's crash marks the
        # GPUs degraded) read the half-written file as "unknown" and took that for the loaded version.
        path = os.path.join(c.sys, "module", m, "version")
        with open(path + ".new", "w") as f:
            f.write("550.127.05\n")
        os.rename(path + ".new", path)
    run([CTL, "reconcile"], bus=bus, check_rc=0)
    deadline = time.monotonic() + 30 * SCALE
    while True:
        out = agent.output()
        if out.count("Stage driver: running → ") > done_before:
            return out
        check(time.monotonic() < deadline, "no driver verdict after Reconcile():\n" + out)
        check(agent.proc.poll() is None, "agent died:\n" + out)
        time.sleep(0.1)


def nvml_workers_up(agent, dev, n=2):
    """Waits for n of the agent's children holding the GPU (the nvml worker, the health event worker)."""
    deadline = time.monotonic() + 30 * SCALE
    while True:
        kids = [k for k in own_children(agent.proc.pid) if holds_node(k, dev)]
        if len(kids) >= n:
            return kids
        check(time.monotonic() < deadline, "the agent's NVML processes never held %s/nvidia*: %r\n%s"
              % (dev, kids, agent.output()))
        check(agent.proc.poll() is None, "agent died:\n" + agent.output())
        time.sleep(0.1)


class MigExportDuringRelease:
    """Runs `gpunodectl mig export` from a thread as soon as the agent says it stops its NVML processes for
    a driver removal; stop() returns its CompletedProcess (None if the moment never came)."""

    def __init__(self, agent, bus):
        import threading
        self.agent, self.bus, self.done, self.result = agent, bus, False, None
        self.seen = agent.output().count("The driver is about to be removed")
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        from harness import CTL, run
        while not self.done:
            if self.agent.output().count("The driver is about to be removed") > self.seen:
                self.result = run([CTL, "mig", "export"], bus=self.bus)
                return
            time.sleep(0.01)

    def stop(self):
        self.done = True
        self.thread.join()
        return self.result


def reload_when_idle(wedged):
    """driver.reload-on-mismatch: when-idle while the agent's own NVML processes hold the GPU, as they do
    on a running node (the nvml stage's worker and the health event worker; when_idle_case()). The loaded
    version is then rewritten (as after an upgrade installed another one) and a pass runs: the reload
    goes ahead, the workers let go of the GPU before nvidia is removed, and they come back. With a
    foreign process holding /dev/nvidia0 the reload waits and names it (pid and comm), and only it."""
    with TempDir() as tmp:
        c = when_idle_case(tmp)
        dev = c.node.dev
        if wedged:
            c.env["FAKE_NVML_HANG"] = "nvmlEventSetWait_v2:1+"
            c.env["FAKE_NVML_HANG_UNINTERRUPTIBLE"] = "1"
        fake_proc = os.path.join(c.node_dir, "proc")

        def link_proc(pid):
            os.symlink("/proc/%d" % pid, os.path.join(fake_proc, str(pid)))

        bus = Bus(tmp)
        agent = Agent(c.node, bus, extra_env=c.env, wrapper=[])
        holder = None
        try:
            # 1. A foreign process holds /dev/nvidia0 besides our workers: the reload waits, naming
            #    only that process.
            kids = nvml_workers_up(agent, dev)
            for k in kids:
                link_proc(k)
            holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nf = open(sys.argv[1])\n"
                                       "print('open', flush=True)\ntime.sleep(120)\n", os.path.join(dev, "nvidia0")],
                                      stdout=subprocess.PIPE, text=True)
            check(holder.stdout.readline().strip() == "open", "holder did not start")
            link_proc(holder.pid)
            n = agent.output().count("Stage driver: running → ")
            out = mismatch_pass(c, agent, bus, n)
            msg = stage_message(out, "failed")
            comm = open("/proc/%d/comm" % holder.pid).read().strip()
            check("when-idle waits until no process uses a GPU" in msg
                  and "process %d (%s, %s/nvidia0)" % (holder.pid, comm, dev) in msg, "message: " + msg)
            for k in kids:
                check("%d (" % k not in msg, "our own NVML process %d named as a holder: %s" % (k, msg))
            check(not any(line.startswith("unload") for line in c.trap_log()), "reloaded under a holder: %r"
                  % c.trap_log())
            holder.kill()
            holder.wait()
            os.unlink(os.path.join(fake_proc, str(holder.pid)))
            holder = None

            # 2. Only our workers hold it: the reload goes ahead; they let go first, and come back.
            kids = nvml_workers_up(agent, dev)
            for k in kids:
                if not os.path.exists(os.path.join(fake_proc, str(k))):
                    link_proc(k)
            n = agent.output().count("Stage driver: running → ")
            probe = LatencyProbe(bus) if wedged else None
            export = MigExportDuringRelease(agent, bus) if wedged else None
            try:
                out = mismatch_pass(c, agent, bus, n)
            finally:
                worst = probe.stop() if probe else 0
                exported = export.stop() if export else None
            if wedged:
                # A MIG read asked for while our processes let go (the wedged one takes 1 s) is refused: a
                # reader forked then would hold the GPU through the removal.
                check(exported is not None and exported.returncode != 0 and "being removed" in exported.stderr,
                      "mig export during the release: %r\n%s" % (exported and (exported.returncode, exported.stdout,
                                                                            exported.stderr), out))
            if wedged:
                # The worker held SIGTERM back: it let go only when SIGKILL came, 1 s later.
                took = [int(x) for x in re.findall(r"Our NVML processes let go of the GPU after (\d+) ms", out)]
                check("hangs (SIGTERM held back)" in out and took and took[-1] >= 900,
                      "the wedged health worker was not the case tested (let go after %r ms):\n%s" % (took, out))
                limit = min(0.25 * SCALE, 0.8)
                check(worst < limit, "a D-Bus read took %.2f s while the reload waited for the wedged worker "
                      "(limit %.2f s)" % (worst, limit))
            msg = stage_message(out, "done")
            log = c.trap_log()
            check("unload nvidia" in log and c.loads()[-2:] == ["nvidia", "nvidia_uvm"],
                  "not reloaded: %r\n%s" % (log, out))
            check(not any(line.startswith("unload-failed") for line in log),
                  "an unload was refused (a process of ours still had the GPU open): %r\n%s" % (log, out))
            check("No process uses a GPU: reloading now" in out, "output:\n" + out)
            again = nvml_workers_up(agent, dev)
            check(not set(again) & set(kids), "the old NVML processes %r are still there" % kids)
            rc = agent.stop()
            check(rc == 0, "agent exited %d:\n%s" % (rc, agent.output()))
            no_sanitizer_report(agent.output())
        finally:
            if holder:
                holder.kill()
                holder.wait()
            if agent.proc.poll() is None:
                agent.proc.kill()
                agent.proc.wait()
            bus.stop()


def test_reload_while_health_worker_restarts():
    """A when-idle reload that comes while the health event worker is down between crashes (its restart
    timer armed): the release cancels that restart too, so no new worker opens the GPU while the old
    driver is removed, and the worker comes back once the new one is loaded. The event worker crashes
    in nvmlEventSetWait_v2 (while the crash file exists); nvidia_uvm's removal takes 1.5 s, so that a
    restart 1 s after the crash lands between the release and nvidia's removal, where it held the GPU and
    made the removal fail."""
    with TempDir() as tmp:
        c = when_idle_case(tmp)
        dev = c.node.dev
        crash = os.path.join(tmp, "crash")
        open(crash, "w").close()
        c.env["FAKE_NVML_CRASH"] = "nvmlEventSetWait_v2:1+"
        c.env["FAKE_NVML_CRASH_FILE"] = crash
        c.env["GNA_KMOD_TRAP_DELAY"] = "nvidia_uvm:1500@unload"
        bus = Bus(tmp)
        agent = Agent(c.node, bus, extra_env=c.env, wrapper=[])
        try:
            agent.wait_output("restarting it in 1.0s (attempt 1)", 30 * SCALE, "the event worker did not crash", poll=0.02)
            os.unlink(crash)  # the worker started next holds the GPU
            # A check in flight when the worker crashed marks the GPUs degraded, which runs a pass of its
            # own: let it end first, or its driver verdict ("unchanged") is taken for the reload's (the
            # soak saw that in 27 of 500 runs).
            time.sleep(0.2)
            deadline = time.monotonic() + 30 * SCALE
            while True:
                out = agent.output()
                if out.count("Stage probe: running → ") == out.count("Stage consumers: running → "):
                    break
                check(time.monotonic() < deadline, "the pass after the crash did not end:\n" + out)
                time.sleep(0.02)
            n = out.count("Stage driver: running → ")
            out = mismatch_pass(c, agent, bus, n)
            log = c.trap_log()
            check(not any(line.startswith("unload-failed") for line in log),
                  "nvidia's removal was refused: an event worker started during the reload held the GPU: %r\n%s"
                  % (log, out))
            stage_message(out, "done")
            check("unload nvidia" in log and c.loads()[-2:] == ["nvidia", "nvidia_uvm"],
                  "not reloaded: %r\n%s" % (log, out))
            nvml_workers_up(agent, dev)
            rc = agent.stop()
            check(rc == 0, "agent exited %d:\n%s" % (rc, agent.output()))
            no_sanitizer_report(agent.output())
        finally:
            if agent.proc.poll() is None:
                agent.proc.kill()
                agent.proc.wait()
            bus.stop()


def test_event_worker_crash_while_the_agent_writes():
    """The agent writes "check" to a health event worker that has just crashed: the write fails with EPIPE,
    the worker is restarted, and the agent lives (it ignores SIGPIPE, whose default action is a silent
    exit). strace delays each of the agent's writes by 50 ms (times the load), so the worker's crash (in
    nvmlEventSetWait_v2, right after it said "armed") always comes before the agent's "check": the race
    that killed the agent, with no output, in test_reload_while_health_worker_restarts under load (3 of 3
    runs like this before the fix)."""
    from harness import Skip
    strace = shutil.which("strace")
    if not strace:
        raise Skip("strace is not installed (Debian package strace)")
    with TempDir() as tmp:
        c = when_idle_case(tmp)
        crash = os.path.join(tmp, "crash")
        open(crash, "w").close()
        c.env["FAKE_NVML_CRASH"] = "nvmlEventSetWait_v2:1+"
        c.env["FAKE_NVML_CRASH_FILE"] = crash
        if asan_instrumented():
            # LeakSanitizer cannot run under ptrace (it aborts the process at exit).
            c.env["ASAN_OPTIONS"] = c.env.get("ASAN_OPTIONS", "") + ":detect_leaks=0"
        bus = Bus(tmp)
        agent = Agent(c.node, bus, extra_env=c.env,
                      wrapper=[strace, "-o", "/dev/null", "-e", "trace=write", "-e",
                               "inject=write:delay_enter=%d" % int(50000 * max(1.0, os.getloadavg()[0] / os.cpu_count()))])
        try:
            agent.wait_output("GPU event worker does not take requests; restarting it in",
                              60 * SCALE, "the agent's write to the crashed worker did not fail", poll=0.05)
            os.unlink(crash)
            deadline = time.monotonic() + 30 * SCALE
            while not [k for p in own_children(agent.proc.pid) for k in own_children(p) if holds_node(k, c.node.dev)]:
                check(time.monotonic() < deadline, "no event worker after the restart:\n" + agent.output())
                check(agent.proc.poll() is None, "agent died:\n" + agent.output())
                time.sleep(0.1)
            check(agent.proc.poll() is None, "agent died:\n" + agent.output())
            # strace does not pass SIGTERM on: the agent itself is told, and strace exits with its status.
            os.kill(own_children(agent.proc.pid)[0], signal.SIGTERM)
            rc = agent.proc.wait(60 * SCALE)
            check(rc == 0, "agent exited %d:\n%s" % (rc, agent.output()))
        finally:
            if agent.proc.poll() is None:
                agent.proc.kill()
                agent.proc.wait()
            bus.stop()


def test_reload_failure_is_no_admin_unload():
    """A when-idle reload whose new driver then fails to load is retried, not mistaken for an
    administrator's modprobe -r (the agent removed the old driver itself)."""
    with TempDir() as tmp:
        c = Case(tmp, driver_yaml="  reload-on-mismatch: when-idle\n")
        c.module_live("nvidia", "550.127.05")
        with open(os.path.join(c.node.confd, "70-retry.yaml"), "w") as f:
            f.write("engine:\n  retry-min: 100ms\n  retry-max: 200ms\n")
        c.env["GNA_KMOD_TRAP_FAIL"] = "nvidia:EINVAL"
        bus = Bus(tmp)
        agent = Agent(c.node, bus, extra_env=c.env, wrapper=[])
        try:
            deadline = time.monotonic() + 30 * SCALE
            while c.trap_log().count("load-failed nvidia EINVAL") < 3:
                check(time.monotonic() < deadline, "no retried loads: %r\n%s" % (c.trap_log(), agent.output()))
                check(agent.proc.poll() is None, "agent died:\n" + agent.output())
                time.sleep(0.1)
            check("unloaded outside the agent" not in agent.output(), "own reload taken for modprobe -r:\n"
                  + agent.output())
            rc = agent.stop()
            check(rc == 0, "agent exited %d:\n%s" % (rc, agent.output()))
        finally:
            if agent.proc.poll() is None:
                agent.proc.kill()
                agent.proc.wait()
            bus.stop()


def test_driver_reload_command():
    """`gpunodectl driver reload` after an upgrade left the old driver loaded: Unload() then Reconcile(),
    and the installed version is loaded."""
    from harness import CTL, run
    with TempDir() as tmp:
        c = Case(tmp)
        c.module_live("nvidia", "550.127.05")
        c.module_live("nvidia_uvm", "550.127.05")
        os.symlink("../../nvidia_uvm", os.path.join(c.sys, "module/nvidia/holders/nvidia_uvm"))
        with open(os.path.join(c.sys, "module/nvidia/refcnt"), "w") as f:
            f.write("1\n")
        bus = Bus(tmp)
        agent = Agent(c.node, bus, extra_env=c.env, wrapper=[])
        try:
            agent.wait_output("Stage driver: running → failed", 20 * SCALE, "no verdict")
            st = run([CTL, "driver", "status"], bus=bus, check_rc=0).stdout
            check("nvidia (installed)" in st and "differs" in st and VERSION in st, "driver status:\n" + st)
            p = run([CTL, "driver", "reload"], bus=bus, check_rc=0)
            check("Unloaded the NVIDIA driver" in p.stdout, "reload output: " + p.stdout)
            deadline = time.monotonic() + 20 * SCALE
            while c.loads()[-2:] != ["nvidia", "nvidia_uvm"]:
                check(time.monotonic() < deadline, "not loaded after reload: %r\n%s" % (c.trap_log(), agent.output()))
                time.sleep(0.1)
            check(c.trap_log()[:2] == ["unload nvidia_uvm", "unload nvidia"], "trap log: %r" % c.trap_log())
            rc = agent.stop()
            check(rc == 0, "agent exited %d:\n%s" % (rc, agent.output()))
            no_sanitizer_report(agent.output())
        finally:
            if agent.proc.poll() is None:
                agent.proc.kill()
                agent.proc.wait()
            bus.stop()


def test_kernel_module_type():
    """driver.kernel-module-type: auto picks the open modules for Blackwell (B200) and says why, fails
    clearly when only the proprietary ones are installed there, keeps the proprietary ones for a 550
    driver on Hopper, and an explicit choice wins."""
    with TempDir() as tmp:
        c = Case(tmp, node="b200-noload", tree="debian-both")
        _, out = c.oneshot(args=["--log-level=debug"])
        msg = expect_stage(c, out, "done")
        check("open kernel modules (driver.kernel-module-type: auto): GPU 0000:1b:00.0" in msg
              and "Blackwell or newer" in msg, "choice and reason not reported: " + msg)
        check("/updates/dkms/nvidia-current-open.ko with options" in out
              and "/updates/dkms/nvidia-current.ko with options" not in out,
              "the open module was not the one loaded:\n" + out)
    with TempDir() as tmp:
        c = Case(tmp, node="b200-noload", tree="debian")
        _, out = c.oneshot()
        msg = expect_stage(c, out, "failed")
        check("No open nvidia module for kernel %s: only the proprietary one is installed" % KVER in msg
              and "nvidia-open-kernel-dkms" in msg and "Blackwell or newer" in msg, "message: " + msg)
        check(c.loads() == [], "loaded something: %r" % c.loads())
        check(not os.path.exists(c.env["GNA_FAKE_DKMS_LOG"]), "ran dkms for a flavour it cannot build")
    with TempDir() as tmp:
        c = Case(tmp, tree="debian-both")
        _, out = c.oneshot(args=["--log-level=debug"])
        msg = expect_stage(c, out, "done")
        check("proprietary kernel modules (driver.kernel-module-type: auto): both flavours are installed and "
              "the %s branch predates 560" % VERSION in msg, "message: " + msg)
        check("/updates/dkms/nvidia-current.ko with options" in out, "the proprietary module was not loaded:\n" + out)
    with TempDir() as tmp:
        c = Case(tmp, tree="debian-both", driver_yaml="  kernel-module-type: open\n")
        _, out = c.oneshot()
        msg = expect_stage(c, out, "done")
        check("open kernel modules: driver.kernel-module-type: open" in msg, "message: " + msg)


def process_gone(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_sigterm_during_build():
    with TempDir() as tmp:
        c = Case(tmp)
        c.remove_driver_modules()
        c.headers()
        c.dkms_add()
        pidfile = os.path.join(tmp, "dkms.pids")
        c.env.update({"GNA_FAKE_DKMS_DURATION": "60", "GNA_FAKE_DKMS_PIDFILE": pidfile})
        bus = Bus(tmp)
        agent = Agent(c.node, bus, extra_env=c.env, wrapper=[])
        try:
            deadline = time.monotonic() + 20 * SCALE
            while not os.path.exists(pidfile) or not open(pidfile).read().strip():
                check(time.monotonic() < deadline, "the build never started:\n" + agent.output())
                time.sleep(0.05)
            pids = [int(p) for p in open(pidfile).read().split()]
            start = time.monotonic()
            rc = agent.stop(timeout=int(20 * SCALE))
            check(rc == 0, "agent exited %d on SIGTERM during a build:\n%s" % (rc, agent.output()))
            check(time.monotonic() - start < 5 * SCALE, "shutdown waited for the build")
            no_sanitizer_report(agent.output())
            wait = time.monotonic() + 5 * SCALE
            while not all(process_gone(p) for p in pids) and time.monotonic() < wait:
                time.sleep(0.05)
            check(all(process_gone(p) for p in pids), "dkms processes %r survived the agent" % pids)
        finally:
            if agent.proc.poll() is None:
                agent.proc.kill()
                agent.proc.wait()
            bus.stop()


def test_dkms_build_failed():
    with TempDir() as tmp:
        c = Case(tmp)
        c.remove_driver_modules()
        c.headers()
        c.dkms_add()
        _, out = c.oneshot({"GNA_FAKE_DKMS_RESULT": "10"})
        msg = expect_stage(c, out, "failed")
        log = os.path.join(c.dkms_state, "nvidia", VERSION, "build/make.log")
        check(log in msg, "make.log path not in the message: " + msg)
        check("nvidia" not in c.loads(), "loaded after a failed build")


def dkms_calls(c):
    try:
        with open(c.env["GNA_FAKE_DKMS_LOG"]) as f:
            return [line for line in f.read().splitlines() if not line.startswith("status")]
    except FileNotFoundError:
        return []


def test_dkms_failure_not_rerun_unchanged():
    """A failed build is not repeated by the retry loop while nothing it depends on has changed; a new
    DKMS source (or headers) makes the next retry run it again."""
    with TempDir() as tmp:
        c = Case(tmp)
        c.remove_driver_modules()
        c.headers()
        c.dkms_add()
        c.env["GNA_FAKE_DKMS_RESULT"] = "10"
        with open(os.path.join(c.node.confd, "70-retry.yaml"), "w") as f:
            f.write("engine:\n  retry-min: 100ms\n  retry-max: 200ms\n")
        bus = Bus(tmp)
        agent = Agent(c.node, bus, extra_env=c.env, wrapper=[])
        try:
            deadline = time.monotonic() + 30 * SCALE
            while agent.output().count("dkms not run again") < 3:
                check(time.monotonic() < deadline, "no retries seen:\n" + agent.output())
                check(agent.proc.poll() is None, "agent died:\n" + agent.output())
                time.sleep(0.1)
            check(dkms_calls(c) == ["autoinstall -k " + KVER], "dkms re-run unchanged: %r" % dkms_calls(c))
            check("make.log" in stage_message(agent.output(), "failed"), "retry lost the diagnosis")
            # Something changed (a fixed source package registered): the next retry builds again.
            c.dkms_add("nvidia-fixed", VERSION)
            deadline = time.monotonic() + 30 * SCALE
            while len(dkms_calls(c)) < 2:
                check(time.monotonic() < deadline, "dkms not run after a change: %r\n%s" % (dkms_calls(c), agent.output()))
                time.sleep(0.1)
            rc = agent.stop()
            check(rc == 0, "agent exited %d:\n%s" % (rc, agent.output()))
            no_sanitizer_report(agent.output())
        finally:
            if agent.proc.poll() is None:
                agent.proc.kill()
                agent.proc.wait()
            bus.stop()


def test_dkms_headers_missing():
    with TempDir() as tmp:
        c = Case(tmp)
        c.remove_driver_modules()
        c.dkms_add()
        _, out = c.oneshot()
        msg = expect_stage(c, out, "failed")
        check("apt-get install linux-headers-" + KVER in msg, "headers package not named: " + msg)
        check(not os.path.exists(c.env["GNA_FAKE_DKMS_LOG"]), "dkms was run without headers")


def test_dkms_disabled():
    with TempDir() as tmp:
        c = Case(tmp, driver_yaml="  dkms:\n    enabled: false\n")
        c.remove_driver_modules()
        _, out = c.oneshot()
        msg = expect_stage(c, out, "failed")
        check("driver.dkms.enabled: false" in msg and KVER in msg, "message: " + msg)


def test_dkms_hang_timeout():
    with TempDir() as tmp:
        c = Case(tmp, driver_yaml="  dkms:\n    timeout: 1s\n")
        c.remove_driver_modules()
        c.headers()
        c.dkms_add()
        pidfile = os.path.join(tmp, "dkms.pids")
        start = time.monotonic()
        _, out = c.oneshot({"GNA_FAKE_DKMS_HANG": "1", "GNA_FAKE_DKMS_PIDFILE": pidfile}, timeout=60)
        took = time.monotonic() - start
        msg = expect_stage(c, out, "failed")
        check("timed out after 1s" in msg and "process group was killed" in msg, "message: " + msg)
        check(took < 30 * SCALE, "the hung build took %.1fs to be given up" % took)
        with open(pidfile) as f:
            pids = [int(p) for p in f.read().split()]
        check(all(process_gone(p) for p in pids), "dkms processes %r survived the timeout" % pids)


def test_prepare_kernel():
    with TempDir() as tmp:
        c = Case(tmp)
        c.remove_driver_modules()
        c.headers()
        c.dkms_add()
        env = c.full_env()
        env.pop("LD_PRELOAD")
        p = subprocess.run([AGENT, "--prepare-kernel", KVER] + c.node.args(), env=env, capture_output=True,
                           text=True, timeout=60 * SCALE)
        check(p.returncode == 0, "--prepare-kernel exited %d:\n%s" % (p.returncode, p.stderr))
        check(os.path.exists(os.path.join(c.module_dir(), "updates/dkms/nvidia.ko")), "nothing was built")
        check("ready for kernel " + KVER in p.stderr, "no success line:\n" + p.stderr)
        check(c.trap_log() == [], "--prepare-kernel loaded something")

        # dkms exits 0 without building anything (no DKMS package registered): not "ready".
        os.unlink(os.path.join(c.module_dir(), "updates/dkms/nvidia.ko"))
        subprocess.run([DEPMOD, "-C", os.path.join(c.root, "etc/depmod.d"), "-b", c.root, KVER], check=True)
        shutil.rmtree(c.dkms_state)
        p = subprocess.run([AGENT, "--prepare-kernel", KVER] + c.node.args(), env=env, capture_output=True,
                           text=True, timeout=60 * SCALE)
        check(p.returncode == 1, "--prepare-kernel with nothing built exited %d:\n%s" % (p.returncode, p.stderr))
        check("ready for kernel" not in p.stderr, "claimed success:\n" + p.stderr)
        check("dkms reported success, but the NVIDIA module for kernel " + KVER + " is not there" in p.stderr
              and "No DKMS module is registered" in p.stderr, "not explained:\n" + p.stderr)

        other = "6.1.0-99-amd64"
        os.makedirs(os.path.join(c.root, "lib/modules", other))
        p = subprocess.run([AGENT, "--prepare-kernel", other] + c.node.args(), env=env, capture_output=True,
                           text=True, timeout=60 * SCALE)
        check(p.returncode == 1, "--prepare-kernel without headers exited %d" % p.returncode)
        check("apt-get install linux-headers-" + other in p.stderr, "headers package not named:\n" + p.stderr)

        p = subprocess.run([AGENT, "--prepare-kernel", "../etc"] + c.node.args(), env=env, capture_output=True,
                           text=True, timeout=60 * SCALE)
        check(p.returncode == 1 and "kernel release" in p.stderr, "bad release accepted:\n" + p.stderr)


TESTS = [
    test_fast_path_already_live,
    test_cold_load_order_and_options,
    test_debian_naming,
    test_missing_firmware,
    test_ekeyrejected,
    test_partial_load_rolled_back,
    test_peermem,
    test_disabled_and_no_gpu,
    test_dkms_build_while_dbus_answers,
    test_slow_insert_while_dbus_answers,
    test_admin_modprobe_r_respected,
    test_version_truth,
    test_reload_when_idle_ignores_own_nvml,
    test_reload_waits_for_a_wedged_worker_off_the_loop,
    test_reload_while_health_worker_restarts,
    test_event_worker_crash_while_the_agent_writes,
    test_kernel_module_type,
    test_driver_reload_command,
    test_reload_failure_is_no_admin_unload,
    test_slow_peermem_insert_while_dbus_answers,
    test_sigterm_during_build,
    test_dkms_build_failed,
    test_dkms_failure_not_rerun_unchanged,
    test_dkms_headers_missing,
    test_dkms_disabled,
    test_dkms_hang_timeout,
    test_prepare_kernel,
]


def main():
    if os.geteuid() == 0:
        for what, path in (("kmod trap", TRAP), ("module trees", TREES)):
            if not os.path.exists(path):
                print("1..0 # SKIP %s not built: %s" % (what, path))
                return 0
    return tap_main(TESTS, sys.argv[1:])


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
