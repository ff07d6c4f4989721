#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""`gpunodectl doctor` (issue 11) on simulated nodes, each broken in one layer: a copy of the dgx-h100 fixture
is prepared by the real agent (--oneshot: device nodes, CDI spec, feature file), then one layer is broken
and the doctor must name that layer as failed (exit status 2), with the layers below it still ok and a fix
in words. A healthy node gives exit 0 and says the agent is not running; with the agent running on a
private bus the doctor reads its health (an injected XID makes the health layer fail). The broken nodes:
module missing, version mismatch, missing device node, fabric manager dead (tests/fake-systemd), CDI spec
stale, a container runtime without CDI, NFD absent, a GPU missing from the bus, and a GPU whose fabric
registration never completes. TAP output."""
import copy
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import AGENT, BUILD, CTL, FAKE_NVML, NODES, PCI_IDS, Fail, TempDir, busctl, check, tap_main  # noqa: E402

_spec = importlib.util.spec_from_file_location("test_devfab", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                          "test-devfab.py"))
test_devfab = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(test_devfab)
_spec2 = importlib.util.spec_from_file_location("test_nvml", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                         "test-nvml.py"))
test_nvml = importlib.util.module_from_spec(_spec2)
_spec2.loader.exec_module(test_nvml)

KMOD_TREES = os.environ.get("GNA_KMOD_FIXTURES", os.path.join(BUILD, "tests/kmod/trees"))
VERSION = "550.54.15"  # the nvidia module of the kmod fixture trees (tests/kmod), made the loaded one too

ORDER = ["pci", "iommu", "modules", "secure-boot", "device-nodes", "persistenced", "fabricmanager", "fabric", "nvml",
         "mig", "cdi", "runtime", "nfd", "health", "config"]


def note(fmt, *args):
    print("# " + fmt % args, flush=True)


class Sim:
    """A writable copy of a fixture node, prepared by the agent's --oneshot run."""

    def __init__(self, tmp, node="dgx-h100", dropin="", tree="debian"):
        self.tmp = tmp
        self.node = os.path.join(tmp, "node")
        shutil.copytree(os.path.join(NODES, node), self.node, symlinks=True)
        # One driver everywhere: the kernel release and installed module of a kmod fixture tree, that
        # module's version loaded (/proc, /sys) and answered by the fake NVML.
        with open(os.path.join(KMOD_TREES, "KVER")) as f:
            kver = f.read().strip()
        with open(os.path.join(self.node, "proc/sys/kernel/osrelease"), "w") as f:
            f.write(kver + "\n")
        for rel in ("proc/driver/nvidia/version", "sys/module/nvidia/version", "nvml.yaml"):
            path = os.path.join(self.node, rel)
            with open(path) as f:
                text = f.read()
            with open(path, "w") as f:
                f.write(text.replace("550.127.05", VERSION))
        # The node is prepared with the matching tree: since the driver stage checks the installed module
        # against the loaded one, a preparation on another tree fails by design. The tree the test asks
        # for replaces it afterwards (an upgrade installed after the agent prepared the node).
        # The driver's user-space libraries of that version, so that the CDI spec has its mounts and the
        # cdi stage has nothing to warn about (the doctor repeats its warnings).
        libdir = os.path.join(self.node, "usr/lib")
        os.makedirs(libdir, exist_ok=True)
        for lib in ("libcuda.so.", "libnvidia-ml.so."):
            open(os.path.join(libdir, lib + VERSION), "w").close()
        modules = os.path.join(KMOD_TREES, "debian", "lib/modules")
        self.dev = os.path.join(tmp, "dev")
        self.run = os.path.join(tmp, "run")
        self.features = os.path.join(tmp, "features.d")
        self.confd = os.path.join(tmp, "conf.d")
        for p in (self.dev, self.run, self.features, self.confd):
            os.makedirs(p, exist_ok=True)
        self.config = os.path.join(tmp, "agent.yaml")
        with open(self.config, "w") as f:
            f.write("paths:\n  sys: %s/sys\n  proc: %s/proc\n  dev: %s\n  etc: %s/etc\n  run: %s\n  state: %s/state\n"
                    "  modules: %s\n  pci-ids: %s\nnvml:\n  library: %s\n  timeout: 5s\nlabels:\n  directory: %s\n"
                    "cdi:\n  driver-root: %s\n" % (self.node, self.node, self.dev, self.node, self.run, tmp, modules,
                                                   PCI_IDS, FAKE_NVML, self.features, self.node))
        if dropin:
            with open(os.path.join(self.confd, "50-test.yaml"), "w") as f:
                f.write(dropin)
        self.env = dict(os.environ, FAKE_NVML_DESCRIPTION=os.path.join(self.node, "nvml.yaml"),
                        FAKE_NVML_STATE=os.path.join(tmp, "nvml.state"),
                        DBUS_SYSTEM_BUS_ADDRESS="unix:path=" + os.path.join(tmp, "no-bus"))
        p = subprocess.run([AGENT, "--config", self.config, "--config-dir", self.confd, "--oneshot"], env=self.env,
                           capture_output=True, text=True, timeout=60)
        check(p.returncode == 0, "the agent's --oneshot preparation failed:\n" + p.stdout + p.stderr)
        self.cdi = os.path.join(self.run, "cdi/nvidia.yaml")
        if tree != "debian":
            with open(self.config) as f:
                text = f.read()
            with open(self.config, "w") as f:
                f.write(text.replace(modules, os.path.join(KMOD_TREES, tree, "lib/modules")))

    def doctor(self, *args, env=None):
        e = dict(self.env)
        e.update(env or {})
        p = subprocess.run([CTL, "doctor", "--agent-config", self.config, "--agent-config-dir", self.confd] + list(args),
                           env=e, capture_output=True, text=True, timeout=60)
        return p

    def verdicts(self, env=None):
        p = self.doctor("--json", env=env)
        try:
            out = json.loads(p.stdout)
        except ValueError:
            raise Fail("doctor --json printed no JSON (exit %d):\n%s%s" % (p.returncode, p.stdout, p.stderr))
        check(out["exit"] == p.returncode, "JSON exit %r, process exit %d" % (out["exit"], p.returncode))
        check([layer["name"] for layer in out["layers"]] == ORDER, "layers out of order: %r" % out["layers"])
        return p.returncode, out, {layer["name"]: layer for layer in out["layers"]}


