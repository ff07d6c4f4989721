#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Hotplug: the real daemon's sd-device monitor fed real uevents. The test runs under umockdev-wrapper
(meson does that): umockdev's preload library redirects /sys to a testbed directory (a copy of a fixture
node's sys tree) for this process and the agent it starts, and turns the uevent netlink socket into one
the testbed sends on, so sd_device_monitor receives what the kernel would send. The agent runs with
paths.sys: /sys (the only setting with which it watches device events) and a retry backoff of an hour,
so that a pass seen after an event was started by the event and nothing else.

Covered: a GPU appearing on the bus, a GPU falling off it, the nvidia module loading (NVML comes up
without a retry) and going away, ib_core coming back (nvidia-peermem reconsidered), and the events the
agent must ignore (another vendor's device, another module)."""
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (Agent, Bus, Fail, Node, Notify, FAKE_NVML, TempDir, busctl, check,  # noqa: E402
                     get_property, tap_main, Skip)

from harness import timeout_scale  # noqa: E402
SCALE = timeout_scale()
AGENT_PATH = "/org/gpunodeagent/Agent1"
MANAGER = "org.gpunodeagent.Agent1.Manager"
GPU = "org.gpunodeagent.Agent1.Gpu"
# The agent coalesces events for 300 ms; this is how long "nothing happened" is watched for.
QUIET = 1.5 * SCALE

try:
    import gi
    gi.require_version("UMockdev", "1.0")
    from gi.repository import UMockdev
except (ImportError, ValueError):
    UMockdev = None


def wait_until(what, fn, timeout):
    deadline = time.monotonic() + timeout * SCALE
    while time.monotonic() < deadline:
        if fn():
            return
        time.sleep(0.05)
    raise Fail("timed out waiting for " + what)


class Hotplug:
    """A testbed holding a copy of the node's sys tree and the agent watching it."""

    def __init__(self, tmp, node, nvml_library=None):
        self.tb = UMockdev.Testbed.new()
        self.root = self.tb.get_root_dir()
        self.node = Node(tmp, node, nvml_library=nvml_library,
                         extra_yaml="engine:\n  retry-min: 1h\n  retry-max: 1h\n")
        self.sys = os.path.join(self.root, "sys")
        shutil.copytree(os.path.join(self.node.node, "sys"), self.sys, symlinks=True, dirs_exist_ok=True)
        with open(os.path.join(self.node.confd, "50-hotplug.yaml"), "w") as f:
            f.write("paths:\n  sys: /sys\n")
        self.bus = Bus(tmp)
        self.notify = Notify(tmp)
        # The preload library came with our environment (umockdev-wrapper); the testbed's directory was
        # set by the library for this process only, so it is passed on explicitly.
        # Under ASan the preloaded library comes before the sanitizer's runtime: allowed, as for the
        # kmod trap (../shared/TESTING.md).
        asan = ":".join(o for o in (os.environ.get("ASAN_OPTIONS"), "verify_asan_link_order=0") if o)
        self.agent = Agent(self.node, self.bus, self.notify, wrapper=[],
                           extra_env={"UMOCKDEV_DIR": self.root, "SYSTEMD_DEVICE_VERIFY_SYSFS": "0",
                                      "ASAN_OPTIONS": asan})
        try:
            self.notify.wait_for("READY=1", 60 * SCALE)
        except Fail:
            self.close()
            raise Fail("no READY=1; agent output:\n" + self.agent.output())

    def prop(self, name, path=AGENT_PATH, interface=MANAGER):
        return get_property(self.bus, name, path, interface)

    def passes(self):
        self.notify.drain(0.05)
        return sum(1 for m in self.notify.messages if m.startswith("STATUS=Running stage probe"))

    def uevent(self, syspath, action):
        self.tb.uevent(syspath, action)

    def wait_pass_after(self, before, why):
        """Waits for a pass that started after `before` passes to have finished."""
        def done():
            self.notify.drain(0.05)
            if self.passes() <= before:
                return False
            tail = self.notify.messages[[i for i, m in enumerate(self.notify.messages)
                                         if m.startswith("STATUS=Running stage probe")][-1]:]
            return any(m.startswith(("STATUS=Ready", "STATUS=Degraded", "STATUS=Failed")) for m in tail)
        try:
            wait_until("a pass after " + why, done, 20)
        except Fail:
            raise Fail("no pass after %s; agent output:\n%s" % (why, self.agent.output()[-4000:]))

    def assert_quiet(self, why):
        before = self.passes()
        time.sleep(QUIET)
        check(self.passes() == before, "a pass ran after %s, which the agent must ignore" % why)

    def prop_json(self, name):
        out = busctl(self.bus, "--json=short", "get-property", "org.gpunodeagent.Agent1", AGENT_PATH, MANAGER,
                     name).stdout
        return json.loads(out)["data"]

    def modules(self):
        return {row[0]: (row[1], row[2]) for row in self.prop_json("Modules")}

    def stages(self):
        return self.prop_json("Stages")

    def close(self):
        if self.agent.proc.poll() is None:
            self.agent.proc.kill()
            self.agent.proc.wait()
        self.notify.close()
        self.bus.stop()
        del self.tb

    def stop_clean(self):
        rc = self.agent.stop()
        check(rc == 0, "agent exited %d on SIGTERM:\n%s" % (rc, self.agent.output()))


def pci_dir(sysd, bdf):
    return os.path.join(sysd, "devices", "pci%s" % bdf[:7], bdf)


def plug_gpu(h, template, bdf):
    """A copy of a GPU's sysfs directory at a new address (its links are relative, so they still lead
    to the same driver and subsystem), listed in bus/pci/devices: what the kernel has made when it
    sends "add"."""
    src, dst = pci_dir(h.sys, template), pci_dir(h.sys, bdf)
    shutil.copytree(src, dst, symlinks=True)
    os.unlink(os.path.join(dst, "iommu_group"))
    with open(os.path.join(dst, "uevent")) as f:
        text = f.read().replace(template, bdf)
    with open(os.path.join(dst, "uevent"), "w") as f:
        f.write(text)
    os.symlink(os.path.relpath(dst, os.path.join(h.sys, "bus/pci/devices")),
               os.path.join(h.sys, "bus/pci/devices", bdf))
    return "/sys/devices/pci%s/%s" % (bdf[:7], bdf)


def test_gpu_appears():
    with TempDir() as tmp:
        h = Hotplug(tmp, "a100-pcie")
        try:
            check(h.prop("GpuCount") == "u 2", "GpuCount at start: %s" % h.prop("GpuCount"))
            syspath = plug_gpu(h, "0000:17:00.0", "0000:31:00.0")
            # No event yet: the agent does not poll, so it has not seen the new directory.
            h.assert_quiet("the new device directory appeared without an event")
            check(h.prop("GpuCount") == "u 2", "GpuCount changed without an event: %s" % h.prop("GpuCount"))
            before = h.passes()
            h.uevent(syspath, "add")
            h.wait_pass_after(before, "the GPU's add event")
            check(h.prop("GpuCount") == "u 3", "GpuCount after the add event: %s" % h.prop("GpuCount"))
            check(h.prop("PciAddress", AGENT_PATH + "/gpu/1", GPU) == 's "0000:31:00.0"',
                  "gpu/1 is %s, wanted the new GPU 0000:31:00.0" % h.prop("PciAddress", AGENT_PATH + "/gpu/1", GPU))
            h.stop_clean()
        finally:
            h.close()


def test_gpu_falls_off_the_bus():
    with TempDir() as tmp:
        h = Hotplug(tmp, "a100-pcie")
        try:
            before = h.passes()
            syspath = "/sys/devices/pci0000:ca/0000:ca:00.0"
            # The kernel has removed the directory when "remove" arrives; umockdev needs it to send the
            # event, so it goes right after (well within the agent's 300 ms settle time).
            h.uevent(syspath, "remove")
            os.unlink(os.path.join(h.sys, "bus/pci/devices/0000:ca:00.0"))
            shutil.rmtree(pci_dir(h.sys, "0000:ca:00.0"))
            h.wait_pass_after(before, "the GPU's remove event")
            check(h.prop("GpuCount") == "u 1", "GpuCount after the remove event: %s" % h.prop("GpuCount"))
            check(h.prop("PciAddress", AGENT_PATH + "/gpu/0", GPU) == 's "0000:17:00.0"',
                  "gpu/0 after 0000:ca:00.0 fell off: %s" % h.prop("PciAddress", AGENT_PATH + "/gpu/0", GPU))
            h.stop_clean()
        finally:
            h.close()


def test_other_devices_ignored():
    with TempDir() as tmp:
        h = Hotplug(tmp, "a100-pcie")
        try:
            h.uevent("/sys/devices/pci0000:00/0000:00:00.0", "change")   # an Intel host bridge
            h.assert_quiet("an Intel device's change event")
            # … while the same event from a GPU (a driver bind, say) does start one.
            before = h.passes()
            h.uevent("/sys/devices/pci0000:17/0000:17:00.0", "change")
            h.wait_pass_after(before, "a GPU's change event")
            h.stop_clean()
        finally:
            h.close()


def test_event_burst_one_pass():
    """A driver rebind or a reset sends a burst (remove, add, bind, change …): the agent settles for
    300 ms after the last event and runs one pass, not one per event."""
    with TempDir() as tmp:
        h = Hotplug(tmp, "a100-pcie")
        try:
            before = h.passes()
            # 12 events 20 ms apart (umockdev's socket holds only a few unread messages at once).
            for i in range(12):
                h.uevent("/sys/devices/pci0000:%s/0000:%s:00.0" % (("17", "17") if i % 2 else ("ca", "ca")),
                         ("remove", "add", "bind", "change")[i % 4])
                time.sleep(0.02)
            h.wait_pass_after(before, "a burst of 12 events")
            time.sleep(QUIET)
            n = h.passes() - before
            check(n == 1, "%d passes for one burst of 12 events, wanted 1" % n)
            check(h.prop("GpuCount") == "u 2", "GpuCount after the burst: %s" % h.prop("GpuCount"))
            h.stop_clean()
        finally:
            h.close()


def test_nvidia_module_add_and_remove():
    """NVML is missing at start (degraded, retry an hour away); the driver's library appearing is not
    enough (nothing watches it), the nvidia module's add event is: NVML comes up without a retry."""
    with TempDir() as tmp:
        lib = os.path.join(tmp, "nvidia/libnvidia-ml.so.1")
        h = Hotplug(tmp, "a100-pcie", nvml_library=lib)
        try:
            check(h.prop("State") == 's "degraded"', "State without NVML: %s" % h.prop("State"))
            os.makedirs(os.path.dirname(lib))
            os.symlink(FAKE_NVML, lib)
            h.assert_quiet("the NVML library appeared without an event")
            check(h.prop("State") == 's "degraded"', "State changed without an event: %s" % h.prop("State"))

            before = h.passes()
            h.uevent("/sys/module/nvidia", "add")
            h.wait_pass_after(before, "the nvidia module's add event")
            check(h.prop("State") == 's "ready"', "State after nvidia's add event: %s\n%s"
                  % (h.prop("State"), h.agent.output()[-3000:]))

            # The module goes away (an administrator's rmmod): the pass it starts finds the driver gone and,
            # as the agent does not fight the administrator (docs/driver.md), holds the driver stage
            # (skipped, saying why) and reports the node degraded: it cannot run GPU work.
            before = h.passes()
            h.uevent("/sys/module/nvidia", "remove")
            shutil.rmtree(os.path.join(h.sys, "module/nvidia"))
            h.wait_pass_after(before, "the nvidia module's remove event")
            stages = {s[0]: s[1] for s in h.stages()}
            check(stages.get("driver") == "skipped" and h.prop("State") == 's "degraded"',
                  "after nvidia's remove event: State %s, stages %r" % (h.prop("State"), stages))
            h.stop_clean()
        finally:
            h.close()


def test_ib_core_comes_back():
    """dgx-h100 has ConnectX NICs but no ib_core: nvidia-peermem waits for it. ib_core loading (its add
    event) makes the agent take the peermem rule up again without a Reconcile: the fixture's module tree
    has no nvidia-peermem, so the row turns from waiting to missing."""
    with TempDir() as tmp:
        h = Hotplug(tmp, "dgx-h100")
        try:
            state, detail = h.modules()["nvidia-peermem"]
            check(state == "skipped" and "waits for ib_core" in detail,
                  "nvidia-peermem at start: %s %s" % (state, detail))
            mdir = os.path.join(h.sys, "module/ib_core")
            os.makedirs(os.path.join(mdir, "holders"))
            for name, value in (("initstate", "live\n"), ("refcnt", "0\n"), ("uevent", "")):
                with open(os.path.join(mdir, name), "w") as f:
                    f.write(value)
            h.assert_quiet("ib_core's sysfs directory appeared without an event")
            check(h.modules()["nvidia-peermem"][0] == "skipped", "peermem row changed without an event")

            # Another module's event (the NIC driver reloaded) is not ours to act on.
            h.uevent("/sys/module/mlx5_core", "add")
            h.assert_quiet("mlx5_core's add event")
            before = h.passes()
            h.uevent("/sys/module/ib_core", "add")
            h.wait_pass_after(before, "ib_core's add event")
            state, detail = h.modules()["nvidia-peermem"]
            check(state == "missing", "nvidia-peermem after ib_core came back: %s %s" % (state, detail))
            h.stop_clean()
        finally:
            h.close()


TESTS = [
    test_gpu_appears,
    test_gpu_falls_off_the_bus,
    test_other_devices_ignored,
    test_event_burst_one_pass,
    test_nvidia_module_add_and_remove,
    test_ib_core_comes_back,
]


def main():
    if UMockdev is None:
        print("1..0 # SKIP umockdev's GObject introspection data is missing (Debian: gir1.2-umockdev-1.0)")
        return 0
    if "umockdev" not in os.environ.get("LD_PRELOAD", ""):
        print("1..0 # SKIP not run under umockdev-wrapper (meson runs it so)")
        return 0
    return tap_main(TESTS, sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
