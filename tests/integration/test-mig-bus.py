#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Integration tests of MIG management over D-Bus and gpunodectl: the real daemon on a private system-like
bus with the fake NVML (8 x A100-SXM4-40GB, mig.config-file = mig-parted's config-default.yaml, nothing
selected) and `fake-nvml-ctl` as the GPU reset program. ApplyMigConfig() over D-Bus and `gpunodectl mig
apply` (MigConfig/MigConfigState with their PropertiesChanged, MigDevices per GPU, labels and CDI follow),
an idempotent re-apply that writes nothing, invalid configs refused with InvalidConfig and nothing changed,
Busy while an apply runs, --no-block, "reboot required" with mig.reset: never, the policy for nobody (apply
denied; assert and export allowed), assert's report and exit status, and export round-tripping through
apply. Expected layouts come from the MIG user guide's A100-40GB geometry and the fixture node. TAP."""
import importlib.util
import json
import os
import sys
import time

import dbus
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import CTL, SRC, Bus, TempDir, busctl, check, run, tap_main  # noqa: E402

_spec = importlib.util.spec_from_file_location("nvmltest", os.path.join(os.path.dirname(__file__), "test-nvml.py"))
nv = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nv)

SCALE = nv.SCALE
CONFIG = os.path.join(SRC, "tests/fixtures/mig-parted/config-default.yaml")
DROPIN = "mig:\n  config-file: %s\n" % CONFIG
AGENT, PATH, MANAGER, GPU = nv.AGENT_NAME, nv.AGENT_PATH, nv.MANAGER, nv.GPU
ERROR = "org.gpunodeagent.Agent1.Error."
# all-balanced on an A100-SXM4-40GB, largest first at the lowest start that leaves room for the rest.
BALANCED = "2g.10gb@0, 1g.5gb@2, 1g.5gb@3, 3g.20gb@4"
WRITES = {"nvmlDeviceSetMigMode", "nvmlDeviceCreateGpuInstance", "nvmlDeviceCreateGpuInstanceWithPlacement",
          "nvmlGpuInstanceCreateComputeInstance", "nvmlGpuInstanceCreateComputeInstanceWithPlacement",
          "nvmlGpuInstanceDestroy", "nvmlComputeInstanceDestroy"}


class Mig:
    """A daemon (test-nvml.py's Daemon) with MIG config file, reset program and NVML call trace."""

    def __init__(self, tmp, node="a100-sxm", dropin="", reset_program=None, env_extra=None):
        self.tmp = tmp
        self.trace = os.path.join(tmp, "nvml.trace")
        env = {"GNA_MIG_RESET_PROGRAM": reset_program or nv.FAKE_NVML_CTL, "FAKE_NVML_TRACE": self.trace}
        env.update(env_extra or {})
        self.d = nv.Daemon(tmp, node, dropin=DROPIN + dropin, env=env)
        self.node = self.d.node
        self.gpus = sorted(nv.nvml_description(self.node)["gpus"], key=lambda g: g["pci"])
        self.conn = dbus.bus.BusConnection(self.d.bus.address)
        self.manager = dbus.Interface(self.conn.get_object(AGENT, PATH), MANAGER)

    def call(self, method, *args, timeout=120):
        """(error name or None, reply or message)."""
        try:
            return None, getattr(self.manager, method)(*args, timeout=timeout * SCALE)
        except dbus.exceptions.DBusException as e:
            return e.get_dbus_name(), e.get_dbus_message()

    def ctl(self, *args, user=None):
        return run([CTL] + list(args), bus=self.d.bus, user=user, timeout=120 * SCALE)

    def prop(self, name, path=PATH, interface=MANAGER):
        return self.d.prop_json(name, path, interface)

    def writes(self, since=0):
        return [c for c in nv.trace_calls(self.trace)[since:] if c in WRITES]

    def mig_devices(self):
        """{GPU index: [(profile, gi, ci, uuid)]} from the MigDevices properties."""
        out = {}
        for i in range(len(self.gpus)):
            out[i] = sorted((p, gi, ci, u) for u, p, gi, ci in self.prop("MigDevices", nv.gpu_path(i), GPU))
        return out

    def labels_follow(self, config, state):
        def ok():
            lab = nv.read_labels(self.node)
            return lab.get("nvidia.com/mig.config") == config and lab.get("nvidia.com/mig.config.state") == state
        nv.wait_until("labels mig.config=%s, mig.config.state=%s" % (config, state), ok, 20)

    def settle(self):
        """Waits for the pass an apply started: Stage back to ready and the mig stage done."""
        def idle():
            return self.prop("Stage") == "ready" and self.d.stage("mig")[0] in ("done", "skipped", "failed")
        time.sleep(0.3 * SCALE)
        nv.wait_until("the pass after the apply", idle, 20)

    def close(self):
        self.conn.close()
        self.d.close()


