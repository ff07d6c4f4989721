#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""The metrics textfile (metrics.textfile, issue 11) as Prometheus sees it: the real daemon writes it on a
simulated node, the real prometheus-node-exporter (Debian package) serves it from 127.0.0.1 with only the
textfile collector, and the test scrapes /metrics. Every series of ours must parse (a strict parser of
the text exposition format), the scrape must report no textfile error, DCGM-named series must carry
dcgm-exporter's labels (gpu, UUID, pci_bus_id, device, modelName, Hostname; GPU_I_PROFILE and GPU_I_ID on
MIG series), an injected XID must show in DCGM_FI_DEV_XID_ERRORS and the per-GPU health gauge within 1 s,
and the file is replaced atomically and only when its text changes. TAP output."""
import importlib.util
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Fail, Skip, TempDir, busctl, check, tap_main  # noqa: E402

_spec = importlib.util.spec_from_file_location("test_nvml", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                        "test-nvml.py"))
test_nvml = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(test_nvml)
Daemon, wait_until = test_nvml.Daemon, test_nvml.wait_until

from harness import timeout_scale  # noqa: E402
SCALE = timeout_scale()
NODE_EXPORTER = shutil.which("prometheus-node-exporter") or "/usr/bin/prometheus-node-exporter"
DCGM_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"'
SAMPLE = re.compile(r"^(%s)(?:\{((?:%s)(?:,%s)*)?,?\})? ([-+]?(?:[0-9.]+(?:[eE][-+]?[0-9]+)?|NaN|\+Inf|-Inf))"
                    r"(?: -?[0-9]+)?$" % (NAME, LABEL, LABEL))


def note(fmt, *args):
    print("# " + fmt % args, flush=True)


def parse(text, what):
    """Strictly parses the exposition format: [(name, {labels}, value)]; fails on any line it cannot read,
    a TYPE after a sample of its family, or a family declared twice."""
    out, typed, seen = [], {}, set()
    for n, line in enumerate(text.splitlines(), 1):
        if not line:
            continue
        if line.startswith("# "):
            parts = line.split(None, 3)
            if parts[1] == "TYPE":
                check(len(parts) == 4 and parts[3] in ("gauge", "counter", "untyped", "summary", "histogram"),
                      "%s:%d: bad TYPE line %r" % (what, n, line))
                check(parts[2] not in typed, "%s:%d: family %s declared twice" % (what, n, parts[2]))
                check(parts[2] not in seen, "%s:%d: TYPE of %s after its samples" % (what, n, parts[2]))
                typed[parts[2]] = parts[3]
            continue
        check(not line.startswith("#"), "%s:%d: %r is not a comment" % (what, n, line))
        m = SAMPLE.match(line)
        check(m, "%s:%d: unparseable sample %r" % (what, n, line))
        labels = dict((k, v) for k, v in re.findall(LABEL, m.group(2) or ""))
        out.append((m.group(1), labels, float(m.group(m.lastindex))))
        seen.add(m.group(1))
    return out, typed


class Exporter:
    def __init__(self, tmp, directory):
        if not os.access(NODE_EXPORTER, os.X_OK):
            raise Skip("prometheus-node-exporter is not installed (scripts/deps.sh installs it)")
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        self.log = open(os.path.join(tmp, "node-exporter.log"), "w")
        self.proc = subprocess.Popen([NODE_EXPORTER, "--web.listen-address=127.0.0.1:%d" % self.port,
                                      "--collector.disable-defaults", "--collector.textfile",
                                      "--collector.textfile.directory=" + directory],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        wait_until("node_exporter to listen", self._up, 10)

    def _up(self):
        try:
            self.scrape()
            return True
        except OSError:
            return False

    def scrape(self):
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.port, timeout=5) as r:
            return r.read().decode()

    def series(self):
        text = self.scrape()
        samples, _ = parse(text, "scrape")
        errors = [v for n, _, v in samples if n == "node_textfile_scrape_error"]
        check(errors == [0.0], "node_exporter reports a textfile error %r:\n%s" % (errors, text[-3000:]))
        return samples

    def close(self):
        self.proc.terminate()
        self.proc.wait(10)
        self.log.close()


def ours(samples):
    return [s for s in samples if s[0].startswith(("DCGM_", "gpu_node_agent_"))]


def find(samples, name, **labels):
    return [v for n, lab, v in samples if n == name and all(lab.get(k) == w for k, w in labels.items())]


def test_textfile_scraped_by_node_exporter():
    with TempDir() as tmp:
        prom_dir = os.path.join(tmp, "node-exporter")
        prom = os.path.join(prom_dir, "gpu-node-agent.prom")
        events = os.path.join(tmp, "events")
        open(events, "w").close()
        d = Daemon(tmp, "dgx-h100", dropin="metrics:\n  textfile: %s\nhealth:\n  recheck-delay: 200ms\n" % prom,
                   env={"FAKE_NVML_EVENT_FILE": events})
        exp = None
        try:
            wait_until("the textfile", lambda: os.path.exists(prom), 5)

            def settled():
                try:
                    with open(prom) as f:
                        text = f.read()
                except FileNotFoundError:
                    return False
                return ('gpu_node_agent_node_state{state="ready"} 1\n' in text and
                        "gpu_node_agent_health_event_worker_armed 1\n" in text)
            # The file is rewritten as the start-up pass and the health worker progress: compare a
            # scrape with the file as it was both just before and just after it.
            wait_until("the textfile of a ready node with the health worker armed", settled, 10)
            exp = Exporter(tmp, prom_dir)
            deadline = time.monotonic() + 10 * SCALE
            while True:
                with open(prom) as f:
                    before = f.read()
                samples = exp.series()
                with open(prom) as f:
                    if f.read() == before or time.monotonic() > deadline:
                        break
            own, typed = parse(before, prom)
            check(all(n in typed for n, _, _ in own), "a series without a TYPE line")
            scraped = ours(samples)
            note("%d series of ours in the file, %d in the scrape", len(own), len(scraped))
            check(sorted((n, sorted(lab.items())) for n, lab, _ in own) ==
                  sorted((n, sorted(lab.items())) for n, lab, _ in scraped),
                  "node_exporter did not serve exactly the file's series")
            for name, lab, _ in scraped:
                if name.startswith("DCGM_") or name in ("gpu_node_agent_gpu_health", "gpu_node_agent_xid_events_total"):
                    missing = [k for k in DCGM_LABELS if not lab.get(k)]
                    check(not missing, "%s%r lacks dcgm-exporter labels %s" % (name, lab, missing))
            for name in ("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
                         "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
                         "DCGM_FI_DEV_ROW_REMAP_FAILURE", "gpu_node_agent_gpu_health"):
                check(len({lab["gpu"] for n, lab, _ in scraped if n == name}) == 8, "%s: not one series per GPU" % name)
            check(find(samples, "DCGM_FI_DEV_XID_ERRORS", gpu="3", pci_bus_id="00000000:61:00.0",
                       device="nvidia3", err_code="0") == [0.0], "XID gauge of GPU 3 before any XID")
            check(not any("err_msg" in lab for n, lab, _ in samples if n == "DCGM_FI_DEV_XID_ERRORS"),
                  "an err_msg label without an XID")
            check(find(samples, "gpu_node_agent_node_state", state="ready") == [1.0], "node_state ready")
            check(find(samples, "gpu_node_agent_stage_state", stage="nvml", state="done") == [1.0], "stage_state nvml")
            check(find(samples, "gpu_node_agent_passes_total")[0] >= 1, "passes_total")
            check(find(samples, "gpu_node_agent_health_event_worker_armed") == [1.0], "event worker not armed")
            check(find(samples, "gpu_node_agent_stage_duration_seconds", stage="probe"), "no probe duration")
            check(find(samples, "gpu_node_agent_gpus") == [8.0], "gpu_node_agent_gpus")

            # Only on change: a health check that finds nothing new leaves the file (its inode) alone.
            # The old file is held open, so that its inode number cannot be reused by a later
            # replacement (ext4 hands a freed number out again: two rewrites could look like none).
            held = open(prom, "rb")
            held_text = held.read()
            ino = os.fstat(held.fileno()).st_ino
            busctl(d.bus, "call", "org.gpunodeagent.Agent1", "/org/gpunodeagent/Agent1",
                   "org.gpunodeagent.Agent1.Manager", "ResetGpuHealth", "u", "0")
            time.sleep(0.5 * SCALE)
            check(os.stat(prom).st_ino == ino, "the textfile was rewritten with nothing changed")

            # An XID shows within 1 s, as the last XID and in the health gauge; the file is replaced whole.
            t0 = time.monotonic()
            with open(events, "a") as f:
                f.write("xid 3 79\n")

            def shows():
                with open(prom) as f:
                    text = f.read()
                return 'DCGM_FI_DEV_XID_ERRORS{gpu="3"' in text and re.search(
                    r'DCGM_FI_DEV_XID_ERRORS\{gpu="3"[^}]*\} 79\n', text) is not None
            wait_until("XID 79 in the textfile", shows, 1)
            note("XID → textfile: %.0f ms", (time.monotonic() - t0) * 1e3)
            check(os.stat(prom).st_ino != ino, "the textfile was not replaced (rename) on change")
            # Replaced, never written in place: the old inode is unlinked and still holds the old text.
            check(os.fstat(held.fileno()).st_nlink == 0, "the old textfile is still linked")
            held.seek(0)
            check(held.read() == held_text, "the old textfile was written in place")
            held.close()
            wait_until("the pass the XID caused", lambda: 'state="degraded"} 1' in open(prom).read(), 2)
            samples = exp.series()
            # dcgm-exporter's labels of the XID gauge: the code, and what it means.
            check(find(samples, "DCGM_FI_DEV_XID_ERRORS", gpu="3", err_code="79",
                       err_msg="GPU has fallen off the bus") == [79.0], "err_code/err_msg of XID 79 on GPU 3")
            check(find(samples, "gpu_node_agent_gpu_health", gpu="3", health="failed") == [1.0], "GPU 3 health gauge")
            check(find(samples, "gpu_node_agent_unhealthy_gpus") == [1.0], "unhealthy_gpus")
            check(find(samples, "gpu_node_agent_node_state", state="degraded") == [1.0], "node_state degraded")
            with open(events, "a") as f:
                f.write("dbe 5\nsbe 6\nsbe 6\nremap 2 3 1 0 0\n")
            wait_until("ECC counters", lambda: re.search(r'DCGM_FI_DEV_ECC_SBE_VOL_TOTAL\{gpu="6"[^}]*\} 2\n',
                                                         open(prom).read()), 2)
            busctl(d.bus, "call", "org.gpunodeagent.Agent1", "/org/gpunodeagent/Agent1",
                   "org.gpunodeagent.Agent1.Manager", "Reconcile")
            wait_until("remapped rows from the re-check",
                       lambda: re.search(r'DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS\{gpu="2"[^}]*\} 3\n', open(prom).read()), 3)
            samples = exp.series()
            check(find(samples, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu="5") == [1.0], "DBE counter of GPU 5")
            check(find(samples, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", gpu="2") == [1.0], "uncorrectable rows")
            check(find(samples, "gpu_node_agent_xid_events_total", gpu="3") == [1.0], "xid_events_total")
            leftovers = [n for n in os.listdir(prom_dir) if n != "gpu-node-agent.prom"]
            check(not leftovers, "temp files left beside the textfile: %r" % leftovers)
            d.stop_clean()
        finally:
            if exp:
                exp.close()
            d.close()


def test_mig_labels_and_bad_path():
    with TempDir() as tmp:
        prom_dir = os.path.join(tmp, "prom")
        prom = os.path.join(prom_dir, "agent.prom")
        config = os.path.join(os.environ.get("GNA_SOURCE_ROOT", os.path.join(os.path.dirname(__file__), "../..")),
                              "tests/fixtures/mig-parted/config-default.yaml")
        d = Daemon(tmp, "a100-sxm-mig", dropin="metrics:\n  textfile: %s\nmig:\n  config-file: %s\n" % (prom, config))
        exp = None
        try:
            wait_until("the textfile", lambda: os.path.exists(prom), 5)
            exp = Exporter(tmp, prom_dir)
            samples = exp.series()
            mig = [lab for n, lab, _ in samples if n == "gpu_node_agent_mig_device_info"]
            check(mig, "no MIG device series on a node with MIG devices")
            for lab in mig:
                missing = [k for k in DCGM_LABELS + ("GPU_I_PROFILE", "GPU_I_ID") if not lab.get(k)]
                check(not missing, "MIG series %r lacks %s" % (lab, missing))
                check(lab["UUID"].startswith("MIG-"), "MIG series UUID %r" % lab["UUID"])
            note("MIG series: %s", ", ".join("%s/%s" % (lab["GPU_I_PROFILE"], lab["GPU_I_ID"]) for lab in mig))
            check(sum(find(samples, "gpu_node_agent_mig_applies_total")) == 0, "MIG applies counted before any")
            p = busctl(d.bus, "call", "org.gpunodeagent.Agent1", "/org/gpunodeagent/Agent1",
                       "org.gpunodeagent.Agent1.Manager", "ApplyMigConfig", "ssb", "all-1g.5gb", "", "false",
                       check_rc=None)
            note("ApplyMigConfig(all-1g.5gb): %s", (p.stdout + p.stderr).strip()[:200])
            wait_until("the apply counted", lambda: re.search(r'gpu_node_agent_mig_applies_total\{result="[a-z]+"\} 1\n',
                                                              open(prom).read()), 10)
            samples = exp.series()
            check(find(samples, "gpu_node_agent_mig_apply_changes_total") == [1.0], "the apply's change not counted")
        finally:
            if exp:
                exp.close()
            d.close()
    with TempDir() as tmp:
        d = Daemon(tmp, "dgx-h100", dropin="metrics:\n  textfile: /tmp/gpu-node-agent.txt\n", wait_ready=False)
        try:
            d.agent.proc.wait(30 * SCALE)
            out = d.agent.output()
            check("metrics.textfile: '/tmp/gpu-node-agent.txt' is not an absolute path ending in .prom" in out,
                  "no clear error for a textfile node_exporter would ignore:\n" + out[-2000:])
        finally:
            d.close()


def test_dkms_build_seconds():
    """A DKMS build (tests/fakes-dkms, 1 s, the kmod trap) ends up as gpu_node_agent_dkms_build_seconds."""
    spec = importlib.util.spec_from_file_location("test_driver", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                             "test-driver.py"))
    td = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(td)
    from harness import Agent, Bus, Notify
    with TempDir() as tmp:
        c = td.Case(tmp, tree="stale")
        c.headers()
        c.dkms_add()
        src = os.path.join(tmp, "ko-src")
        shutil.copytree(os.path.join(td.TREES, "upstream/lib/modules", td.KVER, "updates/dkms"), src)
        c.env.update({"GNA_FAKE_DKMS_KO_SRC": src, "GNA_FAKE_DKMS_DURATION": "1"})
        prom = os.path.join(tmp, "prom", "agent.prom")
        with open(os.path.join(c.node.confd, "70-metrics.yaml"), "w") as f:
            f.write("metrics:\n  textfile: %s\n" % prom)
        bus, notify = Bus(tmp), Notify(tmp)
        agent = Agent(c.node, bus, notify, extra_env=c.env, wrapper=[])
        try:
            notify.wait_for("READY=1", 30 * SCALE)
            wait_until("the DKMS build in the textfile", lambda: os.path.exists(prom) and
                       "gpu_node_agent_dkms_build_seconds" in open(prom).read(), 5)
            with open(prom) as f:
                samples, _ = parse(f.read(), prom)
            v = find(samples, "gpu_node_agent_dkms_build_seconds", result="success")
            check(len(v) == 1 and 1.0 <= v[0] < 30, "dkms_build_seconds %r" % v)
            note("DKMS build: %.2f s", v[0])
            check(agent.stop() == 0, "agent exit")
        finally:
            if agent.proc.poll() is None:
                agent.proc.kill()
                agent.proc.wait()
            notify.close()
            bus.stop()


if __name__ == "__main__":
    tap_main([test_textfile_scraped_by_node_exporter, test_mig_labels_and_bad_path, test_dkms_build_seconds],
             sys.argv[1:])
