#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""The loop never blocks on NVML: the real daemon against a fake NVML that hangs in nvmlInit, hangs in a
per-GPU read, or crashes inside a call (tests/fakes/README.md: FAKE_NVML_HANG, FAKE_NVML_CRASH). While the
call hangs, every D-Bus read must answer within 100 ms (× GNA_TIMEOUT_SCALE) and WATCHDOG=1 must keep its
period; the fault is reported in words on the nvml stage, the node is degraded with the PCI-only labels,
and the daemon recovers by itself when the library answers again (or on Reconcile() after a crash).
SIGTERM during a hung call exits at once. TAP output; prints the measured figures as TAP comments."""
import importlib.util
import os
import signal
import subprocess
import sys
import time

import dbus

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Fail, TempDir, busctl, check, tap_main  # noqa: E402

_spec = importlib.util.spec_from_file_location("test_nvml", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                        "test-nvml.py"))
test_nvml = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(test_nvml)
Daemon, wait_until, check_degraded_pci_only = test_nvml.Daemon, test_nvml.wait_until, test_nvml.check_degraded_pci_only

from harness import timeout_scale  # noqa: E402
SCALE = timeout_scale()
AGENT_NAME = "org.gpunodeagent.Agent1"
AGENT_PATH = "/org/gpunodeagent/Agent1"
MANAGER = "org.gpunodeagent.Agent1.Manager"
WATCHDOG_USEC = 1000000
READ_LIMIT = 0.1 * SCALE


def note(fmt, *args):
    print("# " + fmt % args, flush=True)


def probe_reads(d, seconds, while_fn=lambda: True):
    """Reads properties over one connection for `seconds` (while while_fn() holds); returns the round-trip
    times. A read that does not answer within 2 s fails the test."""
    conn = dbus.bus.BusConnection(d.bus.address)
    try:
        obj = conn.get_object(AGENT_NAME, AGENT_PATH, introspect=False)
        props = dbus.Interface(obj, "org.freedesktop.DBus.Properties")
        times = []
        end = time.monotonic() + seconds
        names = ["Stage", "State", "Stages", "GpuCount", "Labels"]
        while time.monotonic() < end and while_fn():
            t0 = time.monotonic()
            try:
                props.Get(MANAGER, names[len(times) % len(names)], timeout=2.0)
            except dbus.exceptions.DBusException as e:
                raise Fail("a D-Bus read did not answer while NVML hangs: %s" % e)
            times.append(time.monotonic() - t0)
            time.sleep(0.02)
        return times
    finally:
        conn.close()


def check_reads(times, what):
    check(times, "%s: no D-Bus read was made" % what)
    s = sorted(times)
    p50, p99, worst = s[len(s) // 2], s[min(len(s) - 1, int(len(s) * 0.99))], s[-1]
    note("%s: %d D-Bus reads, p50 %.1f ms, p99 %.1f ms, max %.1f ms", what, len(s), p50 * 1e3, p99 * 1e3, worst * 1e3)
    check(worst <= READ_LIMIT, "%s: a D-Bus read took %.0f ms (limit %.0f ms)" % (what, worst * 1e3, READ_LIMIT * 1e3))


def check_watchdog(d, since, until, what):
    """WATCHDOG=1 kept arriving at least once per WatchdogSec (1 s here) in [since, until]."""
    pings = [t for t in d.notify.arrivals("WATCHDOG=1") if since - 1 <= t <= until]
    check(len(pings) >= 2, "%s: %d WATCHDOG=1 in %.1f s" % (what, len(pings), until - since))
    gaps = [b - a for a, b in zip(pings, pings[1:])] + [until - pings[-1], pings[0] - since]
    worst = max(gaps)
    note("%s: %d WATCHDOG=1 in %.1f s, longest gap %.0f ms (WatchdogSec 1 s)", what, len(pings), until - since,
         worst * 1e3)
    check(worst <= WATCHDOG_USEC / 1e6 * max(1.0, SCALE / 2),
          "%s: no WATCHDOG=1 for %.0f ms (WatchdogSec is 1 s)" % (what, worst * 1e3))


def fault_env(tmp, **kv):
    env = {"WATCHDOG_USEC": str(WATCHDOG_USEC)}
    for k, v in kv.items():
        env[k] = v.replace("@TMP@", tmp)
    return env


def touch(path):
    with open(path, "w"):
        pass


def test_hang_in_init():
    """nvmlInit never returns: READY=1 still comes, D-Bus answers, the stage names the call; the node
    recovers when the call returns."""
    with TempDir() as tmp:
        hang = os.path.join(tmp, "hang")
        touch(hang)
        start = time.monotonic()
        d = Daemon(tmp, "dgx-h100", wait_ready=False,
                   dropin="nvml:\n  timeout: 1s\nengine:\n  retry-min: 5s\n  retry-max: 5s\n",
                   env=fault_env(tmp, FAKE_NVML_HANG="nvmlInit_v2:1", FAKE_NVML_HANG_FILE=hang))
        try:
            wait_until("the agent on the bus", lambda: d.agent.proc.poll() is None and _answers(d), 20)
            times = probe_reads(d, 3 * SCALE)
            check_reads(times, "nvmlInit hanging")
            d.notify.wait_for("READY=1", 30 * SCALE)
            note("READY=1 %.1f s after start with nvmlInit hanging (8 GPUs: nvmlInit deadline 1 s + 8 × 1 s)",
                 time.monotonic() - start)
            # Failed until the retry 5 s later (which hangs again while the file is there).
            wait_until("the nvml stage to fail", lambda: d.stage("nvml")[0] == "failed", 10)
            state, msg = d.stage("nvml")
            check("nvmlInit_v2 has not returned for 9 s" in msg, "nvml stage message does not name the call: " + msg)
            check_degraded_pci_only(d, "nvmlInit hanging")
            check_watchdog(d, start + 1, time.monotonic(), "nvmlInit hanging")

            os.unlink(hang)  # the driver answers again
            wait_until("the nvml stage to recover by itself once nvmlInit returns",
                       lambda: d.stage("nvml")[0] == "done" and d.prop("State") == 's "ready"', 30)
            d.stop_clean()
        finally:
            d.close()


def _answers(d):
    try:
        d.prop("Stage")
        return True
    except Fail:
        return False


def test_hang_in_gpu_read():
    """The read of GPU 3 hangs in nvmlDeviceGetMemoryInfo: reads and watchdog keep going; the message
    says which call on which GPU; the node recovers when the call returns."""
    with TempDir() as tmp:
        hang = os.path.join(tmp, "hang")
        touch(hang)
        start = time.monotonic()
        d = Daemon(tmp, "dgx-h100", wait_ready=False,
                   dropin="nvml:\n  timeout: 3s\nengine:\n  retry-min: 5s\n  retry-max: 5s\n",
                   env=fault_env(tmp, FAKE_NVML_HANG="nvmlDeviceGetMemoryInfo:4", FAKE_NVML_HANG_FILE=hang))
        try:
            wait_until("the read of GPU 3 to hang", lambda: "nvmlDeviceGetMemoryInfo hangs" in d.agent.output(), 20)
            t_hang = time.monotonic()
            times = probe_reads(d, 2.5, lambda: d.stage("nvml")[0] == "running")
            check_reads(times, "a GPU read hanging")
            d.notify.wait_for("READY=1", 20 * SCALE)
            wait_until("the nvml stage to fail", lambda: d.stage("nvml")[0] == "failed", 10)
            state, msg = d.stage("nvml")
            check("nvmlDeviceGetMemoryInfo on GPU 3 has not returned for 3 s" in msg,
                  "nvml stage message does not name the call and the GPU: " + msg)
            check_degraded_pci_only(d, "a GPU read hanging")
            check_watchdog(d, t_hang, time.monotonic(), "a GPU read hanging")
            note("stage message: %s", msg)

            os.unlink(hang)
            wait_until("the nvml stage to recover by itself once the read returns",
                       lambda: d.stage("nvml")[0] == "done" and d.prop("State") == 's "ready"', 30)
            check(time.monotonic() - start > 0, "")
            d.stop_clean()
        finally:
            d.close()


def test_crash_in_library():
    """libnvidia-ml crashes inside a call: the daemon survives, says so, and Reconcile() recovers once the
    library is fixed (no retry timer within the test: retry-min is long)."""
    with TempDir() as tmp:
        crash = os.path.join(tmp, "crash")
        touch(crash)
        d = Daemon(tmp, "dgx-h100", dropin="engine:\n  retry-min: 10min\n  retry-max: 20min\n",
                   env=fault_env(tmp, FAKE_NVML_CRASH="nvmlDeviceGetMemoryInfo:2", FAKE_NVML_CRASH_FILE=crash))
        try:
            check(d.agent.proc.poll() is None, "the agent died with the library")
            state, msg = d.stage("nvml")
            check(state == "failed", "nvml stage is %s after a crash in NVML" % state)
            check("crashed with signal SEGV in nvmlDeviceGetMemoryInfo on GPU 1" in msg,
                  "nvml stage message does not say where NVML crashed: " + msg)
            note("stage message: %s", msg)
            check_degraded_pci_only(d, "NVML crashed")
            check_reads(probe_reads(d, 1.0), "after a crash")

            os.unlink(crash)
            d.reconcile()
            wait_until("the nvml stage to recover on Reconcile()",
                       lambda: d.stage("nvml")[0] == "done" and d.prop("State") == 's "ready"', 20)
            d.stop_clean()
        finally:
            d.close()


def children(pid):
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def test_sigterm_during_hung_call():
    """SIGTERM while a call hangs for ever: the daemon exits at once (the unit's stop timeout is 90 s) and
    leaves no worker behind."""
    with TempDir() as tmp:
        d = Daemon(tmp, "dgx-h100", wait_ready=False, dropin="nvml:\n  timeout: 5min\n",
                   env=fault_env(tmp, FAKE_NVML_HANG="nvmlDeviceGetMemoryInfo:1"))
        try:
            wait_until("the read to hang", lambda: "nvmlDeviceGetMemoryInfo hangs" in d.agent.output(), 20)
            workers = children(d.agent.proc.pid)
            t0 = time.monotonic()
            rc = d.agent.stop(signal.SIGTERM, timeout=int(30 * SCALE))
            took = time.monotonic() - t0
            note("exit %.0f ms after SIGTERM during a hung NVML call (rc %d)", took * 1e3, rc)
            check(rc == 0, "agent exited %d on SIGTERM:\n%s" % (rc, d.agent.output()))
            check(took < 5 * SCALE, "the agent took %.1f s to exit on SIGTERM" % took)
            for p in workers:
                wait_until("worker %d to go" % p, lambda: not os.path.exists("/proc/%d" % p) or
                           open("/proc/%d/stat" % p).read().split()[2] == "Z", 5)
        finally:
            d.close()


def test_reconcile_coalesced():
    """1000 Reconcile() calls in a row do not run 1000 passes: one asked for while a pass runs is queued
    once, one right after a pass waits out 500 ms and takes everything asked for meanwhile along."""
    with TempDir() as tmp:
        d = Daemon(tmp, "dgx-h100")
        try:
            conn = dbus.bus.BusConnection(d.bus.address)
            mgr = dbus.Interface(conn.get_object(AGENT_NAME, AGENT_PATH, introspect=False), MANAGER)
            start = len(d.notify.messages)
            t0 = time.monotonic()
            for _ in range(1000):
                mgr.Reconcile(timeout=5.0)
            took = time.monotonic() - t0
            time.sleep(1.5 * SCALE)  # the last queued pass runs
            d.notify.drain(0.1)
            passes = sum(1 for m in d.notify.messages[start:] if m.startswith("STATUS=Running stage probe"))
            note("1000 Reconcile() calls in %.1f s ran %d passes", took, passes)
            check(passes >= 1, "no pass after 1000 Reconcile() calls")
            check(passes <= 2 + took / 0.5, "1000 Reconcile() calls in %.1f s ran %d passes" % (took, passes))
            conn.close()
            d.stop_clean()
        finally:
            d.close()


def test_unprivileged_mig_reads_rate_limited():
    """ExportMigConfig (it reads NVML) as nobody: 5 per 5 s, then Busy; root is not limited."""
    with TempDir() as tmp:
        d = Daemon(tmp, "a100-sxm-mig")
        try:
            call = ["call", AGENT_NAME, AGENT_PATH, MANAGER, "ExportMigConfig"]
            results = [busctl(d.bus, *call, user="nobody", check_rc=None) for _ in range(8)]
            ok = sum(1 for p in results if p.returncode == 0)
            busy = [p for p in results if p.returncode != 0]
            check(ok == 5, "nobody got %d of 8 ExportMigConfig calls through (want 5)" % ok)
            check(all("too many MIG reads by unprivileged callers" in p.stderr for p in busy),
                  "the refusal does not say why: %r" % [p.stderr for p in busy])
            for _ in range(8):
                busctl(d.bus, *call)  # root: never limited
            d.stop_clean()
        finally:
            d.close()


MIG_CONFIG = os.path.join(os.environ.get("GNA_SOURCE_ROOT", os.path.join(os.path.dirname(__file__), "../..")),
                          "tests/fixtures/mig-parted/config-default.yaml")
GI_CREATE = "nvmlDeviceCreateGpuInstanceWithPlacement"


def mig_dropin(selected=True, timeout="2s"):
    return ("nvml:\n  timeout: %s\nengine:\n  retry-min: 10min\n  retry-max: 20min\nmig:\n  config-file: %s\n%s"
            % (timeout, MIG_CONFIG, "  selected: all-balanced\n" if selected else ""))


def test_hang_in_mig_create_at_start():
    """The mig stage's apply at start hangs in the GPU instance create (it runs in an NVML worker): D-Bus
    answers and the watchdog keeps its period meanwhile; the stage fails naming the call and the GPU, the
    GPU is rolled back; with the driver answering again, Reconcile() applies the config."""
    with TempDir() as tmp:
        hang = os.path.join(tmp, "hang")
        touch(hang)
        d = Daemon(tmp, "h200", wait_ready=False, dropin=mig_dropin(),
                   env=fault_env(tmp, FAKE_NVML_HANG=GI_CREATE + ":1", FAKE_NVML_HANG_FILE=hang))
        try:
            wait_until("the MIG create to hang", lambda: GI_CREATE + " hangs" in d.agent.output(), 30)
            t_hang = time.monotonic()
            times = probe_reads(d, 1.5 * SCALE, lambda: d.stage("mig")[0] == "running")
            check_reads(times, "a MIG create hanging (mig stage at start)")
            wait_until("the mig stage to fail", lambda: d.stage("mig")[0] == "failed", 20)
            check_watchdog(d, t_hang, time.monotonic(), "a MIG create hanging (mig stage at start)")
            state, msg = d.stage("mig")
            check(GI_CREATE + " on GPU 0 has not returned for 2 s" in msg,
                  "mig stage message does not name the call and the GPU: " + msg)
            check("GPU 0 (0000:4c:00.0): rolled back to the previous layout" in msg, "no rollback: " + msg)
            note("mig stage message: %s", msg)
            check(d.prop("MigConfigState", interface=MANAGER) == 's "failed"',
                  "MigConfigState %s" % d.prop("MigConfigState"))
            check(d.prop("State") != 's "ready"', "node ready with the MIG apply failed")
            check(d.agent.proc.poll() is None, "the agent died")

            os.unlink(hang)
            d.reconcile()
            wait_until("the mig stage to apply on Reconcile() once the create returns",
                       lambda: d.stage("mig")[0] == "done" and d.prop("MigConfigState") == 's "success"', 30)
            d.stop_clean()
        finally:
            d.close()


def _apply_async(d, name):
    return subprocess.Popen(["busctl", "--address=" + d.bus.address, "--timeout=120", "call", AGENT_NAME,
                             AGENT_PATH, MANAGER, "ApplyMigConfig", "ssb", name, "", "false"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _apply(d, name):
    """ApplyMigConfig, again while the pass a failed apply starts re-applies the request (Busy)."""
    end = time.monotonic() + 60 * SCALE
    while True:
        call = _apply_async(d, name)
        out, err = call.communicate(timeout=120 * SCALE)
        if "is already running" not in err or time.monotonic() > end:
            return call.returncode, out, err
        time.sleep(0.2)


def test_hang_and_crash_in_mig_create_over_dbus():
    """ApplyMigConfig while the GPU instance create hangs: the method answers later (asynchronously) with
    the call and GPU named, D-Bus reads and the watchdog go on meanwhile, AssertMigConfig answers in time;
    the same with a crash inside the create; once the library is fixed the same call succeeds."""
    with TempDir() as tmp:
        hang, crash = os.path.join(tmp, "hang"), os.path.join(tmp, "crash")
        d = Daemon(tmp, "h200", dropin=mig_dropin(selected=False),
                   env=fault_env(tmp, FAKE_NVML_HANG=GI_CREATE + ":1", FAKE_NVML_HANG_FILE=hang,
                                 FAKE_NVML_CRASH=GI_CREATE + ":1", FAKE_NVML_CRASH_FILE=crash))
        try:
            touch(hang)
            t0 = time.monotonic()
            call = _apply_async(d, "all-balanced")
            wait_until("the MIG create to hang", lambda: GI_CREATE + " hangs" in d.agent.output(), 20)
            times = probe_reads(d, 1.2 * SCALE, lambda: call.poll() is None)
            check_reads(times, "a MIG create hanging (ApplyMigConfig)")
            t1 = time.monotonic()
            p = busctl(d.bus, "call", AGENT_NAME, AGENT_PATH, MANAGER, "AssertMigConfig", "ss", "all-balanced", "",
                       check_rc=None)
            took = time.monotonic() - t1
            note("AssertMigConfig answered in %.0f ms while a MIG create hangs (rc %d)", took * 1e3, p.returncode)
            check(took <= 1.0 * SCALE, "AssertMigConfig took %.0f ms while a MIG create hangs" % (took * 1e3))
            out, err = call.communicate(timeout=60 * SCALE)
            check_watchdog(d, t0, time.monotonic(), "a MIG create hanging (ApplyMigConfig)")
            check(call.returncode != 0 and GI_CREATE + " on GPU 0 has not returned for 2 s" in err,
                  "ApplyMigConfig while the create hangs: rc %d %s %s" % (call.returncode, out, err))
            note("ApplyMigConfig error: %s", err.strip())

            touch(crash)
            os.unlink(hang)
            rc, out, err = _apply(d, "all-balanced")
            check(rc != 0 and "crashed with signal SEGV in " + GI_CREATE + " on GPU 0" in err,
                  "ApplyMigConfig while the create crashes: rc %d %s %s" % (rc, out, err))
            note("ApplyMigConfig error: %s", err.strip())
            check(d.agent.proc.poll() is None, "the agent died with the library")
            check_reads(probe_reads(d, 0.5), "after a crash in a MIG create")

            os.unlink(crash)
            rc, out, err = _apply(d, "all-balanced")
            check(rc == 0 and '"success"' in out, "ApplyMigConfig once fixed: %s %s" % (out, err))
            check(d.prop("MigConfigState") == 's "success"', "MigConfigState %s" % d.prop("MigConfigState"))
            d.stop_clean()
        finally:
            d.close()


def _busctl_async(d, *args):
    return subprocess.Popen(["busctl", "--address=" + d.bus.address, "--timeout=120", "call", AGENT_NAME,
                             AGENT_PATH, MANAGER] + list(args),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_hang_in_mig_read_assert_export():
    """AssertMigConfig and ExportMigConfig while an NVML read of the MIG state hangs: they read in an NVML
    worker and answer asynchronously, with the call and GPU named, after nvml.timeout; D-Bus reads go on
    meanwhile; once the library answers again both work."""
    with TempDir() as tmp:
        hang = os.path.join(tmp, "hang")
        # The first call of the MIG read of every GPU (compute processes are asked only before an apply).
        call_name = "nvmlDeviceGetMigMode"
        d = Daemon(tmp, "h200", dropin=mig_dropin(selected=False),
                   env=fault_env(tmp, FAKE_NVML_HANG=call_name + ":1", FAKE_NVML_HANG_FILE=hang))
        try:
            touch(hang)
            t0 = time.monotonic()
            calls = [_busctl_async(d, "AssertMigConfig", "ss", "all-balanced", ""),
                     _busctl_async(d, "ExportMigConfig")]
            wait_until("the MIG read to hang", lambda: call_name + " hangs" in d.agent.output(), 20)
            times = probe_reads(d, 1.0 * SCALE, lambda: any(c.poll() is None for c in calls))
            check_reads(times, "a MIG read hanging (AssertMigConfig, ExportMigConfig)")
            for c, what in zip(calls, ("AssertMigConfig", "ExportMigConfig")):
                out, err = c.communicate(timeout=60 * SCALE)
                check(c.returncode != 0 and call_name + " on GPU 0 has not returned for 2 s" in err,
                      "%s while a MIG read hangs: rc %d %s %s" % (what, c.returncode, out, err))
                note("%s answered after %.1f s: %s", what, time.monotonic() - t0, err.strip()[:120])
            check_watchdog(d, t0, time.monotonic(), "a MIG read hanging (AssertMigConfig, ExportMigConfig)")

            os.unlink(hang)
            p = busctl(d.bus, "call", AGENT_NAME, AGENT_PATH, MANAGER, "AssertMigConfig", "ss", "all-balanced", "")
            check(p.stdout.startswith("bs false"), "AssertMigConfig once the read returns: %s" % p.stdout)
            p = busctl(d.bus, "call", AGENT_NAME, AGENT_PATH, MANAGER, "ExportMigConfig")
            check("mig-configs" in p.stdout, "ExportMigConfig once the read returns: %s" % p.stdout)
            d.stop_clean()
        finally:
            d.close()


# Asked on the MIG reader right before an apply, for the GPUs the plan changes (after the read of the
# layout the plan comes from): the last MIG read before the writes.
PROCS = "nvmlDeviceGetComputeRunningProcesses_v3"


def test_hang_and_crash_in_mig_planning_read():
    """ApplyMigConfig while the read of the MIG layout before planning hangs (it runs on the MIG reader, an
    NVML worker, not on the loop): D-Bus reads answer within 100 ms and the watchdog keeps its period; the
    call answers with the hung call named; the same with a crash in that read (the daemon lives); once the
    library answers again the same call succeeds."""
    with TempDir() as tmp:
        hang, crash = os.path.join(tmp, "hang"), os.path.join(tmp, "crash")
        d = Daemon(tmp, "h200", dropin=mig_dropin(selected=False),
                   env=fault_env(tmp, FAKE_NVML_HANG=PROCS + ":1", FAKE_NVML_HANG_FILE=hang,
                                 FAKE_NVML_CRASH=PROCS + ":1", FAKE_NVML_CRASH_FILE=crash))
        try:
            touch(hang)
            t0 = time.monotonic()
            call = _apply_async(d, "all-balanced")
            wait_until("the planning read to hang", lambda: PROCS + " hangs" in d.agent.output(), 20)
            times = probe_reads(d, 1.2 * SCALE, lambda: call.poll() is None)
            check_reads(times, "the MIG read before planning hanging (ApplyMigConfig)")
            out, err = call.communicate(timeout=60 * SCALE)
            check_watchdog(d, t0, time.monotonic(), "the MIG read before planning hanging (ApplyMigConfig)")
            check(call.returncode != 0 and PROCS + " on GPU 0 has not returned for 2 s" in err,
                  "ApplyMigConfig while the planning read hangs: rc %d %s %s" % (call.returncode, out, err))
            note("ApplyMigConfig error: %s", err.strip())
            check(d.prop("MigConfigState", interface=MANAGER) == 's "failed"',
                  "MigConfigState %s" % d.prop("MigConfigState"))

            touch(crash)
            os.unlink(hang)
            rc, out, err = _apply(d, "all-balanced")
            check(rc != 0 and "crashed with signal SEGV in " + PROCS + " on GPU 0" in err,
                  "ApplyMigConfig while the planning read crashes: rc %d %s %s" % (rc, out, err))
            note("ApplyMigConfig error: %s", err.strip())
            check(d.agent.proc.poll() is None, "the agent died with the library")
            check_reads(probe_reads(d, 0.5), "after a crash in the planning read")

            os.unlink(crash)
            rc, out, err = _apply(d, "all-balanced")
            check(rc == 0 and '"success"' in out, "ApplyMigConfig once fixed: %s %s" % (out, err))
            check(d.prop("MigConfigState") == 's "success"', "MigConfigState %s" % d.prop("MigConfigState"))
            d.stop_clean()
        finally:
            d.close()


def test_hang_in_mig_planning_read_at_start():
    """The mig stage's read before planning hangs at start: D-Bus answers and the watchdog keeps its
    period while it hangs, READY=1 comes, the stage fails naming the call; Reconcile() applies once the
    library answers."""
    # The reads are probed while the call hangs, not after its deadline, when the stages after mig (cdi,
    # labels: CPU work on the loop, slow under valgrind) run.
    timeout = int(6 * SCALE)
    with TempDir() as tmp:
        hang = os.path.join(tmp, "hang")
        touch(hang)
        d = Daemon(tmp, "h200", wait_ready=False, dropin=mig_dropin(timeout="%ds" % timeout),
                   env=fault_env(tmp, FAKE_NVML_HANG=PROCS + ":1", FAKE_NVML_HANG_FILE=hang))
        try:
            wait_until("the planning read to hang", lambda: PROCS + " hangs" in d.agent.output(), 30)
            t_hang = time.monotonic()
            times = probe_reads(d, 1.5, lambda: d.stage("mig")[0] == "running")
            check_reads(times, "the MIG read before planning hanging (mig stage at start)")
            d.notify.wait_for("READY=1", 30 * SCALE)
            wait_until("the mig stage to fail", lambda: d.stage("mig")[0] == "failed", 20 + timeout)
            check_watchdog(d, t_hang, time.monotonic(), "the MIG read before planning hanging (mig stage at start)")
            state, msg = d.stage("mig")
            check(PROCS + " on GPU 0 has not returned for %d s" % timeout in msg, "mig stage message: " + msg)
            note("mig stage message: %s", msg)

            os.unlink(hang)
            d.reconcile()
            wait_until("the mig stage to apply on Reconcile() once the read returns",
                       lambda: d.stage("mig")[0] == "done" and d.prop("MigConfigState") == 's "success"', 30)
            d.stop_clean()
        finally:
            d.close()


def _maps_nvml(pid):
    try:
        with open("/proc/%d/maps" % pid) as f:
            return [line.split()[-1] for line in f if "libnvidia-ml" in line]
    except OSError:
        return []


def test_daemon_never_maps_nvml():
    """The daemon process never loads libnvidia-ml (the fake here): after the mig stage's apply at start and
    an ApplyMigConfig() that changes the layout (planning reads, writes and the re-read after), its own
    /proc/PID/maps holds no libnvidia-ml, while its NVML workers (its children) do."""
    with TempDir() as tmp:
        d = Daemon(tmp, "h200", dropin=mig_dropin())
        try:
            wait_until("the mig stage", lambda: d.stage("mig")[0] == "done", 30)
            rc, out, err = _apply(d, "all-1g.18gb")
            check(rc == 0 and '"success"' in out, "ApplyMigConfig: %s %s" % (out, err))
            pid = d.agent.proc.pid
            mapped = _maps_nvml(pid)
            check(not mapped, "the daemon (pid %d) has NVML mapped: %s" % (pid, mapped))
            workers = [c for c in children(pid) if _maps_nvml(c)]
            note("daemon pid %d: no libnvidia-ml mapped; %d NVML worker(s) with it mapped: %s", pid, len(workers),
                 workers)
            check(workers, "no NVML worker holds the library (the check would not see it)")
            d.stop_clean()
        finally:
            d.close()


def test_slow_gpu_reset():
    """The latency model's GPU reset (fake-nvml-ctl, the reset program, `reset:*:MS`): an A100 MIG mode
    change waits for a 2 s reset per GPU. The reset is a child process: D-Bus answers within 100 ms and
    the watchdog keeps its period meanwhile, and the apply takes at least the resets' time."""
    with TempDir() as tmp:
        ctl_fake = os.path.join(os.path.dirname(os.environ["GNA_FAKE_NVML"]), "fake-nvml-ctl")
        # The reset program, marking when a reset starts: D-Bus is probed while the first one runs (the
        # forks of the apply's NVML workers are outside that window: slow in an ASan build).
        started = os.path.join(tmp, "reset-started")
        reset = os.path.join(tmp, "reset")
        with open(reset, "w") as f:
            f.write('#!/bin/sh\ntouch %s\nexec %s "$@"\n' % (started, ctl_fake))
        os.chmod(reset, 0o755)
        d = Daemon(tmp, "a100-pcie", dropin=mig_dropin(selected=False),
                   env=fault_env(tmp, FAKE_NVML_DELAY="reset:*:2000", GNA_MIG_RESET_PROGRAM=reset))
        try:
            t0 = time.monotonic()
            call = _apply_async(d, "all-1g.10gb")
            wait_until("the first GPU reset", lambda: os.path.exists(started), 30 * SCALE)
            times = probe_reads(d, 1.5, lambda: call.poll() is None)
            out, err = call.communicate(timeout=60 * SCALE)
            took = time.monotonic() - t0
            check(call.returncode == 0 and '"success"' in out, "ApplyMigConfig: %d %s %s" % (call.returncode, out, err))
            check_reads(times, "two 2 s GPU resets")
            check_watchdog(d, t0, time.monotonic(), "two 2 s GPU resets")
            note("ApplyMigConfig with two 2 s GPU resets took %.1f s", took)
            check(took >= 4.0, "the apply took %.1f s: the resets' delay was not applied" % took)
            d.stop_clean()
        finally:
            d.close()


TESTS = [test_hang_in_init, test_hang_in_gpu_read, test_crash_in_library, test_sigterm_during_hung_call,
         test_reconcile_coalesced, test_unprivileged_mig_reads_rate_limited, test_hang_in_mig_create_at_start,
         test_hang_and_crash_in_mig_create_over_dbus, test_hang_in_mig_read_assert_export,
         test_hang_and_crash_in_mig_planning_read, test_hang_in_mig_planning_read_at_start, test_daemon_never_maps_nvml,
         test_slow_gpu_reset]

if __name__ == "__main__":
    sys.exit(tap_main(TESTS, sys.argv[1:]))