def balanced_message(m):
    return "; ".join("GPU %d (%s): %s" % (i, g["pci"], BALANCED) for i, g in enumerate(m.gpus))


def write(tmp, name, text):
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def signal_props(mon, start):
    """Every property name → values carried by the Manager's PropertiesChanged signals from index start on."""
    seen = {}
    for msg in mon.messages()[start:]:
        if msg.get("type") == "signal" and msg.get("member") == "PropertiesChanged" and msg.get("path") == PATH:
            iface, changed = msg["payload"]["data"][0], msg["payload"]["data"][1]
            if iface == MANAGER:
                for k, v in changed.items():
                    seen.setdefault(k, []).append(v["data"])
    return seen


# --- 1. apply over D-Bus, then through gpunodectl ---

def test_apply_over_dbus_and_gpunodectl():
    with TempDir() as tmp:
        m = Mig(tmp)
        mon = None
        try:
            check(m.prop("MigConfig") == "" and m.prop("MigConfigState") == "", "MIG managed before any apply")
            check("nvidia.com/mig.config" not in nv.read_labels(m.node), "mig.config label while not managed")
            mon = nv.Monitor(m.d, tmp)
            start = len(mon.messages())

            err, reply = m.call("ApplyMigConfig", "all-balanced", "", False)
            check(err is None, "ApplyMigConfig failed: %s %s" % (err, reply))
            check(list(reply) == ["success", balanced_message(m)], "reply %r" % (list(reply),))
            # The answer comes after the apply: properties and the GPUs' MIG devices are current already.
            check(m.prop("MigConfig") == "all-balanced", "MigConfig %r" % m.prop("MigConfig"))
            check(m.prop("MigConfigState") == "success", "MigConfigState %r" % m.prop("MigConfigState"))
            devices = m.mig_devices()
            fake = nv.fake_show(m.node)
            for i in range(len(m.gpus)):
                check([d[0] for d in devices[i]] == ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"],
                      "GPU %d MigDevices %r" % (i, devices[i]))
                check(sorted(d[3] for d in devices[i]) == sorted(f[3] for f in fake[i]),
                      "GPU %d MIG UUIDs differ from the fake's: %r vs %r" % (i, devices[i], fake[i]))
                check(m.prop("MigMode", nv.gpu_path(i), GPU) == "enabled", "GPU %d MIG mode" % i)
            m.labels_follow("all-balanced", "success")
            m.settle()
            nv.check_cdi_layout(m.d, "after ApplyMigConfig(all-balanced)")

            mon.sync()
            seen = signal_props(mon, start)
            check("all-balanced" in seen.get("MigConfig", []), "no PropertiesChanged with MigConfig: %r" % seen)
            check(seen.get("MigConfigState", [])[-1:] == ["success"], "MigConfigState signals: %r" % seen)

            # gpunodectl: another config, JSON result; everything follows again.
            p = m.ctl("--json", "mig", "apply", "all-1g.5gb")
            check(p.returncode == 0, "mig apply exited %d: %s%s" % (p.returncode, p.stdout, p.stderr))
            out = json.loads(p.stdout)
            check(out["config"] == "all-1g.5gb" and out["state"] == "success" and not out["reboot_required"], out)
            check(out["message"].startswith("GPU 0 (%s): 1g.5gb@0, 1g.5gb@1" % m.gpus[0]["pci"]), out["message"])
            devices = m.mig_devices()
            check(all([d[0] for d in devices[i]] == ["1g.5gb"] * 7 for i in devices), "MigDevices %r" % devices)
            m.labels_follow("all-1g.5gb", "success")
            m.settle()
            nv.check_cdi_layout(m.d, "after gpunodectl mig apply all-1g.5gb")

            # mig show: the config, its state and every device with GI/CI and full UUID.
            p = m.ctl("mig", "show")
            check(p.returncode == 0, p.stderr)
            check("MIG config: all-1g.5gb (success)" in p.stdout, p.stdout)
            for gi, ci, profile, uuid in nv.fake_show(m.node)[3]:
                check(("GI %-2d CI %-2d %-12s %s" % (gi, ci, profile, uuid)) in p.stdout,
                      "mig show lacks GPU 3's %s %s:\n%s" % (profile, uuid, p.stdout))
            check("8 GPUs, 56 MIG devices." in p.stdout, p.stdout)
            shown = json.loads(m.ctl("--json", "mig").stdout)
            check(shown["config"] == "all-1g.5gb" and shown["state"] == "success", shown)
            check(len(shown["gpus"]) == 8 and all(g["mig_mode"] == "enabled" and len(g["mig_devices"]) == 7
                                                  for g in shown["gpus"]), shown)
            status = json.loads(m.ctl("--json", "status").stdout)
            check(status["mig_config"] == "all-1g.5gb" and status["mig_config_state"] == "success", status)
            m.d.stop_clean()
        finally:
            if mon:
                mon.close()
            m.close()


