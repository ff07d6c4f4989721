#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""End-to-end tests of the NVML side of the agent: the real daemon, on a private system-like bus, loads the
fake NVML (tests/fakes/README.md) for simulated nodes. Covers the full GFD label set, the CDI spec, NVML
coming up after the agent, the NVML facts on D-Bus and in gpunodectl, MIG layouts and their changes, and
garbage answers. Expected values come from the node descriptions (nvml.yaml, written by mknode.py), the
model table, and label lines written by hand from the GFD label contract (README.md, "Labels") — never from the code under test.
TAP output. GNA_WRAPPER (e.g. valgrind) wraps the daemon; GNA_TIMEOUT_SCALE stretches timeouts."""
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (AGENT, Agent, Bus, CTL, FAKE_NVML, Fail, Node, Notify, PCI_IDS, SRC, TempDir,  # noqa: E402
                     busctl, check, get_property, run, tap_main)

from harness import timeout_scale  # noqa: E402
SCALE = timeout_scale()
FAKE_NVML_CTL = os.path.join(os.path.dirname(FAKE_NVML), "fake-nvml-ctl")
AGENT_NAME = "org.gpunodeagent.Agent1"
AGENT_PATH = "/org/gpunodeagent/Agent1"
MANAGER = "org.gpunodeagent.Agent1.Manager"
GPU = "org.gpunodeagent.Agent1.Gpu"


def gpu_path(i):
    return "%s/gpu/%d" % (AGENT_PATH, i)


# --- expected values, from the fixtures ---

def version():
    return run([AGENT, "--version"], check_rc=0).stdout.split()[1]


def golden(name):
    with open(os.path.join(SRC, "tests/integration/golden", name)) as f:
        return f.read().replace("@VERSION@", version())


def nvml_description(node):
    """The fake NVML's view of the node, as mknode.py wrote it: what NVML must report."""
    with open(os.path.join(node.node, "nvml.yaml")) as f:
        return yaml.safe_load(f)