def expect_broken(sim, layer, words, env=None):
    rc, out, v = sim.verdicts(env=env)
    check(rc == 2, "doctor exit %d, wanted 2 (a failed layer):\n%s" % (rc, json.dumps(out, indent=1)))
    got = v[layer]
    check(got["verdict"] == "failed", "layer %s is %s (%s), wanted failed" % (layer, got["verdict"], got["message"]))
    check(words in got["message"], "layer %s says %r, wanted %r in it" % (layer, got["message"], words))
    check(got["fix"], "layer %s failed without a fix" % layer)
    below = ORDER[:ORDER.index(layer)]
    bad = [n for n in below if v[n]["verdict"] in ("failed",)]
    check(not bad, "layers below %s failed too: %s" % (layer, [(n, v[n]["message"]) for n in bad]))
    note("%s: %s — fix: %s", layer, got["message"], got["fix"][:100])
    text = sim.doctor(env=env).stdout
    check(layer in text and "failed" in text and got["fix"] in text, "text output lacks the verdict or fix:\n" + text)


def test_healthy_node_without_agent():
    with TempDir() as tmp:
        sim = Sim(tmp)
        rc, out, v = sim.verdicts()
        check(rc == 0, "a healthy node: doctor exit %d:\n%s" % (rc, json.dumps(out, indent=1)))
        check(out["agent_running"] is False, "agent_running on a node without the agent")
        for name in ("pci", "iommu", "modules", "secure-boot", "device-nodes", "fabric", "nvml", "cdi", "nfd"):
            check(v[name]["verdict"] == "ok", "healthy node: %s is %s (%s)" % (name, v[name]["verdict"], v[name]["message"]))
        check(v["health"]["verdict"] == "skipped" and "not running" in v["health"]["message"], "health without agent")
        p = sim.doctor()
        check("The agent is not running" in p.stdout, "the text output does not say the agent is not running:\n" + p.stdout)


def test_module_missing():
    with TempDir() as tmp:
        sim = Sim(tmp)
        shutil.rmtree(os.path.join(sim.node, "proc/driver/nvidia"))
        shutil.rmtree(os.path.join(sim.node, "sys/module/nvidia"))
        expect_broken(sim, "modules", "not loaded", env={"FAKE_NVML_FAIL_INIT": "DRIVER_NOT_LOADED"})