# --- 2. the same config again: instant, no NVML writes, nothing rewritten ---

def test_reapply_is_idempotent():
    with TempDir() as tmp:
        m = Mig(tmp)
        try:
            p = m.ctl("mig", "apply", "all-balanced")
            check(p.returncode == 0, p.stdout + p.stderr)
            check(p.stdout == "MIG config all-balanced: success: %s\n" % balanced_message(m), p.stdout)
            m.labels_follow("all-balanced", "success")
            m.settle()
            before = (m.mig_devices(), nv.file_id(m.node.cdi_spec), nv.file_id(m.node.feature_file()))
            n = len(nv.trace_calls(m.trace))

            t = time.monotonic()
            p = m.ctl("mig", "apply", "all-balanced")
            took = time.monotonic() - t
            check(p.returncode == 0 and p.stdout == "MIG config all-balanced: success: no change needed\n",
                  p.stdout + p.stderr)
            check(took < 2 * SCALE, "re-apply took %.1fs" % took)
            time.sleep(0.5 * SCALE)
            check(m.writes(n) == [], "re-apply wrote through NVML: %r" % m.writes(n))
            after = (m.mig_devices(), nv.file_id(m.node.cdi_spec), nv.file_id(m.node.feature_file()))
            check(after[0] == before[0], "MIG devices changed: %r → %r" % (before[0], after[0]))
            check(after[1:] == before[1:], "CDI spec or labels rewritten by a no-op apply")
            m.d.stop_clean()
        finally:
            m.close()


# --- 3. invalid requests: InvalidConfig, nothing changed ---

def test_invalid_config_refused():
    with TempDir() as tmp:
        m = Mig(tmp)
        try:
            n = len(nv.trace_calls(m.trace))
            bad = write(tmp, "bad.yaml", "version: v1\nmig-configs:\n  tiny:\n    - devices: all\n"
                        "      mig-enabled: true\n      mig-devices:\n        \"1g.7gb\": 1\n"
                        "  huge:\n    - devices: all\n      mig-enabled: true\n"
                        "      mig-devices: {\"3g.20gb\": 3}\n")
            err, msg = m.call("ApplyMigConfig", "tiny", bad, False)
            check(err == ERROR + "InvalidConfig", "unknown profile: %s %s" % (err, msg))
            check("GPUs 0-7 (NVIDIA A100-SXM4-40GB): no MIG profile '1g.7gb'" in msg, msg)
            check("valid profiles: " in msg and "1g.5gb" in msg.split("valid profiles: ")[1] and
                  "3g.20gb" in msg.split("valid profiles: ")[1], msg)

            p = m.ctl("mig", "apply", "huge", "--config", bad)
            check(p.returncode == 1, "over capacity: exit %d %s%s" % (p.returncode, p.stdout, p.stderr))
            check("3 × 3g.20gb is more than the GPU holds" in p.stderr, p.stderr)

            p = m.ctl("mig", "apply", "all-balance")
            check(p.returncode == 1, "unknown name: exit %d" % p.returncode)
            check("has no MIG config named 'all-balance'" in p.stderr and "all-balanced" in p.stderr, p.stderr)

            err, msg = m.call("ApplyMigConfig", "tiny", "relative.yaml", False)
            check(err == ERROR + "InvalidConfig" and "not an absolute path" in msg, "%s %s" % (err, msg))
            err, msg = m.call("ApplyMigConfig", "", "", False)
            check(err == ERROR + "InvalidConfig" and "no MIG config name given" in msg, "%s %s" % (err, msg))

            check(m.writes(n) == [], "NVML writes after refused applies: %r" % m.writes(n))
            check(all(not devs for devs in m.mig_devices().values()), "MIG devices appeared")
            check(all(m.prop("MigMode", nv.gpu_path(i), GPU) == "disabled" for i in range(8)), "MIG mode changed")
            # A rejected request changes nothing, not even what is reported: MIG was not managed before.
            check(m.prop("MigConfigState") == "" and m.prop("MigConfig") == "",
                  "MigConfig/MigConfigState %r/%r after rejected requests" % (m.prop("MigConfig"), m.prop("MigConfigState")))
            m.d.stop_clean()
        finally:
            m.close()


