#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""The consumers stage end to end, with the real daemon (--oneshot) on simulated nodes:
  - Slurm: the gres.conf lines it writes are parsed by the real slurmd (Debian's slurmd package) with
    `slurmd -G` on a minimal slurm.conf in a temporary directory (never the host's /etc/slurm), for a
    full-GPU node (DGX H100) and a MIG node (HGX A100 with a mixed layout); the test skips, saying why,
    when slurmd is not installed;
  - the GPU Operator's driver-ready file: written with the validator's content when the driver is up,
    removed when NVML breaks;
  - IMEX: on a GB200-like node whose GPUs are in a fabric clique, the channel nodes and the
    nvidia.com/imex-channel CDI spec; nothing of it on a node without a clique; and, with the daemon on
    a private bus with tests/fake-systemd, nvidia-imex.service started once (not installed, failing,
    fabric.imex: off).
Expected values come from the node descriptions (nvml.yaml, sysfs, mig-minors as mknode.py wrote them)
and the fake NVML's own account of its MIG layout, never from the code under test. TAP output;
GNA_WRAPPER (e.g. valgrind) wraps the daemon."""
import os
import importlib.util
import re
import shutil
import socket
import stat
import subprocess
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import AGENT, FAKE_NVML, WRAPPER, Fail, Node, Skip, TempDir, check, run, tap_main  # noqa: E402

from harness import timeout_scale  # noqa: E402
SCALE = timeout_scale()
FAKE_NVML_CTL = os.path.join(os.path.dirname(FAKE_NVML), "fake-nvml-ctl")
# GNA_SLURMD names another slurmd (or a missing one, to see the skip).
SLURMD = os.environ.get("GNA_SLURMD") or shutil.which("slurmd") or "/usr/sbin/slurmd"


_devfab = None


def devfab():
    """test-devfab.py's environment (private bus with the fake systemd, notify listener, the daemon)."""
    global _devfab
    if _devfab is None:
        spec = importlib.util.spec_from_file_location(
            "gna_test_devfab", os.path.join(os.path.dirname(os.path.abspath(__file__)), "test-devfab.py"))
        _devfab = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(_devfab)
    return _devfab


def oneshot(node, rc=0):
    p = run(WRAPPER + [AGENT, "--oneshot"] + node.args(), node=node, timeout=int(120 * SCALE))
    out = p.stdout + p.stderr
    check(p.returncode == rc, "--oneshot exited %d, wanted %d:\n%s" % (p.returncode, rc, out))
    return out


def read(path):
    with open(path) as f:
        return f.read()


def nvml_gpus(node):
    with open(os.path.join(node.node, "nvml.yaml")) as f:
        return yaml.safe_load(f)["gpus"]


def slurm_type(name):
    """NVML's name as Slurm's AutoDetect=nvml types GPUs: lower case, blanks as '_'."""
    return re.sub(r"\s", "_", name.lower())


def local_cpus(node, pci):
    # The fixture has no CPU topology files, so every local CPU counts as a core.
    return read(os.path.join(node.node, "sys/bus/pci/devices", pci, "local_cpulist")).strip()


def links(gpus, i):
    """Slurm's Links= of GPU i from the description's NVLink ends: -1 itself, else its links to each GPU
    (links to NVSwitches count for none); "" when the GPU has no NVLink (no \"nvlink\" key)."""
    if "nvlink" not in gpus[i]:
        return ""
    return " Links=" + ",".join("-1" if j == i else str(gpus[i]["nvlink"].count(g["pci"])) for j, g in enumerate(gpus))


def mig_minor(node, name):
    for line in read(os.path.join(node.node, "proc/driver/nvidia-caps/mig-minors")).splitlines():
        k, v = line.split()
        if k == name:
            return int(v)
    raise Fail("%s not in mig-minors" % name)


def fake_mig_devices(node):
    """{gpu index: [(gi, ci, profile)]} from `fake-nvml-ctl show`."""
    p = run([FAKE_NVML_CTL, "show"], node=node, check_rc=0)
    gpus, cur, gi = {}, None, None
    for line in p.stdout.splitlines():
        m = re.match(r"^GPU (\d+) ", line)
        if m:
            cur = gpus.setdefault(int(m.group(1)), [])
            continue
        m = re.match(r"^  GI (\d+) profile \d+ \((\S+)\)", line)
        if m:
            gi = int(m.group(1))
            continue
        m = re.match(r"^    CI (\d+) profile \d+ \((\S+)\)", line)
        if m:
            cur.append((gi, int(m.group(1)), m.group(2)))
    return gpus


def gres_node(tmp, name):
    node = Node(tmp, name, "gres:\n  slurm:\n    enabled: true\n    file: %s/slurm/gres-gna.conf\n" % tmp)
    return node, os.path.join(tmp, "slurm/gres-gna.conf")


def slurmd_gres(tmp, gres_file, types):
    """Runs `slurmd -G` on a slurm.conf of its own that includes our file; returns [(type, files)]."""
    if not os.path.exists(SLURMD):
        raise Skip("the gres.conf lines were checked, but slurmd is not installed (Debian package slurmd), so "
                   "slurmd -G did not parse them")
    conf_dir = os.path.join(tmp, "slurm-conf")
    os.makedirs(os.path.join(conf_dir, "spool"), exist_ok=True)
    host = socket.gethostname().split(".")[0]
    counts = {}
    for t in types:
        counts[t] = counts.get(t, 0) + 1
    gres = ",".join("gpu:%s:%d" % (t, n) for t, n in sorted(counts.items()))
    with open(os.path.join(conf_dir, "slurm.conf"), "w") as f:
        f.write("ClusterName=gna-test\nSlurmctldHost=localhost\nSlurmdSpoolDir=%s/spool\n"
                "StateSaveLocation=%s/spool\nSlurmdPidFile=%s/slurmd.pid\nSlurmdLogFile=%s/slurmd.log\n"
                "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nGresTypes=gpu\n"
                "NodeName=%s Gres=%s State=UNKNOWN\nPartitionName=test Nodes=%s Default=YES\n"
                % (conf_dir, conf_dir, conf_dir, conf_dir, host, gres, host))
    with open(os.path.join(conf_dir, "gres.conf"), "w") as f:
        f.write("AutoDetect=off\nInclude %s\n" % gres_file)
    p = subprocess.run([SLURMD, "-f", os.path.join(conf_dir, "slurm.conf"), "-G"], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, SLURM_CONF=os.path.join(conf_dir, "slurm.conf")))
    out = p.stdout + p.stderr
    check(p.returncode == 0, "slurmd -G exited %d:\n%s" % (p.returncode, out))
    # slurmd 22.05: "slurmd: Gres Name=gpu Type=<t> Count=1 Index=<n> ID=… File=<f>[,<f>…] …"
    got = re.findall(r"Gres Name=gpu Type=(\S+) Count=1 Index=\d+ ID=\d+ File=(\S+)", out)
    check("fatal" not in out, "slurmd -G failed:\n" + out)
    return got, out


def slurmd_links(out):
    """The Links= slurmd -G reports per GPU, in its order."""
    return re.findall(r"Gres Name=gpu .*? Links=(\S+)", out)


def test_slurm_full_gpus():
    with TempDir() as tmp:
        node, gres_file = gres_node(tmp, "dgx-h100")
        out = oneshot(node)
        check("Slurm: wrote 8 GRES lines to %s." % gres_file in out, "no word of the gres file:\n" + out)
        text = read(gres_file)
        gpus = nvml_gpus(node)
        want = ["Name=gpu Type=%s File=%s/nvidia%d Cores=%s%s" % (slurm_type(g["model"]), node.dev, g["minor"],
                                                                 local_cpus(node, g["pci"]), links(gpus, i))
                for i, g in enumerate(gpus)]
        lines = [l for l in text.splitlines() if not l.startswith("#")]
        check(lines == want, "gres lines:\n%s\nwanted:\n%s" % ("\n".join(lines), "\n".join(want)))
        check(len(lines) == 8, "not 8 GPUs")
        # Every GPU's 18 links end at an NVSwitch: known topology, no direct peer (as Slurm writes it).
        check(all(l.endswith(" Links=" + ",".join("-1" if j == i else "0" for j in range(8)))
                  for i, l in enumerate(lines)), "DGX H100 Links=:\n" + "\n".join(lines))
        mtime = os.stat(gres_file).st_mtime_ns
        out = oneshot(node)
        check("Slurm: 8 GRES lines unchanged in %s" % gres_file in out, "second pass:\n" + out)
        # NVML down (the library is gone) does not take the GPUs from Slurm.
        with open(os.path.join(node.confd, "60-nonvml.yaml"), "w") as f:
            f.write("nvml:\n  library: /nonexistent/libnvidia-ml.so.1\n")
        out = oneshot(node, rc=1)
        check(read(gres_file) == text and os.stat(gres_file).st_mtime_ns == mtime, "gres file changed with NVML down")
        check("Slurm: NVML is unavailable; %s left as it is" % gres_file in out, out)
        os.unlink(os.path.join(node.confd, "60-nonvml.yaml"))
        check(os.stat(gres_file).st_mtime_ns == mtime, "gres file rewritten without a change")

        got, out = slurmd_gres(tmp, gres_file, [slurm_type(g["model"]) for g in gpus])
        check(got == [(slurm_type(g["model"]), "%s/nvidia%d" % (node.dev, g["minor"])) for g in gpus],
              "slurmd -G reported %r:\n%s" % (got, out))
        check("not a valid character or block device" not in out, "device nodes missing for slurmd:\n" + out)
        check(slurmd_links(out) == [l.split(" Links=")[1] for l in lines], "slurmd -G Links:\n" + out)


def test_slurm_links():
    """Links= follows what NVML says: the A100 PCIe pair reports NVLinks, none up (-1,0 / 0,-1); the
    T4 node's GPUs have no NVLink at all (no Links=)."""
    with TempDir() as tmp:
        node, gres_file = gres_node(tmp, "a100-pcie")
        oneshot(node)
        gpus = nvml_gpus(node)
        lines = [l for l in read(gres_file).splitlines() if not l.startswith("#")]
        check([l.rsplit(" ", 1)[1] for l in lines] == ["Links=-1,0", "Links=0,-1"],
              "A100 PCIe gres lines:\n" + "\n".join(lines))
        got, out = slurmd_gres(tmp, gres_file, [slurm_type(g["model"]) for g in gpus])
        check(len(got) == 2 and slurmd_links(out) == ["-1,0", "0,-1"], "slurmd -G on the A100 PCIe pair:\n" + out)
    with TempDir() as tmp:
        node, gres_file = gres_node(tmp, "t4")
        oneshot(node)
        lines = [l for l in read(gres_file).splitlines() if not l.startswith("#")]
        check(lines and not any("Links=" in l for l in lines), "T4 gres lines:\n" + "\n".join(lines))


def test_slurm_no_gpu():
    with TempDir() as tmp:
        node, gres_file = gres_node(tmp, "no-gpu")
        os.makedirs(os.path.dirname(gres_file))
        with open(gres_file, "w") as f:
            f.write("Name=gpu Type=stale File=/dev/nvidia0\n")
        out = oneshot(node)
        text = read(gres_file)
        check("Name=gpu" not in text and text.startswith("# Slurm GRES of this node"), "no-GPU gres file: %r" % text)
        check("Slurm: 0 GRES lines written to %s" % gres_file in out, out)


def test_slurm_mig():
    with TempDir() as tmp:
        node, gres_file = gres_node(tmp, "a100-sxm-mig")
        oneshot(node)
        lines = [l for l in read(gres_file).splitlines() if not l.startswith("#")]
        gpus = nvml_gpus(node)
        mig = fake_mig_devices(node)
        want, types = [], []
        for i, g in enumerate(gpus):
            t = slurm_type(g["model"])
            cores = local_cpus(node, g["pci"])
            if g.get("mig") == "enabled":
                for gi, ci, profile in mig[i]:
                    files = "%s/nvidia%d,%s/nvidia-caps/nvidia-cap%d,%s/nvidia-caps/nvidia-cap%d" % (
                        node.dev, g["minor"], node.dev, mig_minor(node, "gpu%d/gi%d/access" % (g["minor"], gi)),
                        node.dev, mig_minor(node, "gpu%d/gi%d/ci%d/access" % (g["minor"], gi, ci)))
                    want.append("Name=gpu Type=%s_%s MultipleFiles=%s Cores=%s" % (t, profile, files, cores))
                    types.append((t + "_" + profile, files))
            else:
                want.append("Name=gpu Type=%s File=%s/nvidia%d Cores=%s" % (t, node.dev, g["minor"], cores))
                types.append((t, "%s/nvidia%d" % (node.dev, g["minor"])))
        check(sum(1 for w in want if "MultipleFiles" in w) == 3, "fixture no longer has 3 MIG devices")
        check(sorted(lines) == sorted(want), "gres lines:\n%s\nwanted:\n%s" % ("\n".join(lines), "\n".join(want)))

        # slurmd stats every file: the capability nodes must exist after the very first pass, though the
        # devices stage ran before NVML named the MIG devices.
        for _, files in types:
            for f in files.split(","):
                check(stat.S_ISCHR(os.stat(f).st_mode), "%s is not a character device after one pass" % f)
        got, out = slurmd_gres(tmp, gres_file, [t for t, _ in types])
        check(sorted(got) == sorted(types), "slurmd -G reported %r, wanted %r:\n%s" % (got, types, out))
        check("not a valid character or block device" not in out, "device nodes missing for slurmd:\n" + out)


def test_operator_driver_ready():
    with TempDir() as tmp:
        vdir = os.path.join(tmp, "run/nvidia/validations")
        node = Node(tmp, "h200", "validations:\n  operator-compat: true\n  directory: %s\n" % vdir)
        out = oneshot(node)
        check("GPU Operator: wrote %s/driver-ready." % vdir in out, out)
        ready = os.path.join(vdir, "driver-ready")
        check(read(ready) == "IS_HOST_DRIVER=true\nNVIDIA_DRIVER_ROOT=/\nDRIVER_ROOT_CTR_PATH=/host\n"
                             "NVIDIA_DEV_ROOT=/\nDEV_ROOT_CTR_PATH=/host\n", "driver-ready: %r" % read(ready))
        for other in ("toolkit-ready", "cuda-ready", "plugin-ready"):
            check(not os.path.exists(os.path.join(vdir, other)), other + " written")
        # Package removal (--cleanup) takes it back: nothing verifies the driver any more.
        run(WRAPPER + [AGENT, "--cleanup"] + node.args(), node=node, check_rc=0, timeout=int(60 * SCALE))
        check(not os.path.exists(ready), "driver-ready left by --cleanup")
        oneshot(node)
        check(os.path.exists(ready), "driver-ready not written again")
        # NVML breaks (the library is gone): the layer is no longer verified, the file goes.
        with open(os.path.join(node.confd, "60-nonvml.yaml"), "w") as f:
            f.write("nvml:\n  library: /nonexistent/libnvidia-ml.so.1\n")
        out = oneshot(node, rc=1)
        check(not os.path.exists(ready), "driver-ready still there with NVML down")
        check("GPU Operator: removed %s/driver-ready." % vdir in out and
              "GPU Operator: driver-ready absent, the driver is not verified" in out, out)


def test_imex_clique():
    with TempDir() as tmp:
        node = Node(tmp, "gb200-nvl")
        out = oneshot(node)
        ch = os.path.join(node.dev, "nvidia-caps-imex-channels/channel0")
        st = os.lstat(ch)
        check(stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) == 238 and os.minor(st.st_rdev) == 0,
              "channel0: %r" % (st,))
        check(stat.S_IMODE(st.st_mode) == 0o666, "channel0 mode %o" % stat.S_IMODE(st.st_mode))
        check(not os.path.exists(os.path.join(node.dev, "nvidia-caps-imex-channels/channel1")), "channel1 made")
        spec = yaml.safe_load(read(os.path.join(node.run, "cdi/nvidia-imex-channel.yaml")))
        check(spec["kind"] == "nvidia.com/imex-channel" and spec["cdiVersion"] == "0.5.0", "spec: %r" % spec)
        check(spec["devices"] == [{"name": "0", "containerEdits": {"deviceNodes": [
            {"path": "/dev/nvidia-caps-imex-channels/channel0"}]}}], "devices: %r" % spec["devices"])

        # More channels on request.
        with open(os.path.join(node.confd, "60-imex.yaml"), "w") as f:
            f.write("fabric:\n  imex-channels: 4\n")
        oneshot(node)
        spec = yaml.safe_load(read(os.path.join(node.run, "cdi/nvidia-imex-channel.yaml")))
        check([d["name"] for d in spec["devices"]] == ["0", "1", "2", "3"], "devices: %r" % spec["devices"])

        # A bad count is named with the fix.
        with open(os.path.join(node.confd, "60-imex.yaml"), "w") as f:
            f.write("fabric:\n  imex-channels: 5000\n")
        out = oneshot(node, rc=1)
        check("fabric.imex-channels is 5000; set it to 1..2048" in out, out)

        spec_path = os.path.join(node.run, "cdi/nvidia-imex-channel.yaml")
        run(WRAPPER + [AGENT, "--cleanup"] + node.args(), node=node, check_rc=0, timeout=int(60 * SCALE))
        check(not os.path.exists(spec_path), "IMEX spec left by --cleanup")