def test_version_mismatch():
    with TempDir() as tmp:
        sim = Sim(tmp)
        desc = os.path.join(sim.node, "nvml.yaml")
        with open(desc) as f:
            text = f.read()
        with open(desc, "w") as f:
            f.write(text.replace('driver_version: "%s"' % VERSION, 'driver_version: "550.127.05"'))
        expect_broken(sim, "modules", "version mismatch: kernel module %s, libnvidia-ml 550.127.05" % VERSION)


def test_installed_module_differs():
    """The loaded module is not the one installed for the running kernel (535 in the wrong-version tree): a
    warning, exit 1 — the next boot switches drivers."""
    with TempDir() as tmp:
        sim = Sim(tmp, tree="wrong-version")
        rc, out, v = sim.verdicts()
        check(rc == 1 and v["modules"]["verdict"] == "warning", "exit %d, modules %r" % (rc, v["modules"]))
        check("the installed module for 6.1.0-18-amd64 is 535.161.07" in v["modules"]["message"],
              "modules says %r" % v["modules"]["message"])
        note("modules: %s", v["modules"]["message"])


def test_secure_boot_not_loaded():
    """Signatures enforced (sig_enforce): with the (DKMS-signed) module loaded the signature was accepted;
    with it not loaded, the key is the suspect — a failure with the enrolment steps."""
    with TempDir() as tmp:
        sim = Sim(tmp)
        param = os.path.join(sim.node, "sys/module/module/parameters")
        os.makedirs(param, exist_ok=True)
        with open(os.path.join(param, "sig_enforce"), "w") as f:
            f.write("Y\n")
        rc, out, v = sim.verdicts()
        check(rc == 0 and v["secure-boot"]["verdict"] == "ok" and "accepted" in v["secure-boot"]["message"],
              "loaded, enforced: exit %d, %r" % (rc, v["secure-boot"]))
        shutil.rmtree(os.path.join(sim.node, "proc/driver/nvidia"))
        shutil.rmtree(os.path.join(sim.node, "sys/module/nvidia"))
        rc, out, v = sim.verdicts(env={"FAKE_NVML_FAIL_INIT": "DRIVER_NOT_LOADED"})
        check(rc == 2 and v["secure-boot"]["verdict"] == "failed" and "mokutil --import" in v["secure-boot"]["fix"],
              "not loaded, enforced: exit %d, %r" % (rc, v["secure-boot"]))
        note("secure-boot: %s", v["secure-boot"]["message"])


def test_vfio_passthrough():
    """A GPU bound to vfio-pci belongs to a VM: a warning naming it (exit 1), the rest of the node ok."""
    with TempDir() as tmp:
        sim = Sim(tmp, node="vfio")
        rc, out, v = sim.verdicts()
        check(rc == 1 and v["iommu"]["verdict"] == "warning" and "vfio-pci" in v["iommu"]["message"],
              "vfio node: exit %d, iommu %r" % (rc, v["iommu"]))
        check(v["nvml"]["verdict"] == "ok", "vfio node: nvml %r" % v["nvml"])
        note("iommu: %s", v["iommu"]["message"])


def test_missing_device_node():
    with TempDir() as tmp:
        sim = Sim(tmp)
        os.unlink(os.path.join(sim.dev, "nvidia3"))
        expect_broken(sim, "device-nodes", "nvidia3 missing")
    with TempDir() as tmp:
        sim = Sim(tmp)
        os.chmod(os.path.join(sim.dev, "nvidiactl"), 0o600)
        expect_broken(sim, "device-nodes", "has mode 600, not 666")


def test_fabric_manager_dead():
    with TempDir() as tmp:
        bus = test_devfab.FabricBus(tmp)
        systemd = test_devfab.FakeSystemd(bus, {"nvidia-fabricmanager.service": "fail",
                                                "nvidia-persistenced.service": "ok"}, tmp)
        try:
            sim = Sim(tmp)
            # What the agent's fabric stage does at boot: persistenced starts, the fabric manager fails.
            for unit in ("nvidia-persistenced.service", "nvidia-fabricmanager.service"):
                busctl(bus, "call", "org.freedesktop.systemd1", "/org/freedesktop/systemd1",
                       "org.freedesktop.systemd1.Manager", "StartUnit", "ss", unit, "replace", check_rc=None)
            time.sleep(0.2)
            expect_broken(sim, "fabricmanager", "nvidia-fabricmanager.service is failed",
                          env={"DBUS_SYSTEM_BUS_ADDRESS": bus.address})
            rc, out, v = sim.verdicts(env={"DBUS_SYSTEM_BUS_ADDRESS": bus.address})
            check(v["persistenced"]["verdict"] == "ok", "persistenced: %r" % v["persistenced"])
        finally:
            systemd.stop()
            bus.stop()