# --- 4. the policy: nobody may look, not change ---

def test_nobody_asserts_and_exports_but_cannot_apply():
    with TempDir() as tmp:
        m = Mig(tmp)
        try:
            p = m.ctl("mig", "apply", "all-balanced", user="nobody")
            check(p.returncode == 4, "apply as nobody: exit %d %s%s" % (p.returncode, p.stdout, p.stderr))
            p = busctl(m.d.bus, "call", AGENT, PATH, MANAGER, "ApplyMigConfig", "ssb", "all-balanced", "", "false",
                       user="nobody", check_rc=None)
            check(p.returncode != 0, "busctl ApplyMigConfig allowed for nobody")
            check(m.prop("MigConfig") == "", "MigConfig set by nobody's call")

            p = m.ctl("mig", "assert", "all-disabled", user="nobody")
            check(p.returncode == 0, "assert as nobody: exit %d %s%s" % (p.returncode, p.stdout, p.stderr))
            check(p.stdout == "The GPUs match MIG config all-disabled.\n", p.stdout)

            p = m.ctl("mig", "assert", "all-balanced", user="nobody")
            check(p.returncode == 1, "mismatch: exit %d %s" % (p.returncode, p.stderr))
            lines = p.stdout.splitlines()
            check(len(lines) == 8, "one report line per GPU: %r" % lines)
            check(lines[0].startswith("GPU 0 (%s) does not match all-balanced: it has " % m.gpus[0]["pci"]) and
                  "applying it would: " in lines[0] and "set-mode 1" in lines[0], lines[0])
            out = json.loads(m.ctl("--json", "mig", "assert", "all-balanced", user="nobody").stdout)
            check(out == {"config": "all-balanced", "matches": False, "report": p.stdout.rstrip("\n")}, out)

            # Any other file would be read with the agent's privileges: root only.
            other = write(tmp, "other.yaml", open(CONFIG).read())
            os.chmod(tmp, 0o755)
            p = m.ctl("mig", "assert", "all-disabled", "--config", other, user="nobody")
            check(p.returncode == 4 and "requires root" in p.stderr, "exit %d %s" % (p.returncode, p.stderr))
            # CAP_SYS_ADMIN without UID 0 is not root: the bus records no capabilities, and the agent
            # does not read them from /proc/PID (racy against PID reuse), as it once did.
            import pwd
            pw = pwd.getpwnam("nobody")
            p = run(["setpriv", "--reuid=%d" % pw.pw_uid, "--regid=%d" % pw.pw_gid, "--clear-groups",
                     "--inh-caps=+sys_admin", "--ambient-caps=+sys_admin", CTL, "mig", "assert", "all-disabled",
                     "--config", other], bus=m.d.bus, timeout=120 * SCALE)
            check(p.returncode == 4 and "requires root: the agent would read" in p.stderr,
                  "nobody with CAP_SYS_ADMIN: exit %d %s" % (p.returncode, p.stderr))
            p = m.ctl("mig", "assert", "all-disabled", "--config", other)
            check(p.returncode == 0, "assert --config as root: exit %d %s" % (p.returncode, p.stderr))

            p = m.ctl("mig", "export", user="nobody")
            check(p.returncode == 0, "export as nobody: exit %d %s" % (p.returncode, p.stderr))
            check(yaml.safe_load(p.stdout) == {"version": "v1", "mig-configs": {"current": [
                {"devices": "all", "mig-enabled": False}]}}, p.stdout)
            p = busctl(m.d.bus, "call", AGENT, PATH, MANAGER, "ExportMigConfig", user="nobody", check_rc=None)
            check(p.returncode == 0 and p.stdout.startswith('s "version: v1'), p.stdout + p.stderr)
            m.d.stop_clean()
        finally:
            m.close()