def test_imex_no_clique():
    with TempDir() as tmp:
        node = Node(tmp, "dgx-h100")
        oneshot(node)
        check(not os.path.exists(os.path.join(node.dev, "nvidia-caps-imex-channels")), "IMEX channels without a clique")
        check(not os.path.exists(os.path.join(node.run, "cdi/nvidia-imex-channel.yaml")), "IMEX spec without a clique")


IMEX = "nvidia-imex.service"
PD = "nvidia-persistenced.service"


def test_imex_service_started_in_a_clique():
    with TempDir() as tmp:
        e = devfab().Env(tmp, "gb200-nvl", devfab().QUIET_DRIVER, units={PD: "ok", IMEX: "ok"})
        try:
            s = e.stage("consumers")
            check(s["state"] == "done", "consumers: %r" % s)
            for what in ("IMEX: 4 GPUs in clique 5c1e7c2a-90d1-4e61-8d5f-0f3b2a1c4d5e.3, 1 channel",
                         IMEX + " started"):
                check(what in s["message"], "consumers message lacks %r: %s" % (what, s["message"]))
            check(len(e.systemd.starts(IMEX)) == 1, "calls: %r" % e.systemd.calls())
            # Running: not started again.
            s = e.reconcile_and_wait("consumers")
            check(s["state"] == "done" and IMEX + " is running" in s["message"], "second pass: %r" % s)
            check(len(e.systemd.starts(IMEX)) == 1, "started again: %r" % e.systemd.calls())
        finally:
            e.close()


