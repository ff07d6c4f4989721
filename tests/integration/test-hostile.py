#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Integration tests: hostile files in the directories the agent shares with other software. Each test
plants symlinks, FIFOs, device nodes or deep/recursive files, runs the real daemon (or --oneshot,
--check-config) against a simulated node, and checks that nothing outside the agent's own files changed
and that the daemon keeps answering on the bus. TAP output; needs root (mknod, the bus policy)."""
import hashlib
import os
import re
import signal
import stat
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (AGENT, NODES, Agent, Bus, Fail, Node, Notify, TempDir, busctl, check,  # noqa: E402
                     get_property, run, tap_main)

from harness import timeout_scale  # noqa: E402
SCALE = timeout_scale()
WRAP = os.environ.get("GNA_WRAPPER", "").split()
AGENT_NAME = "org.gpunodeagent.Agent1"
MANAGER = "org.gpunodeagent.Agent1.Manager"
PATH = "/org/gpunodeagent/Agent1"


def snapshot(top):
    """Every entry under top (not following links): type, mode, link target or content hash."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                what = "link " + os.readlink(p)
            elif stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    what = "file " + hashlib.sha256(f.read()).hexdigest()
            else:
                what = "mode %o rdev %d" % (st.st_mode, st.st_rdev)
            out[os.path.relpath(p, top)] = (what, st.st_mode, st.st_uid)
    return out


def victim(tmp, name):
    """A directory of someone else's files that must come through untouched."""
    d = os.path.join(tmp, name)
    os.makedirs(os.path.join(d, "sub"))
    for f, text in (("precious", "keep me\n"), ("sub/also", "and me\n")):
        with open(os.path.join(d, f), "w") as fh:
            fh.write(text)
    return d


def deep_yaml(levels=50000):
    return "[" * levels + "]" * levels + "\n"


def laughs_yaml():
    lines = ["cdiVersion: 0.5.0", "kind: example.com/lol", "a0: &a0 [lol]"]
    for i in range(1, 12):
        lines.append("a%d: &a%d [%s]" % (i, i, ", ".join(["*a%d" % (i - 1)] * 10)))
    return "\n".join(lines) + "\n"


class Daemon:
    def __init__(self, tmp, node, extra_yaml="", nvml_description=None):
        self.bus = Bus(tmp)
        self.notify = Notify(tmp)
        self.node = Node(tmp, node, extra_yaml)
        if nvml_description:
            self.node.nvml_env["FAKE_NVML_DESCRIPTION"] = nvml_description
        self.agent = Agent(self.node, self.bus, self.notify)
        try:
            self.notify.wait_for("READY=1", 60 * SCALE)
        except Fail:
            self.close()
            raise Fail("no READY=1; agent output:\n" + self.agent.output())

    def answers(self):
        check(self.agent.proc.poll() is None, "the agent died:\n" + self.agent.output())
        check(get_property(self.bus, "GpuCount").startswith("u "), "no answer on the bus")

    def stages(self):
        return get_property(self.bus, "Stages")

    def stop_clean(self):
        """SIGTERM, and a clean exit (under valgrind: no errors, no definite leaks)."""
        rc = self.agent.stop(signal.SIGTERM, timeout=int(60 * SCALE))
        check(rc == 0, "agent exited %d on SIGTERM (valgrind errors are 99):\n%s" % (rc, self.agent.output()[-3000:]))

    def close(self):
        if self.agent.proc.poll() is None:
            self.agent.proc.kill()
            self.agent.proc.wait()
        self.notify.close()
        self.bus.stop()


def test_features_hidden_dir_symlink_no_gpu():
    """features.d/.gpu-node-agent -> another directory, on a node without GPUs (where the agent removes
    its feature file): nothing in that directory is deleted, on the first pass or on a retry."""
    with TempDir() as tmp:
        v = victim(tmp, "victim")
        before = snapshot(v)
        features = os.path.join(tmp, "features.d")
        os.makedirs(features)
        os.symlink(v, os.path.join(features, ".gpu-node-agent"))
        d = Daemon(tmp, "no-gpu")
        try:
            d.answers()
            stages = d.stages()
            check("is not a directory gpu-node-agent created (a symbolic link)" in stages, "labels stage: " + stages)
            busctl(d.bus, "call", AGENT_NAME, PATH, MANAGER, "Reconcile")
            time.sleep(1 * SCALE)
            d.answers()
            check(snapshot(v) == before, "the directory behind the symlink changed")
            check(os.path.islink(os.path.join(features, ".gpu-node-agent")), "the planted link was removed")
            d.stop_clean()
        finally:
            d.close()