# --- 5. export round-trips; --no-block ---

MIXED_LAYOUT = """version: v1
mig-configs:
  mixed:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
    - devices: [1, 5]
      mig-enabled: true
      mig-devices: {"1g.5gb": 7}
    - devices: [6]
      mig-enabled: false
"""


def test_export_round_trip_and_no_block():
    with TempDir() as tmp:
        m = Mig(tmp)
        try:
            p = m.ctl("--no-block", "mig", "apply", "mixed", "--config", write(tmp, "mixed.yaml", MIXED_LAYOUT))
            check(p.returncode == 0, "exit %d %s%s" % (p.returncode, p.stdout, p.stderr))
            # Accepted and running, or (a fast machine) already answered.
            check(p.stdout == "Applying MIG config mixed in the background; follow it with 'gpunodectl mig show'.\n"
                  or p.stdout.startswith("MIG config mixed: success: GPU 0 "), p.stdout)
            nv.wait_until("the apply to finish", lambda: m.prop("MigConfigState") == "success", 30)
            check(m.prop("MigConfig") == "mixed", m.prop("MigConfig"))
            m.settle()

            p = m.ctl("mig", "export")
            check(p.returncode == 0, p.stderr)
            exported = yaml.safe_load(p.stdout)
            entries = exported["mig-configs"]["current"]
            by_devices = {json.dumps(e["devices"]): e for e in entries}
            check(len(entries) == 3, "identical GPUs not merged: %s" % p.stdout)
            check(by_devices.get("[0, 2, 3, 4, 7]", {}).get("mig-devices") == {"1g.5gb": 2, "2g.10gb": 1,
                                                                                 "3g.20gb": 1}, p.stdout)
            check(by_devices.get("[1, 5]", {}).get("mig-devices") == {"1g.5gb": 7}, p.stdout)
            check(by_devices.get("[6]", {}).get("mig-enabled") is False, p.stdout)

            exported_file = write(tmp, "exported.yaml", p.stdout)
            p = m.ctl("mig", "assert", "current", "--config", exported_file)
            check(p.returncode == 0 and p.stdout == "The GPUs match MIG config current.\n", p.stdout + p.stderr)
            before, n = m.mig_devices(), len(nv.trace_calls(m.trace))
            p = m.ctl("mig", "apply", "current", "--config", exported_file)
            check(p.returncode == 0 and p.stdout == "MIG config current: success: no change needed\n",
                  p.stdout + p.stderr)
            check(m.writes(n) == [], "applying the export wrote through NVML: %r" % m.writes(n))
            check(m.mig_devices() == before, "applying the export changed the MIG devices")
            m.labels_follow("current", "success")
            m.d.stop_clean()
        finally:
            m.close()


# --- 5b. mig-parted's <C>c.<G>g meaning: devices of one GI profile share a GI ---

SHARED = ("version: v1\nmig-configs:\n"
          "  three-and-four:\n    - devices: all\n      mig-enabled: true\n"
          "      mig-devices: {\"1c.3g.20gb\": 3, \"4g.20gb\": 1}\n"
          "  two-in-seven:\n    - devices: [0, 1]\n      mig-enabled: true\n"
          "      mig-devices: {\"1c.7g.40gb\": 2}\n")