def test_imex_service_missing_failing_or_off():
    with TempDir() as tmp:
        e = devfab().Env(tmp, "gb200-nvl", devfab().QUIET_DRIVER, units={PD: "ok"})
        try:
            s = e.stage("consumers")
            check(s["state"] == "done" and IMEX + " is not installed; not started" in s["message"], "%r" % s)
            check(not e.systemd.starts(IMEX), "calls: %r" % e.systemd.calls())
        finally:
            e.close()
    with TempDir() as tmp:
        e = devfab().Env(tmp, "gb200-nvl", devfab().QUIET_DRIVER + "engine:\n  retry-min: 1h\n  retry-max: 1h\n",
                units={PD: "ok", IMEX: "fail"})
        try:
            s = e.stage("consumers")
            check(s["state"] == "failed" and IMEX in s["message"], "a failing nvidia-imex: %r" % s)
        finally:
            e.close()
    with TempDir() as tmp:
        e = devfab().Env(tmp, "gb200-nvl", devfab().QUIET_DRIVER + "fabric:\n  imex: off\n",
                         units={PD: "ok", IMEX: "ok"})
        try:
            check(e.stage("consumers")["state"] == "skipped", "fabric.imex: off: %r" % e.stage("consumers"))
            check(not e.systemd.starts(IMEX), "started with fabric.imex: off: %r" % e.systemd.calls())
            check(not os.path.exists(os.path.join(e.node.dev, "nvidia-caps-imex-channels")), "channels made when off")
        finally:
            e.close()