def pci_ids_name(device_id):
    """The pci.ids name of an NVIDIA device id, read from the fixture pci.ids the agent is pointed at."""
    in_nvidia = False
    with open(PCI_IDS, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("10de "):
                in_nvidia = True
            elif in_nvidia and line[:1] not in ("\t", "#", "\n"):
                break
            elif in_nvidia and line.startswith("\t%04x " % device_id):
                return line.strip().split(None, 1)[1].strip()
    raise Fail("device 10de:%04x not in %s" % (device_id, PCI_IDS))


def fake_show(node):
    """`fake-nvml-ctl show`: per GPU index, its MIG devices as [(gi, ci, profile, uuid)] in the fake's order."""
    p = run([FAKE_NVML_CTL, "show"], node=node, check_rc=0)
    gpus, gi = {}, None
    for line in p.stdout.splitlines():
        m = re.match(r"^GPU (\d+) ", line)
        if m:
            cur = gpus.setdefault(int(m.group(1)), [])
            continue
        m = re.match(r"^  GI (\d+) profile \d+ \((\S+)\)", line)
        if m:
            gi = int(m.group(1))
            continue
        m = re.match(r"^    CI (\d+) profile \d+ \((\S+)\) placement \S+ (MIG-\S+)", line)
        if m:
            cur.append((gi, int(m.group(1)), m.group(2), m.group(3)))
    return gpus


# --- Kubernetes label rules (README.md, "Labels"), checked independently of the agent's own validator ---

NAME_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
VALUE_RE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


def check_label_line(line):
    check("=" in line, "feature file line without '=': %r" % line)
    key, _, value = line.partition("=")
    prefix, slash, name = key.rpartition("/")
    check(slash == "/", "label %r has no prefix" % key)
    check(len(prefix) <= 253 and all(DNS_LABEL_RE.match(p) for p in prefix.split(".")),
          "label %r: prefix %r is not a DNS subdomain" % (key, prefix))
    check(len(name) <= 63 and NAME_RE.match(name), "label %r: name part %r breaks the Kubernetes rules" % (key, name))
    check(len(value) <= 63 and VALUE_RE.match(value), "label %r: value %r breaks the Kubernetes rules" % (key, value))


def read_labels(node):
    """The feature file as {key: value}, every line checked against the Kubernetes rules."""
    with open(node.feature_file()) as f:
        content = f.read()
    check(len(content) < 65536, "feature file is %d bytes: NFD skips files over 65536" % len(content))
    labels = {}
    for line in content.splitlines():
        if not line or line.startswith("#"):
            continue
        check_label_line(line)
        key, _, value = line.partition("=")
        check(key not in labels, "label %s written twice" % key)
        labels[key] = value
    return labels


# --- the CDI spec ---

def read_cdi(node):
    check(os.path.isfile(node.cdi_spec), "no CDI spec at %s" % node.cdi_spec)
    with open(node.cdi_spec) as f:
        spec = yaml.safe_load(f)
    check(isinstance(spec, dict) and spec.get("kind") == "nvidia.com/gpu",
          "CDI spec kind is %r, not nvidia.com/gpu" % (spec.get("kind") if isinstance(spec, dict) else spec))
    names = [d["name"] for d in spec.get("devices", [])]
    check(len(names) == len(set(names)), "CDI device names not unique: %r" % names)
    return spec


def cdi_devices(spec):
    """{name: [device node paths]}"""
    return {d["name"]: [n["path"] for n in d.get("containerEdits", {}).get("deviceNodes", [])]
            for d in spec.get("devices", [])}


def file_id(path):
    st = os.stat(path)
    return (st.st_ino, st.st_mtime_ns)


# --- running the agent ---

def wait_until(what, fn, timeout):
    deadline = time.monotonic() + timeout * SCALE
    while True:
        if fn():
            return
        if time.monotonic() > deadline:
            raise Fail("timed out after %.0fs waiting for %s" % (timeout * SCALE, what))
        time.sleep(0.05)


class Daemon:
    """A running agent on a private bus with a notify listener, for one test. `dropin` is written to
    conf.d before the start (agent.yaml already has paths/nvml/labels/cdi sections)."""

    def __init__(self, tmp, node="dgx-h100", dropin="", env=None, nvml_library=None, wait_ready=True):
        self.bus = Bus(tmp)
        self.notify = Notify(tmp)
        self.node = Node(tmp, node, nvml_library=nvml_library)
        if dropin:
            with open(os.path.join(self.node.confd, "50-test.yaml"), "w") as f:
                f.write(dropin)
        self.agent = Agent(self.node, self.bus, self.notify, extra_env=env)
        if wait_ready:
            try:
                self.notify.wait_for("READY=1", 60 * SCALE)
            except Fail:
                self.close()
                raise Fail("no READY=1; agent output:\n" + self.agent.output())

    def prop(self, name, path=AGENT_PATH, interface=MANAGER):
        return get_property(self.bus, name, path, interface)

    def expect(self, name, want, path=AGENT_PATH, interface=MANAGER, why=""):
        """Checks a property as busctl prints it, e.g. 's "9.0"' or 't 81559'."""
        got = self.prop(name, path, interface)
        check(got == want, "%s%s %s is %s, wanted %s" % (why + ": " if why else "", path[len(AGENT_PATH):] or "Manager",
                                                     name, got, want))

    def prop_json(self, name, path=AGENT_PATH, interface=MANAGER):
        p = busctl(self.bus, "--json=short", "get-property", AGENT_NAME, path, interface, name)
        return json.loads(p.stdout)["data"]

    def stage(self, name):
        """(state, message) of one stage, from the Stages property."""
        for s in self.prop_json("Stages"):
            if s[0] == name:
                return s[1], s[4]
        raise Fail("no stage %r in Stages" % name)

    def ctl(self, *args):
        return run([CTL] + list(args), bus=self.bus, check_rc=0).stdout

    def reconcile(self):
        """Calls Reconcile() and waits for the pass it starts to finish: the labels stage, the last one, has
        run and STATUS= has left "Running stage" after it (it also says Ready between two stages)."""
        start = len(self.notify.messages)
        busctl(self.bus, "call", AGENT_NAME, AGENT_PATH, MANAGER, "Reconcile")
        self.wait_pass_done(start, "the Reconcile pass to finish")

    def wait_pass_done(self, start=0, what="the start-up pass to finish"):
        """Waits until a pass that began after notify message `start` has run its labels stage and
        STATUS= has left "Running stage" after it. READY=1 comes before the first pass ends (the
        service is up; the node may not be): a test that counts signals waits for this first."""
        def pass_done():
            self.notify.drain(0.05)
            msgs = self.notify.messages[start:]
            labels = [i for i, m in enumerate(msgs) if m.startswith("STATUS=Running stage labels")]
            return bool(labels) and any(m.startswith(("STATUS=Ready", "STATUS=Degraded", "STATUS=Failed"))
                                        for m in msgs[labels[-1]:])
        wait_until(what, pass_done, 20)

    def stop_clean(self):
        rc = self.agent.stop(signal.SIGTERM, timeout=int(60 * SCALE))
        check(rc == 0, "agent exited %d on SIGTERM (valgrind errors are 99):\n%s" % (rc, self.agent.output()))

    def close(self):
        if self.agent.proc.poll() is None:
            self.agent.proc.kill()
            self.agent.proc.wait()
        self.notify.close()
        self.bus.stop()


class Monitor:
    """`busctl monitor --json=short` in the background, bounded by a timeout, for counting signals."""

    def __init__(self, d, tmp):
        self.d = d
        self.path = os.path.join(tmp, "monitor-%d.json" % time.monotonic_ns())
        self.out = open(self.path, "w")
        self.proc = subprocess.Popen(["timeout", str(int(120 * SCALE)), "busctl", "--address=" + d.bus.address,
                                      "monitor", "--json=short"], stdout=self.out, stderr=subprocess.STDOUT)
        # Monitoring has started once one of our own calls shows up in it.
        def started():
            self.d.prop("Ready")
            return any(m.get("member") == "Get" for m in self.messages())
        wait_until("busctl monitor to start", started, 10)

    def messages(self):
        self.out.flush()
        msgs = []
        with open(self.path) as f:
            for line in f:
                if line.startswith("{"):
                    try:
                        msgs.append(json.loads(line))
                    except ValueError:
                        pass  # a line still being written
        return msgs

    def sync(self):
        """Pings the agent and waits for the answer in the monitor: everything the agent sent before it
        (signals included: one connection's messages stay in order) has then been seen."""
        time.sleep(0.5 * SCALE)  # property changes are coalesced; give them a moment to go out
        busctl(self.d.bus, "call", AGENT_NAME, AGENT_PATH, "org.freedesktop.DBus.Peer", "Ping")

        def answered():
            msgs = self.messages()
            pings = [(m["sender"], m["cookie"]) for m in msgs
                     if m.get("type") == "method_call" and m.get("member") == "Ping"]
            return any(m.get("type") == "method_return" and (m.get("destination"), m.get("reply_cookie")) in pings
                       for m in msgs)
        wait_until("the Ping reply in busctl monitor", answered, 10)

    def properties_changed(self, start=0, ignore=("Health", "HealthEvents")):
        """{object path: number of PropertiesChanged signals} from message index `start` on. Signals that
        change only properties in `ignore` are not counted: GPU health is watched by a worker of its own
        (the event worker's start and checks may land in any window) and is tested in test-health.py."""
        counts = {}
        for m in self.messages()[start:]:
            if m.get("type") == "signal" and m.get("member") == "PropertiesChanged":
                names = self.changed_names(m)
                if names and all(n in ignore for n in names):
                    continue
                counts[m["path"]] = counts.get(m["path"], 0) + 1
        return counts

    @staticmethod
    def changed_names(m):
        """The property names a PropertiesChanged signal carries (changed and invalidated), [] if unreadable."""
        try:
            data = m["payload"]["data"]
            return sorted(list(data[1].keys()) + list(data[2]))
        except (KeyError, IndexError, TypeError, AttributeError):
            return []

    def properties_changed_names(self, start=0):
        """{object path: [property names of each PropertiesChanged]}, for failure messages."""
        out = {}
        for m in self.messages()[start:]:
            if m.get("type") == "signal" and m.get("member") == "PropertiesChanged":
                out.setdefault(m["path"], []).append(self.changed_names(m))
        return out

    def close(self):
        self.proc.terminate()
        self.proc.wait(10)
        self.out.close()


# --- 1. the full label set and the CDI spec from NVML ---

def test_full_labels_and_cdi_spec():
    with TempDir() as tmp:
        d = Daemon(tmp, "dgx-h100")
        try:
            with open(d.node.feature_file()) as f:
                content = f.read()
            check(content == golden("dgx-h100.features"),
                  "feature file differs from golden/dgx-h100.features:\n" + content)
            read_labels(d.node)

            spec = read_cdi(d.node)
            desc = nvml_description(d.node)
            uuids = [g["uuid"] for g in desc["gpus"]]
            check(len(uuids) == 8, "fixture dgx-h100 should describe 8 GPUs to NVML, has %d" % len(uuids))
            devices = cdi_devices(spec)
            want = {str(i) for i in range(8)} | set(uuids) | {"all"}
            check(set(devices) == want, "CDI devices %s, wanted the 8 indices, 8 GPU UUIDs and all (missing %s, "
                  "extra %s)" % (sorted(devices), sorted(want - set(devices)), sorted(set(devices) - want)))
            for i, g in enumerate(desc["gpus"]):
                node = "/dev/nvidia%d" % g["minor"]
                check(devices[str(i)] == [node], "CDI device %d has nodes %r, wanted [%s]" % (i, devices[str(i)], node))
                check(devices[g["uuid"]] == [node], "CDI device %s has nodes %r" % (g["uuid"], devices[g["uuid"]]))
            check(sorted(devices["all"]) == sorted("/dev/nvidia%d" % g["minor"] for g in desc["gpus"]),
                  "CDI device all has nodes %r" % devices["all"])

            before = file_id(d.node.cdi_spec), file_id(d.node.feature_file())
            d.reconcile()
            after = file_id(d.node.cdi_spec), file_id(d.node.feature_file())
            check(before[0] == after[0], "Reconcile rewrote the unchanged CDI spec (inode, mtime %r → %r)"
                  % (before[0], after[0]))
            check(before[1] == after[1], "Reconcile rewrote the unchanged feature file")
            d.stop_clean()
        finally:
            d.close()


# --- 2. NVML appears later ---

def check_degraded_pci_only(d, what):
    d.expect("Ready", "b false", why=what)
    d.expect("State", 's "degraded"', why=what)
    with open(d.node.feature_file()) as f:
        content = f.read()
    check(content == golden("dgx-h100-pci-only.features"),
          "%s: feature file differs from golden/dgx-h100-pci-only.features:\n%s" % (what, content))


def test_nvml_appears_later():
    with TempDir() as tmp:
        lib = os.path.join(tmp, "nvidia/libnvidia-ml.so.1")
        d = Daemon(tmp, "dgx-h100", dropin="engine:\n  retry-min: 1s\n  retry-max: 2s\n", nvml_library=lib)
        try:
            state, msg = d.stage("nvml")
            check(state == "failed", "nvml stage is %s without the library, not failed" % state)
            check(lib in msg, "nvml stage message does not name the library path %s: %s" % (lib, msg))
            check_degraded_pci_only(d, "library missing")
            check(not os.path.exists(d.node.cdi_spec), "a CDI spec was written without NVML")

            # The driver's library appears (as when the driver package is installed after boot).
            os.makedirs(os.path.dirname(lib))
            os.symlink(FAKE_NVML, lib)
            wait_until("the nvml stage to succeed on a retry (no Reconcile)",
                       lambda: d.stage("nvml")[0] == "done" and d.prop("State") == 's "ready"', 15)
            d.expect("Ready", "b true", why="NVML is up")
            with open(d.node.feature_file()) as f:
                content = f.read()
            check(content == golden("dgx-h100.features"),
                  "labels not upgraded to the full set when NVML came up:\n" + content)
            want = nvml_description(d.node)["driver_version"]
            d.expect("DriverVersion", 's "%s"' % want, why="NVML is up")
            check(os.path.isfile(d.node.cdi_spec), "no CDI spec once NVML is up")
            d.stop_clean()
        finally:
            d.close()


def test_product_kept_while_nvml_down():
    """NVML's product name outlives a restart without NVML (the state directory's gpu-products), so
    gpu.product does not flap between GFD's name and the pci.ids one; without the file it is pci.ids'."""
    with TempDir() as tmp:
        d = Daemon(tmp, "dgx-h100")
        try:
            check(read_labels(d.node)["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3",
                  "gpu.product with NVML: %r" % read_labels(d.node)["nvidia.com/gpu.product"])
            d.stop_clean()
        finally:
            d.close()
        state = os.path.join(d.node.state, "gpu-products")
        with open(state) as f:
            rows = [line.split() for line in f if not line.startswith("#")]
        check(len(rows) == 8 and all(r[1:] == ["2330", "NVIDIA-H100-80GB-HBM3"] for r in rows),
              "%s after a run with NVML: %r" % (state, rows))

        for kept in (True, False):
            # A fresh bus and notify socket for the restart; the same state directory content.
            run_dir = os.path.join(tmp, "restart-%s" % kept)
            os.makedirs(os.path.join(run_dir, "state"))
            if kept:
                shutil.copy(state, os.path.join(run_dir, "state", "gpu-products"))
            d = Daemon(run_dir, "dgx-h100", nvml_library=os.path.join(tmp, "missing/libnvidia-ml.so.1"))
            try:
                d.expect("State", 's "degraded"', why="no NVML")
                want = golden("dgx-h100-pci-only.features")
                if kept:
                    want = want.replace("gpu.product=NVIDIA-H100-SXM5-80GB", "gpu.product=NVIDIA-H100-80GB-HBM3")
                with open(d.node.feature_file()) as f:
                    content = f.read()
                check(content == want, "NVML down, %s: feature file:\n%s" % (
                    "NVML's names kept" if kept else "no gpu-products", content))
                d.stop_clean()
            finally:
                d.close()


def test_vgpu_guest_labels():
    """A vGPU guest (fixture vgpu-guest: one GPU with NVIDIA's "VF" vendor-specific PCI capability, one
    passed through): the real daemon reads the capability from config space and labels it as GFD does."""
    with TempDir() as tmp:
        d = Daemon(tmp, "vgpu-guest")
        try:
            labels = read_labels(d.node)
            got = {k: v for k, v in labels.items() if k.startswith("nvidia.com/vgpu.")}
            want = {"nvidia.com/vgpu.present": "true", "nvidia.com/vgpu.host-driver-version": "550.127.05",
                    "nvidia.com/vgpu.host-driver-branch": "r550_00"}
            check(got == want, "vGPU labels %r, wanted %r" % (got, want))
            check(labels.get("nvidia.com/gpu.count") == "2", "gpu.count %r" % labels.get("nvidia.com/gpu.count"))
            d.stop_clean()
        finally:
            d.close()
        os.makedirs(os.path.join(tmp, "bare"))
        d = Daemon(os.path.join(tmp, "bare"), "a100-pcie")
        try:
            labels = read_labels(d.node)
            check(labels.get("nvidia.com/vgpu.present") == "false" and
                  not any(k.startswith("nvidia.com/vgpu.host") for k in labels),
                  "bare metal: vgpu labels %r" % {k: v for k, v in labels.items() if "vgpu" in k})
            d.stop_clean()
        finally:
            d.close()


def test_nvml_driver_not_loaded():
    with TempDir() as tmp:
        d = Daemon(tmp, "dgx-h100", env={"FAKE_NVML_FAIL_INIT": "9"})
        try:
            state, msg = d.stage("nvml")
            check(state == "failed", "nvml stage is %s when nvmlInit says DRIVER_NOT_LOADED" % state)
            check("kernel module is not loaded" in msg, "nvml stage message does not say the kernel module is not "
                  "loaded: " + msg)
            check_degraded_pci_only(d, "driver not loaded")
            check(d.agent.proc.poll() is None, "agent exited because NVML could not start")
            d.stop_clean()
        finally:
            d.close()


# --- 3. NVML facts on D-Bus and in gpunodectl ---

def test_dbus_nvml_properties():
    with TempDir() as tmp:
        d = Daemon(tmp, "dgx-h100")
        try:
            desc = nvml_description(d.node)
            driver, cuda = desc["driver_version"], str(desc["cuda_version"])
            d.expect("DriverVersion", 's "%s"' % driver)
            d.expect("CudaVersion", 's "%s"' % cuda)

            pci_name = pci_ids_name(0x2330)
            for i, g in enumerate(desc["gpus"]):
                p = gpu_path(i)
                check(g["uuid"].startswith("GPU-"), "fixture UUID %s does not start with GPU-" % g["uuid"])
                d.expect("PciAddress", 's "%s"' % g["pci"], p, GPU)
                d.expect("NvmlName", 's "%s"' % g["model"], p, GPU)
                d.expect("Name", 's "%s"' % pci_name, p, GPU, why="Name stays the pci.ids name")
                d.expect("Uuid", 's "%s"' % g["uuid"], p, GPU)
                # The model table's H100 80GB HBM3: total_mib 81559, compute [9, 0].
                d.expect("MemoryMiB", "t 81559", p, GPU)
                d.expect("ComputeCapability", 's "9.0"', p, GPU)
                d.expect("MigMode", 's "disabled"', p, GPU)
                d.expect("MigModePending", 's "disabled"', p, GPU)
                d.expect("MigDevices", "a(ssuu) 0", p, GPU)

            out = d.ctl("gpus")
            rows = [line for line in out.splitlines() if re.match(r"^\d+\s+0000:", line)]
            check(len(rows) == 8, "gpunodectl gpus listed %d GPU rows:\n%s" % (len(rows), out))
            for row in rows:
                check("80 GiB" in row and " 9.0 " in row and "disabled" in row,
                      "gpunodectl gpus row lacks memory 80 GiB, CC 9.0 or MIG disabled: " + row)
            gpus = json.loads(d.ctl("--json", "gpus"))
            for i, g in enumerate(gpus):
                want = desc["gpus"][i]
                check(g["uuid"] == want["uuid"], "gpunodectl --json gpus: GPU %d uuid %r, wanted the full %s"
                      % (i, g["uuid"], want["uuid"]))
                check(g["memory_mib"] == 81559, "gpunodectl --json gpus: GPU %d memory_mib %r" % (i, g["memory_mib"]))
                check(g["compute_capability"] == "9.0" and g["nvml_name"] == want["model"],
                      "gpunodectl --json gpus: GPU %d %r" % (i, g))
            st = d.ctl("status")
            check(re.search(r"^\s*Driver: %s \(CUDA %s\)$" % (re.escape(driver), re.escape(cuda)), st, re.M),
                  "gpunodectl status has no 'Driver: %s (CUDA %s)':\n%s" % (driver, cuda, st))
            d.stop_clean()
        finally:
            d.close()


def test_dbus_nvml_unavailable():
    with TempDir() as tmp:
        d = Daemon(tmp, "dgx-h100", nvml_library=os.path.join(tmp, "missing/libnvidia-ml.so.1"))
        try:
            d.expect("DriverVersion", 's ""', why="no NVML")
            d.expect("CudaVersion", 's ""', why="no NVML")
            d.expect("Uuid", 's ""', gpu_path(0), GPU, why="no NVML")
            d.expect("MemoryMiB", "t 0", gpu_path(0), GPU, why="no NVML")
            d.expect("Name", 's "%s"' % pci_ids_name(0x2330), gpu_path(0), GPU, why="no NVML, the pci.ids name stays")
            st = d.ctl("status")
            check(re.search(r"^\s*Driver: unavailable \(see stage nvml\)$", st, re.M),
                  "gpunodectl status without NVML:\n" + st)
            d.stop_clean()
        finally:
            d.close()


def test_mig_mode_unsupported():
    with TempDir() as tmp:
        d = Daemon(tmp, "l40s")
        try:
            check(d.prop("MigMode", gpu_path(0), GPU) == 's "unsupported"',
                  "L40S MigMode: %s, wanted unsupported" % d.prop("MigMode", gpu_path(0), GPU))
            check(read_labels(d.node).get("nvidia.com/mig.capable") == "false", "L40S labelled mig.capable != false")
            d.stop_clean()
        finally:
            d.close()


# --- 4. MIG ---

MIXED = "labels:\n  mig-strategy: mixed\n"
SINGLE = "labels:\n  mig-strategy: single\n"

# The GFD label contract (README.md, "Labels"), mixed strategy, for fixture a100-sxm-mig (GPU 0: 3g.20gb + 2x 2g.10gb). Attributes from the
# model table's A100-SXM4-40GB: 14 SMs per slice, memory 19968/9856 MiB for 4/2 memory slices, engines of the
# 3g (ce 3, dec 2) and 2g (ce 2, dec 1) profiles, no encoder/jpeg/ofa.
A100_MIXED_MIG_LABELS = """\
nvidia.com/mig-2g.10gb.count=2
nvidia.com/mig-2g.10gb.engines.copy=2
nvidia.com/mig-2g.10gb.engines.decoder=1
nvidia.com/mig-2g.10gb.engines.encoder=0
nvidia.com/mig-2g.10gb.engines.jpeg=0
nvidia.com/mig-2g.10gb.engines.ofa=0
nvidia.com/mig-2g.10gb.memory=9856
nvidia.com/mig-2g.10gb.multiprocessors=28
nvidia.com/mig-2g.10gb.product=NVIDIA-A100-SXM4-40GB-MIG-2g.10gb
nvidia.com/mig-2g.10gb.replicas=1
nvidia.com/mig-2g.10gb.sharing-strategy=none
nvidia.com/mig-2g.10gb.slices.ci=2
nvidia.com/mig-2g.10gb.slices.gi=2
nvidia.com/mig-3g.20gb.count=1
nvidia.com/mig-3g.20gb.engines.copy=3
nvidia.com/mig-3g.20gb.engines.decoder=2
nvidia.com/mig-3g.20gb.engines.encoder=0
nvidia.com/mig-3g.20gb.engines.jpeg=0
nvidia.com/mig-3g.20gb.engines.ofa=0
nvidia.com/mig-3g.20gb.memory=19968
nvidia.com/mig-3g.20gb.multiprocessors=42
nvidia.com/mig-3g.20gb.product=NVIDIA-A100-SXM4-40GB-MIG-3g.20gb
nvidia.com/mig-3g.20gb.replicas=1
nvidia.com/mig-3g.20gb.sharing-strategy=none
nvidia.com/mig-3g.20gb.slices.ci=3
nvidia.com/mig-3g.20gb.slices.gi=3
"""


def mig_labels(labels):
    return {k: v for k, v in labels.items() if k.startswith("nvidia.com/mig-")}


def expected(text):
    return dict(line.split("=", 1) for line in text.splitlines())


def test_mig_mixed_labels():
    with TempDir() as tmp:
        d = Daemon(tmp, "a100-sxm-mig", dropin=MIXED)
        try:
            labels = read_labels(d.node)
            got = mig_labels(labels)
            want = expected(A100_MIXED_MIG_LABELS)
            check(got == want, "mig-* labels differ from the GFD label contract's mixed strategy:\n  missing/wrong %s\n"
                  "  extra %s" % (sorted(set(want.items()) - set(got.items())),
                                  sorted(set(got.items()) - set(want.items()))))
            for key, value in (("nvidia.com/mig.strategy", "mixed"), ("nvidia.com/gpu.count", "8"),
                               ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB"), ("nvidia.com/mig.capable", "true"),
                               ("nvidia.com/gpu.family", "ampere"), ("nvidia.com/gpu-node-agent.state", "ready")):
                check(labels.get(key) == value, "mixed strategy: %s=%r, wanted %s" % (key, labels.get(key), value))
            d.stop_clean()
        finally:
            d.close()


def test_mig_single_invalid():
    with TempDir() as tmp:
        d = Daemon(tmp, "a100-sxm-mig", dropin=SINGLE)
        try:
            labels = read_labels(d.node)
            # Not every GPU is in MIG mode and GPU 0 has two profiles: an invalid single layout.
            for key, value in (("nvidia.com/mig.strategy", "single"),
                               ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB-MIG-INVALID"),
                               ("nvidia.com/gpu.count", "0"), ("nvidia.com/gpu.replicas", "0"),
                               ("nvidia.com/gpu.memory", "0"), ("nvidia.com/gpu.sharing-strategy", "")):
                check(labels.get(key) == value, "single strategy on a mixed layout: %s=%r, wanted %r"
                      % (key, labels.get(key), value))
            check(not mig_labels(labels), "single strategy wrote mig-* labels: %r" % mig_labels(labels))
            d.stop_clean()
        finally:
            d.close()


def check_mig_devices_property(d, index, want):
    """MigDevices of gpu/<index> equals want [(gi, ci, profile, uuid)], ordered by GI id."""
    got = [(e[2], e[3], e[1], e[0]) for e in d.prop_json("MigDevices", gpu_path(index), GPU)]
    check(got == sorted(want), "gpu/%d MigDevices %r, wanted (ordered by GI) %r" % (index, got, sorted(want)))


def test_mig_dbus_and_gpunodectl():
    with TempDir() as tmp:
        d = Daemon(tmp, "a100-sxm-mig", dropin=MIXED)
        try:
            fake = fake_show(d.node)
            layout = [(g, c, p) for g, c, p, _ in sorted(fake[0])]
            check(layout == [(2, 0, "3g.20gb"), (3, 0, "2g.10gb"), (4, 0, "2g.10gb")],
                  "the fake's layout of GPU 0 is not the fixture's: %r" % fake[0])
            check_mig_devices_property(d, 0, fake[0])
            d.expect("MigMode", 's "enabled"', gpu_path(0), GPU)
            d.expect("MigModePending", 's "enabled"', gpu_path(0), GPU)
            d.expect("MigMode", 's "disabled"', gpu_path(1), GPU, why="change pending")
            d.expect("MigModePending", 's "enabled"', gpu_path(1), GPU, why="change pending")
            d.expect("MigDevices", "a(ssuu) 0", gpu_path(1), GPU)

            out = d.ctl("gpus")
            lines = out.splitlines()
            row1 = [line for line in lines if re.match(r"^1\s+0000:", line)]
            check(row1 and "disabled→enabled" in row1[0],
                  "gpunodectl gpus does not show GPU 1's pending change:\n" + out)
            row0 = [i for i, line in enumerate(lines) if re.match(r"^0\s+0000:", line)]
            check(row0, "gpunodectl gpus has no GPU 0 row:\n" + out)
            tree = lines[row0[0] + 1:row0[0] + 4]
            for line, (gi, ci, profile, uuid), branch in zip(tree, sorted(fake[0]), ("├─", "├─", "└─")):
                pattern = r"^\s+%s %d:%d %s\s+%s" % (branch, gi, ci, re.escape(profile), re.escape(uuid[:12]))
                check(re.match(pattern, line), "gpunodectl gpus MIG line %r, wanted %s %d:%d %s %s…\n%s"
                      % (line, branch, gi, ci, profile, uuid[:12], out))
            gpus = json.loads(d.ctl("--json", "gpus"))
            devs = [(m["gi_id"], m["ci_id"], m["profile"], m["uuid"]) for m in gpus[0]["mig_devices"]]
            check(devs == sorted(fake[0]), "gpunodectl --json gpus mig_devices %r" % devs)
            check(gpus[1]["mig_mode"] == "disabled" and gpus[1]["mig_mode_pending"] == "enabled",
                  "gpunodectl --json gpus GPU 1 MIG modes %r/%r" % (gpus[1]["mig_mode"], gpus[1]["mig_mode_pending"]))
            d.stop_clean()
        finally:
            d.close()


def mig_caps(gpu_minor, gi, ci):
    """The nvidia-caps device nodes of a MIG device, from proc/driver/nvidia-caps/mig-minors as mknode.py lays
    it out (the driver's layout): config 1, monitor 2, then per GPU 15 GIs of (access + 8 CIs)."""
    gi_minor = 3 + (gpu_minor * 15 + gi) * 9
    return ["/dev/nvidia-caps/nvidia-cap%d" % gi_minor, "/dev/nvidia-caps/nvidia-cap%d" % (gi_minor + 1 + ci)]


def check_cdi_layout(d, what):
    """The CDI spec matches what the fake NVML reports now: N:M and MIG-<uuid> per MIG device, N and GPU-<uuid>
    only for GPUs not in MIG mode, all."""
    desc = nvml_description(d.node)
    fake = fake_show(d.node)
    modes = {}
    for line in run([FAKE_NVML_CTL, "show"], node=d.node, check_rc=0).stdout.splitlines():
        m = re.match(r"^GPU (\d+) .*MIG current (\w+)", line)
        if m:
            modes[int(m.group(1))] = m.group(2)
    want = {"all": None}
    for i, g in enumerate(desc["gpus"]):
        parent = "/dev/nvidia%d" % g["minor"]
        if modes[i] == "enabled":
            for j, (gi, ci, _, uuid) in enumerate(sorted(fake[i])):
                nodes = [parent] + mig_caps(g["minor"], gi, ci)
                want["%d:%d" % (i, j)] = nodes
                want[uuid] = nodes
        else:
            want[str(i)] = [parent]
            want[g["uuid"]] = [parent]
    got = cdi_devices(read_cdi(d.node))
    check(set(got) == set(want), "%s: CDI devices missing %s, extra %s" % (what, sorted(set(want) - set(got)),
                                                                          sorted(set(got) - set(want))))
    for name, nodes in want.items():
        if nodes is not None:
            check(got[name] == nodes, "%s: CDI device %s has nodes %r, wanted %r" % (what, name, got[name], nodes))
    return got


def test_mig_cdi_spec():
    with TempDir() as tmp:
        d = Daemon(tmp, "a100-sxm-mig", dropin=MIXED)
        try:
            got = check_cdi_layout(d, "MIG layout")
            uuid0 = nvml_description(d.node)["gpus"][0]["uuid"]
            check("0" not in got and uuid0 not in got, "GPU 0 is in MIG mode but has a full-GPU CDI entry")
            check(all(n in got for n in ("0:0", "0:1", "0:2")), "CDI spec lacks 0:0..0:2: %r" % sorted(got))
            d.stop_clean()
        finally:
            d.close()


def test_mig_layout_change_followed():
    with TempDir() as tmp:
        d = Daemon(tmp, "a100-sxm-mig", dropin=MIXED)
        mon = None
        try:
            desc = nvml_description(d.node)
            # Count only what the resets cause: the start-up pass's signals (coalesced, late under
            # valgrind on a busy machine) must be out before the window opens.
            d.wait_pass_done()
            mon = Monitor(d, tmp)
            mon.sync()

            # GPU 1's pending MIG mode becomes current on a reset: it loses its full-GPU CDI entries.
            start = len(mon.messages())
            run([FAKE_NVML_CTL, "reset", desc["gpus"][1]["pci"]], node=d.node, check_rc=0)
            d.reconcile()
            mon.sync()
            changed = {p: n for p, n in mon.properties_changed(start).items() if "/gpu/" in p}
            check(changed == {gpu_path(1): 1}, "after resetting GPU 1: PropertiesChanged per GPU object %r, wanted "
                  "exactly one on gpu/1; properties: %r" % (changed, mon.properties_changed_names(start)))
            d.expect("MigMode", 's "enabled"', gpu_path(1), GPU, why="after GPU 1's reset")
            got = check_cdi_layout(d, "after resetting GPU 1")
            check("1" not in got, "GPU 1 kept its full-GPU CDI entry in MIG mode")
            check(mig_labels(read_labels(d.node)) == expected(A100_MIXED_MIG_LABELS),
                  "mig-* labels changed although no MIG device did")

            # GPU 0's reset destroys its GPU instances: its MIG devices vanish from labels, CDI and D-Bus.
            start = len(mon.messages())
            run([FAKE_NVML_CTL, "reset", desc["gpus"][0]["pci"]], node=d.node, check_rc=0)
            d.reconcile()
            mon.sync()
            changed = {p: n for p, n in mon.properties_changed(start).items() if "/gpu/" in p}
            check(changed == {gpu_path(0): 1}, "after resetting GPU 0: PropertiesChanged per GPU object %r, wanted "
                  "exactly one on gpu/0; properties: %r" % (changed, mon.properties_changed_names(start)))
            d.expect("MigDevices", "a(ssuu) 0", gpu_path(0), GPU, why="after GPU 0's reset")
            labels = read_labels(d.node)
            check(not mig_labels(labels), "mig-* labels left after GPU 0's instances were destroyed: %r"
                  % mig_labels(labels))
            check(labels.get("nvidia.com/mig.strategy") == "mixed" and labels.get("nvidia.com/gpu.count") == "8",
                  "full-GPU labels wrong after the reset")
            got = check_cdi_layout(d, "after resetting GPU 0")
            check(not any(":" in n for n in got), "N:M CDI entries left: %r" % sorted(got))
            d.stop_clean()
        finally:
            if mon:
                mon.close()
            d.close()


def check_cdi_nodes_exist(d, what):
    """Every device node the CDI spec names exists under the node's /dev as a character device: a container
    asking for any device of the spec gets it."""
    missing = []
    spec = read_cdi(d.node)
    for name, nodes in cdi_devices(spec).items():
        for path in nodes:
            check(path.startswith("/dev/"), "%s: CDI device %s names %s, outside /dev" % (what, name, path))
            local = os.path.join(d.node.dev, path[len("/dev/"):])
            if not (os.path.lexists(local) and stat.S_ISCHR(os.lstat(local).st_mode)):
                missing.append(path)
    check(not missing, "%s: %d device node(s) the CDI spec names do not exist: %s"
          % (what, len(set(missing)), sorted(set(missing))[:8]))
    return spec


def test_cdi_device_name_strategy():
    """cdi.device-name-strategy through the daemon: type-index names as nvidia-ctk's (gpuN, migN:M), uuid
    names only; the MIG-enabled GPU 0 has no whole-GPU entry under either."""
    with TempDir() as tmp:
        d = Daemon(tmp, "a100-sxm-mig", dropin=MIXED + "cdi:\n  device-name-strategy: type-index\n")
        try:
            desc = nvml_description(d.node)
            names = set(cdi_devices(read_cdi(d.node)))
            want = {"gpu%d" % i for i in range(1, len(desc["gpus"]))} | {"mig0:0", "mig0:1", "mig0:2", "all"}
            check(names == want, "type-index names %r, wanted %r" % (sorted(names), sorted(want)))
            d.stop_clean()
        finally:
            d.close()
    with TempDir() as tmp:
        d = Daemon(tmp, "a100-sxm-mig", dropin=MIXED + "cdi:\n  device-name-strategy: uuid\n")
        try:
            desc = nvml_description(d.node)
            names = set(cdi_devices(read_cdi(d.node)))
            migs = {u for _, _, _, u in fake_show(d.node)[0]}
            want = {g["uuid"] for g in desc["gpus"][1:]} | migs | {"all"}
            check(len(migs) == 3 and names == want, "uuid names %r, wanted %r" % (sorted(names), sorted(want)))
            check(desc["gpus"][0]["uuid"] not in names, "the MIG-enabled GPU 0 has a whole-GPU entry")
            d.stop_clean()
        finally:
            d.close()


def test_mig_cap_nodes_at_ready():
    """The capability nodes of MIG devices that exist when the agent starts are there when it says ready: the
    devices stage runs before NVML is read, so they are made once the snapshot is in, before the CDI spec."""
    for node, n_mig in (("a100-sxm-mig", 3), ("a100-sxm-balanced", 32)):
        with TempDir() as tmp:
            d = Daemon(tmp, node, dropin=MIXED)
            try:
                run([CTL, "wait-ready", "--timeout", "10"], bus=d.bus, check_rc=0)
                got = check_cdi_layout(d, "%s at ready" % node)
                check(len([n for n in got if re.match(r"^\d+:\d+$", n)]) == n_mig,
                      "%s: %d MIG devices in the CDI spec, wanted %d" % (node, len(got), n_mig))
                check_cdi_nodes_exist(d, "%s right after wait-ready" % node)
                caps = os.listdir(os.path.join(d.node.dev, "nvidia-caps"))
                check(len(caps) == 2 + 2 * n_mig, "%s: nvidia-caps holds %d nodes, wanted config, monitor and two "
                      "per MIG device (%d): %s" % (node, len(caps), 2 + 2 * n_mig, sorted(caps)))
                d.stop_clean()
            finally:
                d.close()


def test_mig_cap_nodes_for_instances_made_elsewhere():
    """Instances made behind the agent's back (nvidia-smi mig -cgi … -C, a boot script) with mig.selected
    unset get their capability nodes at the next pass (Reconcile), with modes and owner as nvidia-modprobe
    gives them; a node removed by hand comes back; a symlink planted where a node goes is replaced, never
    followed."""
    with TempDir() as tmp:
        d = Daemon(tmp, "a100-sxm-mig", dropin=MIXED)
        try:
            check_cdi_nodes_exist(d, "at start")
            desc = nvml_description(d.node)
            # GPU 0 has 3g.20gb@4 and 2x 2g.10gb: no room. Reset GPU 1 (MIG pending → on) and fill it by hand.
            run([FAKE_NVML_CTL, "reset", desc["gpus"][1]["pci"]], node=d.node, check_rc=0)
            p = run([FAKE_NVML_CTL, "create", "1", "3g.20gb,1g.5gb,1g.5gb"], node=d.node, check_rc=0)
            check("Successfully created GPU instance" in p.stdout, p.stdout)
            minor1 = desc["gpus"][1]["minor"]
            gi_ids = sorted(gi for gi, _, _, _ in fake_show(d.node)[1])
            check(len(gi_ids) == 3, "fake-nvml-ctl create made %r" % gi_ids)
            # A symlink where one of the new nodes goes must be replaced, not followed.
            victim = os.path.join(tmp, "victim")
            with open(victim, "w") as f:
                f.write("keep")
            planted = mig_caps(minor1, gi_ids[0], 0)[0]
            os.symlink(victim, os.path.join(d.node.dev, planted[len("/dev/"):]))

            d.reconcile()
            got = check_cdi_layout(d, "after instances were made on GPU 1 behind the agent's back")
            check(all("1:%d" % j in got for j in range(3)), "CDI spec lacks 1:0..1:2: %r" % sorted(got))
            check_cdi_nodes_exist(d, "after instances were made behind the agent's back")
            with open(victim) as f:
                check(f.read() == "keep", "the symlink's target was written through")
            check(stat.S_ISREG(os.lstat(victim).st_mode), "the symlink's target was replaced")
            for gi in gi_ids:
                for path in mig_caps(minor1, gi, 0):
                    st = os.lstat(os.path.join(d.node.dev, path[len("/dev/"):]))
                    check(stat.S_ISCHR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o444 and st.st_uid == 0,
                          "%s: mode %o uid %d, wanted a character device 0444 root (nvidia-modprobe's)"
                          % (path, stat.S_IMODE(st.st_mode), st.st_uid))

            # A node removed by hand is made again by the next pass.
            os.unlink(os.path.join(d.node.dev, planted[len("/dev/"):]))
            d.reconcile()
            check_cdi_nodes_exist(d, "after a capability node was removed by hand")

            # nvidia-caps itself turned into a symlink: a new instance's nodes are not made through it.
            caps = os.path.join(d.node.dev, "nvidia-caps")
            elsewhere = os.path.join(tmp, "elsewhere")
            os.makedirs(elsewhere)
            os.rename(caps, caps + ".moved")
            os.symlink(elsewhere, caps)
            run([FAKE_NVML_CTL, "create", "1", "1g.5gb"], node=d.node, check_rc=0)
            d.reconcile()
            check(os.listdir(elsewhere) == [], "nodes made through the nvidia-caps symlink: %r" % os.listdir(elsewhere))
            state, message = d.stage("devices")
            check(state == "failed" and caps in message, "devices stage with nvidia-caps a symlink: %s %r"
                  % (state, message))
            d.stop_clean()
        finally:
            d.close()


def trace_calls(path):
    """The fake NVML's call trace (FAKE_NVML_TRACE): one '<symbol> <return code>' line per call."""
    try:
        with open(path) as f:
            return [line.split()[0] for line in f if line.strip()]
    except FileNotFoundError:
        return []


# What never changes while NVML stays up: the versions, every GPU's identity and size, a model's MIG
# profile table. A Reconcile pass must not ask for any of it again.
STATIC_NVML_CALLS = {
    "nvmlInit_v2", "nvmlInit", "nvmlSystemGetDriverVersion", "nvmlSystemGetNVMLVersion",
    "nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion", "nvmlDeviceGetHandleByPciBusId_v2",
    "nvmlDeviceGetName", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetCudaComputeCapability", "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetGpuInstanceProfileInfoV", "nvmlDeviceGetGpuInstanceProfileInfo",
    "nvmlGpuInstanceGetComputeInstanceProfileInfoV", "nvmlGpuInstanceGetComputeInstanceProfileInfo",
}


def test_reconcile_rereads_no_static_facts():
    with TempDir() as tmp:
        trace = os.path.join(tmp, "nvml.trace")
        # Health off: its event worker is a process of its own whose one nvmlInit and handle look-ups
        # (tests/integration/test-health.py) would land in either count, depending on when it starts.
        d = Daemon(tmp, "a100-sxm-mig", dropin=MIXED + "health:\n  enabled: false\n", env={"FAKE_NVML_TRACE": trace})
        try:
            first = trace_calls(trace)
            check(first, "no NVML call traced in the first pass (FAKE_NVML_TRACE=%s)" % trace)
            d.reconcile()
            again = trace_calls(trace)[len(first):]
            check(again, "the Reconcile pass made no NVML call: it cannot have seen MIG changes")
            repeated = sorted(set(again) & STATIC_NVML_CALLS)
            check(not repeated, "the Reconcile pass asked NVML again for static facts: %s" % repeated)
            check(len(again) < len(first), "the Reconcile pass made %d NVML calls, the first %d"
                  % (len(again), len(first)))
            d.stop_clean()
        finally:
            d.close()


# --- 5. garbage from NVML ---

def test_garbage_one_gpu():
    with TempDir() as tmp:
        d = Daemon(tmp, "dgx-h100", env={"FAKE_NVML_GARBAGE": "0:name,0:memory,0:cc"})
        try:
            check(d.agent.proc.poll() is None, "agent died on garbage from NVML")
            d.expect("State", 's "ready"', why="garbage from one GPU")
            labels = read_labels(d.node)
            # The seven good GPUs still give the model's facts.
            for key, value in (("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"), ("nvidia.com/gpu.memory", "81559"),
                               ("nvidia.com/gpu.compute.major", "9"), ("nvidia.com/gpu.family", "hopper")):
                check(labels.get(key) == value, "%s=%r with garbage on GPU 0 only" % (key, labels.get(key)))
            out = d.agent.output()
            check(re.search(r"NVML reported no name for GPU 0000:1b:00\.0", out),
                  "no warning naming GPU 0000:1b:00.0's missing name:\n" + out)
            d.expect("MemoryMiB", "t 0", gpu_path(0), GPU, why="zero memory from NVML")
            d.expect("ComputeCapability", 's ""', gpu_path(0), GPU, why="CC 0.0 from NVML")
            d.ctl("gpus")
            d.stop_clean()
        finally:
            d.close()


def test_garbage_labels_omitted():
    with TempDir() as tmp:
        d = Daemon(tmp, "h200", env={"FAKE_NVML_GARBAGE": "0:name,0:memory,0:cc"})
        try:
            check(d.agent.proc.poll() is None, "agent died on garbage from NVML")
            labels = read_labels(d.node)
            for key in ("nvidia.com/gpu.memory", "nvidia.com/gpu.family", "nvidia.com/gpu.compute.major",
                        "nvidia.com/gpu.compute.minor"):
                check(key not in labels, "%s=%r written from garbage (zero memory, CC 0)" % (key, labels.get(key)))
            check(labels.get("nvidia.com/gpu.count") == "1" and labels.get("nvidia.com/gpu.product"),
                  "the unaffected labels are missing: %r" % labels)
            out = d.agent.output()
            for what in ("no memory size for GPU 0000:4c:00.0", "no compute capability for GPU 0000:4c:00.0",
                         "no name for GPU 0000:4c:00.0"):
                check(what in out, "no warning '%s' in the log:\n%s" % (what, out))
            d.stop_clean()
        finally:
            d.close()


TESTS = [
    test_full_labels_and_cdi_spec,
    test_nvml_appears_later,
    test_nvml_driver_not_loaded,
    test_product_kept_while_nvml_down,
    test_vgpu_guest_labels,
    test_dbus_nvml_properties,
    test_dbus_nvml_unavailable,
    test_mig_mode_unsupported,
    test_mig_mixed_labels,
    test_mig_single_invalid,
    test_mig_dbus_and_gpunodectl,
    test_mig_cdi_spec,
    test_cdi_device_name_strategy,
    test_mig_cap_nodes_at_ready,
    test_mig_cap_nodes_for_instances_made_elsewhere,
    test_mig_layout_change_followed,
    test_reconcile_rereads_no_static_facts,
    test_garbage_one_gpu,
    test_garbage_labels_omitted,
]


def main():
    if os.geteuid() == 0:
        if not os.path.exists(FAKE_NVML_CTL):
            print("1..0 # SKIP %s not built" % FAKE_NVML_CTL)
            return 0
    return tap_main(TESTS, sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