def test_shared_gpu_instances():
    with TempDir() as tmp:
        m = Mig(tmp)
        try:
            conf = write(tmp, "shared.yaml", SHARED)
            p = m.ctl("mig", "apply", "three-and-four", "--config", conf)
            check(p.returncode == 0 and "success" in p.stdout, "exit %d %s%s" % (p.returncode, p.stdout, p.stderr))
            m.settle()
            for i, devs in m.mig_devices().items():
                profiles = sorted(d[0] for d in devs)
                check(profiles == ["1c.3g.20gb"] * 3 + ["4g.20gb"], "GPU %d: %r" % (i, devs))
                small = {d[1] for d in devs if d[0] == "1c.3g.20gb"}
                check(len(small) == 1, "GPU %d: the three 1c.3g.20gb are not in one GPU instance: %r" % (i, devs))
            nv.check_cdi_layout(m.d, "after three-and-four")

            n = len(nv.trace_calls(m.trace))
            p = m.ctl("mig", "apply", "three-and-four", "--config", conf)
            check(p.returncode == 0 and p.stdout == "MIG config three-and-four: success: no change needed\n",
                  p.stdout + p.stderr)
            check(m.writes(n) == [], "re-apply wrote through NVML: %r" % m.writes(n))

            p = m.ctl("mig", "export")
            exported = yaml.safe_load(p.stdout)["mig-configs"]["current"]
            check(exported == [{"devices": "all", "mig-enabled": True,
                                "mig-devices": {"1c.3g.20gb": 3, "4g.20gb": 1}}], p.stdout)

            p = m.ctl("mig", "apply", "two-in-seven", "--config", conf)
            check(p.returncode == 0 and "success" in p.stdout, "exit %d %s%s" % (p.returncode, p.stdout, p.stderr))
            m.settle()
            devs = m.mig_devices()
            for i in (0, 1):
                check(sorted(d[0] for d in devs[i]) == ["1c.7g.40gb"] * 2 and len({d[1] for d in devs[i]}) == 1,
                      "GPU %d: %r" % (i, devs[i]))
            nv.check_cdi_layout(m.d, "after two-in-seven")
            m.d.stop_clean()
        finally:
            m.close()


# --- 6. Busy while an apply runs ---

def test_busy_while_applying():
    with TempDir() as tmp:
        slow = write(tmp, "slow-reset", "#!/bin/sh\nsleep %d\nexec %s \"$@\"\n" % (int(2 * SCALE), nv.FAKE_NVML_CTL))
        os.chmod(slow, 0o755)
        m = Mig(tmp, node="a100-pcie", reset_program=slow)
        try:
            p = m.ctl("--no-block", "mig", "apply", "all-balanced")
            check(p.returncode == 0 and "in the background" in p.stdout, "exit %d %s%s" % (p.returncode, p.stdout,
                                                                                             p.stderr))
            check(m.prop("MigConfigState") == "pending", "MigConfigState %r" % m.prop("MigConfigState"))
            err, msg = m.call("ApplyMigConfig", "all-disabled", "", False)
            check(err == ERROR + "Busy" and "A MIG apply (all-balanced) is already running" in msg, "%s %s" % (err, msg))
            p = m.ctl("mig", "apply", "all-disabled")
            check(p.returncode == 1 and "already running" in p.stderr, "exit %d %s" % (p.returncode, p.stderr))
            nv.wait_until("the slow apply to finish", lambda: m.prop("MigConfigState") == "success", 30)
            check(m.prop("MigConfig") == "all-balanced", "the refused call replaced the config")
            m.d.stop_clean()
        finally:
            m.close()


# --- 7. mig.reset: never — "reboot required", exit 0 ---

def test_reboot_required():
    with TempDir() as tmp:
        m = Mig(tmp, node="a100-pcie", dropin="  reset: never\n")
        try:
            p = m.ctl("mig", "apply", "all-balanced")
            check(p.returncode == 0, "exit %d %s%s" % (p.returncode, p.stdout, p.stderr))
            check(p.stdout.startswith("MIG config all-balanced: reboot required: "), p.stdout)
            check(m.prop("MigConfigState") == "rebooting", m.prop("MigConfigState"))
            check(m.prop("MigModePending", nv.gpu_path(0), GPU) == "enabled" and
                  m.prop("MigMode", nv.gpu_path(0), GPU) == "disabled", "GPU 0 mode not pending")
            m.labels_follow("all-balanced", "rebooting")
            m.d.stop_clean()
        finally:
            m.close()


# --- 8. usage ---

def test_usage_errors():
    for args, text in ((["mig", "apply"], "needs the name of a MIG config"),
                       (["mig", "frob"], "Unknown mig command 'frob'"),
                       (["mig", "export", "x"], "'mig export' takes no arguments"),
                       (["mig", "show", "--force"], "--force only applies to mig apply"),
                       (["gpus", "--config", "x"], "only apply to the mig commands"),
                       (["mig", "export", "--config", "x"], "--config only applies to mig apply and mig assert")):
        p = run([CTL] + args)
        check(p.returncode == 2 and text in p.stderr, "%r: exit %d %s" % (args, p.returncode, p.stderr))
    # A bus without the agent: exit 3, whatever the command.
    with TempDir() as tmp:
        bus = Bus(tmp)
        try:
            for args in (["mig"], ["mig", "apply", "all-balanced"], ["mig", "assert"], ["mig", "export"]):
                p = run([CTL] + args, bus=bus)
                check(p.returncode == 3 and "gpu-node-agent is not running" in p.stderr,
                      "%r without the agent: exit %d %s" % (args, p.returncode, p.stderr))
        finally:
            bus.stop()