def test_cdi_stale():
    with TempDir() as tmp:
        sim = Sim(tmp)
        with open(sim.cdi) as f:
            spec = f.read()
        check("GPU-00006100-0000-4000-8000-233000000003" in spec, "the spec lacks GPU 3's UUID:\n" + spec[:500])
        with open(sim.cdi, "w") as f:
            f.write(spec.replace("GPU-00006100-0000-4000-8000-233000000003", "GPU-deadbeef-0000-4000-8000-000000000000"))
        expect_broken(sim, "cdi", "is stale: missing GPU-00006100-0000-4000-8000-233000000003")
    with TempDir() as tmp:
        sim = Sim(tmp)
        os.unlink(sim.cdi)
        expect_broken(sim, "cdi", "no CDI spec")


def cdi_devices(sim):
    with open(sim.cdi) as f:
        return yaml.safe_load(f)


def write_cdi(sim, spec):
    with open(sim.cdi, "w") as f:
        yaml.safe_dump(spec, f)


def test_cdi_mig_node():
    """A GPU in MIG mode has no whole-GPU entry in the spec (the writer's rule, as nvidia-ctk 1.18 and
    later): the doctor judges the file by that same rule, so a MIG node is ok, an entry for the whole GPU
    is stale, a MIG device left out is missing, and the agent's rewrite (what gpunodectl reconcile runs)
    makes it ok again. cdi.device-name-strategy is followed too: index names only, no UUID in the file."""
    with TempDir() as tmp:
        sim = Sim(tmp, node="a100-sxm-mig")
        rc, out, v = sim.verdicts()
        check(v["cdi"]["verdict"] == "ok" and "MIG devices only" in v["cdi"]["message"],
              "MIG node, spec as written: %r" % v["cdi"])
        check(rc == 0, "MIG node: doctor exit %d:\n%s" % (rc, json.dumps(out, indent=1)))
        spec = cdi_devices(sim)
        names = [d["name"] for d in spec["devices"]]
        check("0" not in names and "GPU-00000700-0000-4000-8000-20b000000000" not in names and "0:0" in names,
              "the writer's rule changed? devices %r" % names)
        whole = next(d for d in spec["devices"] if d["name"] == "2")
        spec["devices"].append(dict(copy.deepcopy(whole), name="0"))
        spec["devices"] = [d for d in spec["devices"] if d["name"] != "0:1"]
        write_cdi(sim, spec)
        expect_broken(sim, "cdi", "is stale: missing 0:1; lists devices the node does not have: 0")
        p = subprocess.run([AGENT, "--config", sim.config, "--config-dir", sim.confd, "--oneshot"], env=sim.env,
                           capture_output=True, text=True, timeout=60)
        check(p.returncode == 0, "the agent's rewrite failed:\n" + p.stdout + p.stderr)
        rc, out, v = sim.verdicts()
        check(v["cdi"]["verdict"] == "ok" and rc == 0, "after the rewrite: exit %d, %r" % (rc, v["cdi"]))
    with TempDir() as tmp:
        sim = Sim(tmp, dropin="cdi:\n  device-name-strategy: index\n")
        rc, out, v = sim.verdicts()
        check(v["cdi"]["verdict"] == "ok" and rc == 0, "index names: exit %d, %r" % (rc, v["cdi"]))


def test_runtime_without_cdi():
    with TempDir() as tmp:
        sim = Sim(tmp)
        os.makedirs(os.path.join(sim.node, "etc/containerd"))
        with open(os.path.join(sim.node, "etc/containerd/config.toml"), "w") as f:
            f.write('version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  sandbox_image = "pause:3.9"\n')
        expect_broken(sim, "runtime", "enable_cdi is not true")
        with open(os.path.join(sim.node, "etc/containerd/config.toml"), "a") as f:
            f.write('  enable_cdi = true\n  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]\n')
        rc, out, v = sim.verdicts()
        check(v["runtime"]["verdict"] == "ok" and rc == 0, "containerd with enable_cdi: %r" % v["runtime"])