def test_config_keys():
    """The new keys' defaults in --check-config, and bad values named with file, line and the fix."""
    with TempDir() as tmp:
        conf = os.path.join(tmp, "agent.yaml")
        none = os.path.join(tmp, "conf.d")

        def check_config(text, rc):
            with open(conf, "w") as f:
                f.write(text)
            p = run([AGENT, "--check-config", "--config", conf, "--config-dir", none])
            check(p.returncode == rc, "--check-config exited %d:\n%s%s" % (p.returncode, p.stdout, p.stderr))
            return p.stdout + p.stderr

        out = check_config("", 0)
        for want in ("\ngres:\n  slurm:\n    enabled: false\n    file: /etc/slurm/gres-gpu-node-agent.conf\n",
                     "\nvalidations:\n  operator-compat: false\n  directory: /run/nvidia/validations\n",
                     "  imex: auto\n  imex-channels: 1\n", "  imex-spec: /run/cdi/nvidia-imex-channel.yaml\n"):
            check(want in out, "defaults lack %r:\n%s" % (want, out))
        out = check_config("fabric:\n  imex: maybe\n", 1)
        check("%s:2:9: fabric.imex: expected one of off, auto, got 'maybe'" % conf in out, out)
        out = check_config("gres:\n  slurm:\n    file: gres.conf\n", 1)
        check("%s:3:11: gres.slurm.file: 'gres.conf' is not an absolute path; write it starting with '/'" % conf in out,
              out)
        out = check_config("validations:\n  operator-compat: perhaps\n", 1)
        check("validations.operator-compat: expected a boolean (true/false), got 'perhaps'" in out, out)


if __name__ == "__main__":
    sys.exit(tap_main([test_slurm_full_gpus, test_slurm_links, test_slurm_no_gpu, test_slurm_mig, test_operator_driver_ready, test_imex_clique,
                       test_imex_no_clique, test_imex_service_started_in_a_clique,
                       test_imex_service_missing_failing_or_off, test_config_keys], sys.argv[1:]))