# --- a rollback that fails: the apply stops at that GPU, the next start does not try again ---

def test_failed_rollback_stops_apply():
    with TempDir() as tmp:
        # all-balanced succeeds; then every GI create fails (the rules are armed by the file, and count
        # per process: each GPU's MIG writes run in an NVML worker of their own): all-1g.5gb fails on
        # GPU 0, and so does its rollback.
        fail_file = os.path.join(tmp, "nvml-fail")
        m = Mig(tmp, env_extra={"FAKE_NVML_FAIL": "nvmlDeviceCreateGpuInstanceWithPlacement:1+:23",
                                "FAKE_NVML_FAIL_FILE": fail_file})
        try:
            err, reply = m.call("ApplyMigConfig", "all-balanced", "", False)
            check(err is None, "ApplyMigConfig(all-balanced): %s %s" % (err, reply))
            m.settle()  # the pass the apply starts checks the layout again: an apply meanwhile is Busy
            before = nv.fake_show(m.node)
            open(fail_file, "w").close()
            err, reply = m.call("ApplyMigConfig", "all-1g.5gb", "", False)
            check(err == ERROR + "Failed", "second apply: %s %s" % (err, reply))
            check("the rollback to the previous layout failed too; GPU 0 (%s) is left with " % m.gpus[0]["pci"] in reply
                  and "the apply stopped there and touched no other GPU" in reply
                  and "GPUs 1, 2, 3, 4, 5, 6, 7 not touched" in reply, reply)
            after = nv.fake_show(m.node)  # what the (fake) driver has, not what the agent says
            for i in range(1, len(m.gpus)):
                check(after[i] == before[i], "GPU %d was touched: %r -> %r" % (i, before[i], after[i]))
            check(after[0] != before[0], "GPU 0 unchanged: the fault did not hit")
            # The pass the apply starts (and every retry) must not apply again either.
            m.settle()
            state, message = m.d.stage("mig")
            check(state == "failed" and "stopped because the rollback of GPU %s failed" % m.gpus[0]["pci"] in message,
                  "mig stage after the halted apply: %s %s" % (state, message))
            check(nv.fake_show(m.node) == after, "the pass after the halted apply changed the GPUs")
            check(m.prop("MigConfigState") == "failed", "MigConfigState %r" % m.prop("MigConfigState"))
        finally:
            m.close()

        # The next start: the mig stage reports the halt, changes nothing, and an explicit apply clears it.
        for sock in ("notify", "system_bus_socket"):
            if os.path.exists(os.path.join(tmp, sock)):
                os.unlink(os.path.join(tmp, sock))
        calls_before = len(nv.trace_calls(os.path.join(tmp, "nvml.trace")))
        m = Mig(tmp)
        try:
            state, message = m.d.stage("mig")
            check(state == "failed" and "stopped because the rollback of GPU %s failed" % m.gpus[0]["pci"] in message,
                  "mig stage after restart: %s %s" % (state, message))
            check(m.writes(calls_before) == [], "NVML writes at the next start: %r" % m.writes(calls_before))
            err, reply = m.call("ApplyMigConfig", "all-balanced", "", False)
            check(err is None, "explicit apply after the halt: %s %s" % (err, reply))
            check(not os.path.exists(os.path.join(m.node.state, "mig-journal")), "journal left after the apply")
        finally:
            m.close()


TESTS = [
    test_apply_over_dbus_and_gpunodectl,
    test_reapply_is_idempotent,
    test_invalid_config_refused,
    test_nobody_asserts_and_exports_but_cannot_apply,
    test_export_round_trip_and_no_block,
    test_shared_gpu_instances,
    test_busy_while_applying,
    test_reboot_required,
    test_usage_errors,
    test_failed_rollback_stops_apply,
]


def main():
    return tap_main(TESTS, sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