def test_features_hidden_dir_symlink_write():
    """The same planted link on a GPU node: the labels stage refuses with the path, writes nothing
    through it, and the daemon keeps answering."""
    with TempDir() as tmp:
        v = victim(tmp, "victim")
        before = snapshot(v)
        features = os.path.join(tmp, "features.d")
        os.makedirs(features)
        os.symlink(v, os.path.join(features, ".gpu-node-agent"))
        d = Daemon(tmp, "h200")
        try:
            d.answers()
            stages = d.stages()
            check("Refusing to use %s/.gpu-node-agent" % features in stages, "labels stage: " + stages)
            check(snapshot(v) == before, "the directory behind the symlink changed")
            check(not os.path.exists(os.path.join(features, "gpu-node-agent")), "feature file written anyway")
            d.stop_clean()
        finally:
            d.close()


def test_dev_symlinks_and_cdi_bombs():
    """/dev/char and /dev/nvidia-caps planted as symlinks, and in the CDI directory a 100 KB file of
    50,000 nesting levels, a billion-laughs file, a FIFO and a device node: no link or node lands in
    the victims, the planted files stay as they were, the CDI spec is written, the daemon answers."""
    with TempDir() as tmp:
        v_char = victim(tmp, "victim-char")
        v_caps = victim(tmp, "victim-caps")
        before_char, before_caps = snapshot(v_char), snapshot(v_caps)
        dev = os.path.join(tmp, "dev")
        os.makedirs(dev)
        os.symlink(v_char, os.path.join(dev, "char"))
        os.symlink(v_caps, os.path.join(dev, "nvidia-caps"))
        cdi = os.path.join(tmp, "run/cdi")
        os.makedirs(cdi)
        with open(os.path.join(cdi, "deep.yaml"), "w") as f:
            f.write(deep_yaml())
        with open(os.path.join(cdi, "laughs.yaml"), "w") as f:
            f.write(laughs_yaml())
        os.mkfifo(os.path.join(cdi, "fifo.yaml"))
        os.mknod(os.path.join(cdi, "null.yaml"), 0o644 | stat.S_IFCHR, os.makedev(1, 3))
        before_cdi = snapshot(cdi)
        d = Daemon(tmp, "dgx-h100")
        try:
            d.answers()
            stages = d.stages()
            check("Refusing to use %s/char: it is a symbolic link" % dev in stages or
                  "Refusing to use %s/nvidia-caps: it is a symbolic link" % dev in stages, "devices stage: " + stages)
            check(snapshot(v_char) == before_char, "links were created through the /dev/char symlink")
            check(snapshot(v_caps) == before_caps, "nodes were created through the /dev/nvidia-caps symlink")
            check(os.path.exists(os.path.join(dev, "nvidiactl")), "the other device nodes were not created")
            now = snapshot(cdi)
            for name, what in before_cdi.items():
                check(now.get(name) == what, "%s in the CDI directory changed" % name)
            check("nvidia.yaml" in now, "no CDI spec written next to the hostile files: " + stages)
            busctl(d.bus, "call", AGENT_NAME, PATH, MANAGER, "Reconcile")
            time.sleep(1 * SCALE)
            d.answers()
            d.stop_clean()
        finally:
            d.close()


def test_oneshot_deep_cdi_file():
    """The file that made --oneshot exit 139 (stack overflow in the CDI reader)."""
    with TempDir() as tmp:
        node = Node(tmp, "h200")
        cdi = os.path.join(node.run, "cdi")
        os.makedirs(cdi, exist_ok=True)
        with open(os.path.join(cdi, "deep.yaml"), "w") as f:
            f.write(deep_yaml())
        start = time.monotonic()
        p = run(WRAP + [AGENT, "--oneshot"] + node.args(), timeout=int(120 * SCALE), node=node)
        check(p.returncode == 0, "--oneshot exited %d:\n%s" % (p.returncode, p.stderr[-3000:]))
        check(time.monotonic() - start < 60 * SCALE, "--oneshot took too long")
        check(os.path.exists(node.cdi_spec), "no CDI spec written")