def test_nfd_absent():
    with TempDir() as tmp:
        sim = Sim(tmp)
        shutil.rmtree(sim.features)
        expect_broken(sim, "nfd", "Node Feature Discovery is not installed")


def test_gpu_missing_from_bus():
    with TempDir() as tmp:
        sim = Sim(tmp, dropin="probe:\n  expect-gpus: 8\n")
        devices = os.path.join(sim.node, "sys/bus/pci/devices")
        victim = os.path.join(devices, "0000:61:00.0")
        check(os.path.lexists(victim), "fixture has no GPU 0000:61:00.0")
        if os.path.islink(victim):
            os.unlink(victim)
        else:
            shutil.rmtree(victim)
        expect_broken(sim, "pci", "7 NVIDIA GPUs on the PCI bus, 8 expected (probe.expect-gpus)")


def test_fabric_not_registered():
    with TempDir() as tmp:
        sim = Sim(tmp)
        desc = os.path.join(sim.node, "nvml.yaml")
        with open(desc) as f:
            text = f.read()
        marker = '  - pci: "0000:1b:00.0"\n'
        check(marker in text, "unexpected nvml.yaml")
        with open(desc, "w") as f:
            f.write(text.replace(marker, marker + '    fabric: {cluster_uuid: "a1b2c3d4-e5f6-0718-293a-4b5c6d7e8f90", '
                                 'clique: 7, state: in-progress}\n', 1))
        expect_broken(sim, "fabric", "fabric registration not complete on 0000:1b:00.0")


def test_nvml_hang_and_crash():
    """NVML is read in a child: a call that never returns costs nvml.timeout (5 s here), then the nvml layer
    fails naming the hang; a crash inside the library fails it naming the signal. The doctor survives both."""
    with TempDir() as tmp:
        sim = Sim(tmp)
        t0 = time.monotonic()
        expect_broken(sim, "nvml", "did not return within nvml.timeout (5 s)", env={"FAKE_NVML_HANG": "nvmlInit_v2:1"})
        note("doctor runs (JSON and text) with NVML hung: %.1f s", time.monotonic() - t0)
        # SIGSEGV (11), or SIGABRT (6) where ASan turns the fault into an abort.
        expect_broken(sim, "nvml", "libnvidia-ml crashed (signal", env={"FAKE_NVML_CRASH": "nvmlDeviceGetCount_v2:1"})


def test_with_agent_running():
    with TempDir() as tmp:
        events = os.path.join(tmp, "events")
        open(events, "w").close()
        d = test_nvml.Daemon(tmp, "dgx-h100", env={"FAKE_NVML_EVENT_FILE": events})
        try:
            d.reconcile()
            env = dict(os.environ, DBUS_SYSTEM_BUS_ADDRESS=d.bus.address)
            env.update(d.node.nvml_env)

            def run_doctor():
                p = subprocess.run([CTL, "doctor", "--json", "--agent-config", d.node.config, "--agent-config-dir",
                                    d.node.confd], env=env, capture_output=True, text=True, timeout=60)
                return p.returncode, json.loads(p.stdout)
            rc, out = run_doctor()
            v = {layer["name"]: layer for layer in out["layers"]}
            check(out["agent_running"] is True, "doctor did not see the running agent")
            check(v["health"]["verdict"] == "ok", "health with the agent: %r" % v["health"])
            with open(events, "a") as f:
                f.write("xid 2 79\n")
            test_nvml.wait_until("GPU 2 failed", lambda: "failed" in d.prop("Health"), 5)
            rc, out = run_doctor()
            v = {layer["name"]: layer for layer in out["layers"]}
            check(rc == 2 and v["health"]["verdict"] == "failed" and "XID 79" in v["health"]["message"],
                  "health after XID 79: exit %d, %r" % (rc, v["health"]))
            d.stop_clean()
        finally:
            d.close()


if __name__ == "__main__":
    tap_main([test_healthy_node_without_agent, test_module_missing, test_version_mismatch, test_installed_module_differs,
              test_secure_boot_not_loaded, test_vfio_passthrough,
              test_missing_device_node,
              test_fabric_manager_dead, test_cdi_stale, test_cdi_mig_node, test_runtime_without_cdi, test_nfd_absent,
              test_gpu_missing_from_bus, test_fabric_not_registered, test_nvml_hang_and_crash,
              test_with_agent_running], sys.argv[1:])