def test_fifo_and_device_in_confd():
    """A FIFO drop-in: --check-config fails at once naming it (it used to hang); on a running daemon
    Reload fails at once and the old config stays. A link to /dev/zero does not mask a drop-in."""
    with TempDir() as tmp:
        node = Node(tmp, "h200")
        fifo = os.path.join(node.confd, "50-fifo.yaml")
        os.mkfifo(fifo)
        p = run([AGENT, "--check-config"] + node.args(), timeout=int(30 * SCALE), node=node)
        check(p.returncode == 1, "--check-config with a FIFO exited %d" % p.returncode)
        check("%s: not a regular file (a FIFO, socket or device)" % fifo in p.stderr, p.stderr)
        os.unlink(fifo)
        os.symlink("/dev/zero", os.path.join(node.confd, "60-zero.yaml"))
        p = run([AGENT, "--check-config"] + node.args(), timeout=int(30 * SCALE), node=node)
        check(p.returncode == 1 and "60-zero.yaml: not a regular file" in p.stderr, p.stderr)
        os.unlink(os.path.join(node.confd, "60-zero.yaml"))

        d = Daemon(tmp, "h200")
        try:
            os.mkfifo(fifo)
            start = time.monotonic()
            p = busctl(d.bus, "call", AGENT_NAME, PATH, MANAGER, "Reload", check_rc=None)
            check(time.monotonic() - start < 10 * SCALE, "Reload took %.1fs" % (time.monotonic() - start))
            check(p.returncode != 0 and "not a regular file" in p.stderr, "Reload: " + p.stderr)
            d.answers()
            check("not a regular file" in get_property(d.bus, "ConfigError"), "ConfigError not set")
            d.stop_clean()
        finally:
            d.close()


def test_leftover_temp_file_cleaned():
    """A kill between create and rename of the labels temp file left a 0-byte file: the next start
    removes it; a file of another name in the hidden directory stays."""
    with TempDir() as tmp:
        hidden = os.path.join(tmp, "features.d", ".gpu-node-agent")
        os.makedirs(hidden)
        os.chmod(hidden, 0o755)
        open(os.path.join(hidden, "gpu-node-agent.Ab12Cd"), "w").close()
        open(os.path.join(hidden, "README"), "w").close()
        node = Node(tmp, "h200")
        p = run(WRAP + [AGENT, "--oneshot"] + node.args(), timeout=int(120 * SCALE), node=node)
        check(p.returncode == 0, "--oneshot exited %d:\n%s" % (p.returncode, p.stderr[-3000:]))
        check(sorted(os.listdir(hidden)) == ["README"], "hidden dir: %r" % os.listdir(hidden))


def test_empty_mig_journal_is_no_crash():
    """A full disk left an empty mig-journal: the next start removes it instead of moving it aside as
    broken and reporting a crash."""
    with TempDir() as tmp:
        node = Node(tmp, "h200")
        os.makedirs(node.state, exist_ok=True)
        journal = os.path.join(node.state, "mig-journal")
        open(journal, "w").close()
        p = run(WRAP + [AGENT, "--oneshot"] + node.args(), timeout=int(120 * SCALE), node=node)
        check(p.returncode == 0, "--oneshot exited %d:\n%s" % (p.returncode, p.stderr[-3000:]))
        check(not os.path.exists(journal), "the empty journal is still there")
        check(not os.path.exists(journal + ".broken"), "the empty journal was moved aside as broken")
        check("MIG journal" not in p.stderr, "reported: " + p.stderr)


HOSTILE_NAME = 'NVIDIA "A100"\n#nvidia.com/gpu.count=99 x=y\\ ' + "A" * 300
BAD_UTF8_NAME = b"\xff\xfe\n<!>\"#=".hex()  # not UTF-8, and nothing a label value can take


def hostile_description(tmp, node):
    """The node's fake NVML description with a hostile driver's strings: GPU 0 a name with quotes, a
    newline, '#', '=' and a backslash, 300+ bytes long (the fake fills NVML's buffer without a NUL), and a
    UUID with a newline and '#'; GPU 1 a name that is not UTF-8 and would start a forged log line; a
    driver version with a newline."""
    import yaml
    with open(os.path.join(NODES, node, "nvml.yaml")) as f:
        desc = yaml.safe_load(f)
    desc["gpus"][0]["name"] = HOSTILE_NAME
    desc["gpus"][0]["uuid"] = "GPU-0123\n#uuid=evil"
    desc["gpus"][1]["name_hex"] = BAD_UTF8_NAME
    desc["driver_version"] = "550.127.05\n#nvidia.com/x=y"
    path = os.path.join(tmp, "nvml.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(desc, f)
    return path


def _import(name):
    import importlib.util
    spec = importlib.util.spec_from_file_location(name.replace("-", "_"),
                                                  os.path.join(os.path.dirname(os.path.abspath(__file__)), name))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_hostile_nvml_strings():
    """A driver answering hostile names and UUIDs (#21): one daemon run, every output checked. The
    feature file has one valid label per line and no extra label; the CDI spec parses and names no device
    after the bad UUID; gres.conf has one line per GPU, nothing after a '#'; the metrics textfile parses
    (node_exporter's parser, or a strict one) with the name as one label value; the GPU objects answer
    GetAll; no output line of the agent holds a control character or a forged priority."""
    import json
    import yaml
    metrics = _import("test-metrics.py")
    with TempDir() as tmp:
        prom = os.path.join(tmp, "textfile", "gpu-node-agent.prom")
        gres = os.path.join(tmp, "slurm", "gres.conf")
        d = Daemon(tmp, "a100-pcie", "gres:\n  slurm:\n    enabled: true\n    file: %s\nmetrics:\n  textfile: %s\n"
                   % (gres, prom), nvml_description=hostile_description(tmp, "a100-pcie"))
        try:
            d.answers()
            deadline = time.monotonic() + 10 * SCALE
            while not (os.path.exists(prom) and os.path.exists(gres)) and time.monotonic() < deadline:
                time.sleep(0.1)
            check(os.path.exists(prom) and os.path.exists(gres), "no textfile or gres.conf:\n" + d.agent.output())

            # Labels: comments and key=value lines only, every one a valid Kubernetes label.
            label_re = re.compile(r"^nvidia\.com/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?="
                                  r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
            with open(d.node.feature_file(), "rb") as f:
                lines = f.read().decode("ascii").split("\n")
            check(lines[-1] == "", "the feature file does not end with a newline")
            labels = {}
            for line in lines[:-1]:
                if line.startswith("#"):
                    check(line.startswith("# Written by") or line.startswith("# +expiry-time="),
                          "a comment line not ours: %r" % line)
                    continue
                check(label_re.match(line) and len(line.split("=", 1)[1]) <= 63, "not a valid label line: %r" % line)
                k, v = line.split("=", 1)
                check(k not in labels, "label %s twice" % k)
                labels[k] = v
            # GPU 1's name has nothing a label can take: it is labelled with GPU 0's (same PCI ids), which is
            # shortened to 63 characters.
            check(labels.get("nvidia.com/gpu.count") == "2", "gpu.count %r" % labels.get("nvidia.com/gpu.count"))
            check(labels.get("nvidia.com/gpu.product", "").startswith("NVIDIA-A100nvidia.comgpu.count99-xy-AAA"),
                  "gpu.product %r" % labels.get("nvidia.com/gpu.product"))
            check("nvidia.com/uuid" not in labels and not any("evil" in v for v in labels.values()),
                  "the UUID leaked into the labels: %r" % labels)

            # CDI: valid YAML that our checker takes, no device after the refused UUID.
            with open(d.node.cdi_spec) as f:
                spec = yaml.safe_load(f)
            names = sorted(dev["name"] for dev in spec["devices"])
            check(names == ["0", "1", "GPU-0000ca00-0000-4000-8000-20f100000001", "all"], "CDI devices %r" % names)
            for dev in names:
                check(re.match(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$", dev), "bad CDI name %r" % dev)

            # gres.conf: the header comments and one line per GPU, no '#' after the start of a line.
            with open(gres, "rb") as f:
                glines = [l for l in f.read().decode("ascii").split("\n") if l and not l.startswith("#")]
            check(len(glines) == 2, "gres.conf lines %r" % glines)
            for l in glines:
                check("#" not in l and re.match(r"^Name=gpu Type=[^\s=#]+ File=/\S+/nvidia[01] Cores=[0-9,-]+"
                                                r"( Links=[-0-9,]+)?$", l), "bad gres.conf line %r" % l)

            # Metrics: the strict parser (and node_exporter's, when installed); one modelName per GPU.
            with open(prom, "rb") as f:
                text = f.read().decode("utf-8")  # fails on bytes that are not UTF-8
            samples, _ = metrics.parse(text, prom)
            xid = {lab["gpu"]: lab for n, lab, _ in samples if n == "DCGM_FI_DEV_XID_ERRORS"}
            check(sorted(xid) == ["0", "1"], "XID series %r" % xid)
            escaped = HOSTILE_NAME[:95].replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
            check(xid["0"]["modelName"] == escaped, "modelName of GPU 0: %r" % xid["0"]["modelName"])
            check(xid["1"]["modelName"] == '\ufffd\ufffd\\n<!>\\"#=', "modelName of GPU 1: %r" % xid["1"])
            check(xid["0"]["UUID"] == "" and xid["1"]["UUID"] == "GPU-0000ca00-0000-4000-8000-20f100000001",
                  "UUID labels %r" % xid)
            if os.access(metrics.NODE_EXPORTER, os.X_OK):
                exp = metrics.Exporter(tmp, os.path.dirname(prom))
                try:
                    exp.series()  # fails on a textfile error
                finally:
                    exp.close()

            # D-Bus: every GPU object's GetAll answers, the names as sent (U+FFFD for the bad bytes).
            for i in range(2):
                out = busctl(d.bus, "--json=short", "call", AGENT_NAME, "/org/gpunodeagent/Agent1/gpu/%d" % i,
                             "org.freedesktop.DBus.Properties", "GetAll", "s", "org.gpunodeagent.Agent1.Gpu").stdout
                props = json.loads(out)["data"][0]
                check(props["Uuid"]["data"] == ("" if i == 0 else "GPU-0000ca00-0000-4000-8000-20f100000001"),
                      "Uuid of GPU %d: %r" % (i, props["Uuid"]["data"]))
                want = HOSTILE_NAME[:95] if i == 0 else '\ufffd\ufffd\n<!>"#='
                check(props["NvmlName"]["data"] == want, "NvmlName of GPU %d: %r" % (i, props["NvmlName"]["data"]))

            # The log: the refused UUID named by PCI address; no control character, no forged line.
            d.stop_clean()
            out = d.agent.output()
            check("GPU 0000:17:00.0: nvmlDeviceGetUUID answered a UUID that is not" in out, "no UUID warning:\n" + out)
            check("nvmlSystemGetDriverVersion answered a string that is not a version" in out,
                  "no driver version warning:\n" + out)
            check("NVML reported the name '\ufffd\ufffd\\n<!>\"#=' for GPU 0000:ca:00.0" in out,
                  "no warning quoting GPU 1's name:\n" + out)
            for line in out.split("\n"):
                check(not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", line), "a control character in %r" % line)
                check(not line.startswith(("<!>", "#nvidia.com")), "a forged line %r" % line)
        finally:
            d.close()


if __name__ == "__main__":
    sys.exit(tap_main([
        test_features_hidden_dir_symlink_no_gpu,
        test_features_hidden_dir_symlink_write,
        test_dev_symlinks_and_cdi_bombs,
        test_oneshot_deep_cdi_file,
        test_fifo_and_device_in_confd,
        test_leftover_temp_file_cleaned,
        test_empty_mig_journal_is_no_crash,
        test_hostile_nvml_strings,
    ], sys.argv[1:]))
