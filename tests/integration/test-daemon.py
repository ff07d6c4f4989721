#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Integration tests: the real daemon on a private system-like bus against simulated nodes.
TAP output. GNA_WRAPPER (e.g. valgrind) wraps the daemon; GNA_TIMEOUT_SCALE stretches timeouts."""
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (AGENT, Agent, Bus, CTL, Fail, Node, Notify, SRC, TempDir, busctl, check,  # noqa: E402
                     get_property, run, tap_main)

from harness import timeout_scale  # noqa: E402
SCALE = timeout_scale()
VALGRIND = "valgrind" in os.environ.get("GNA_WRAPPER", "")


def version():
    return run([AGENT, "--version"], check_rc=0).stdout.split()[1]


def golden(name):
    with open(os.path.join(SRC, "tests/integration/golden", name)) as f:
        return f.read().replace("@VERSION@", version())


def stop_clean(agent, notify=None):
    rc = agent.stop(signal.SIGTERM, timeout=int(60 * SCALE))
    check(rc == 0, "agent exited %d on SIGTERM (valgrind errors are 99):\n%s" % (rc, agent.output()))
    if notify:
        notify.drain(0.2)
        check("STOPPING=1" in notify.messages, "no STOPPING=1 on SIGTERM")


def wait_until(what, fn, timeout):
    deadline = time.monotonic() + timeout * SCALE
    while time.monotonic() < deadline:
        if fn():
            return
        time.sleep(0.05)
    raise Fail("timed out waiting for " + what)


class Daemon:
    """A running agent on a private bus with a notify listener, for one test."""

    def __init__(self, tmp, node="dgx-h100", extra_yaml="", env=None):
        self.bus = Bus(tmp)
        self.notify = Notify(tmp)
        self.node = Node(tmp, node, extra_yaml)
        self.agent = Agent(self.node, self.bus, self.notify, extra_env=env)
        try:
            self.notify.wait_for("READY=1", 60 * SCALE)
        except Fail:
            self.close()
            raise Fail("no READY=1; agent output:\n" + self.agent.output())

    def close(self):
        if self.agent.proc.poll() is None:
            self.agent.proc.kill()
            self.agent.proc.wait()
        self.notify.close()
        self.bus.stop()


def test_ready_status_properties():
    with TempDir() as tmp:
        d = Daemon(tmp, env={"WATCHDOG_USEC": str(int(1_000_000 * SCALE))})
        try:
            d.notify.wait_for("WATCHDOG=1", 5 * SCALE)
            check("Ready: 8 GPUs." in d.notify.statuses(), "STATUS= never said ready: %r" % d.notify.statuses())
            check(any(s.startswith("Running stage probe") for s in d.notify.statuses()),
                  "STATUS= never named the probe stage: %r" % d.notify.statuses())

            check(get_property(d.bus, "Ready") == "b true", "Ready is not true")
            check(get_property(d.bus, "State") == 's "ready"', "State is not ready")
            check(get_property(d.bus, "Stage") == 's "ready"', "Stage is not ready")
            check(get_property(d.bus, "GpuCount") == "u 8", "GpuCount is not 8")
            with open(os.path.join(d.node.node, "proc/sys/kernel/osrelease")) as f:
                kver = f.read().strip()
            check(get_property(d.bus, "KernelRelease") == 's "%s"' % kver, "KernelRelease is not the node's")
            check(get_property(d.bus, "ConfigError") == 's ""', "ConfigError set on a valid config")
            stages = get_property(d.bus, "Stages")
            names = ("probe", "driver", "devices", "fabric", "nvml", "mig", "cdi", "labels", "consumers")
            check(stages.startswith('a(sstts) %d "probe" "done"' % len(names)), "Stages: " + stages)
            for name in names:
                check('"%s" "done"' % name in stages or '"%s" "skipped"' % name in stages,
                      "stage %s neither done nor skipped: %s" % (name, stages))
            for name in ("nvml", "cdi", "labels"):
                check('"%s" "done"' % name in stages, "Stages: " + stages)
            labels = get_property(d.bus, "Labels")
            check('"nvidia.com/gpu.count" "8"' in labels, "Labels: " + labels)

            gpu0 = "/org/gpunodeagent/Agent1/gpu/0"
            addr = get_property(d.bus, "PciAddress", gpu0, "org.gpunodeagent.Agent1.Gpu")
            check(addr.startswith('s "0000:'), "gpu/0 PciAddress: " + addr)
            check(get_property(d.bus, "Index", "/org/gpunodeagent/Agent1/gpu/7", "org.gpunodeagent.Agent1.Gpu") == "u 7",
                  "gpu/7 missing")
            check(busctl(d.bus, "introspect", "org.gpunodeagent.Agent1", "/org/gpunodeagent/Agent1/gpu/8",
                         check_rc=None).returncode != 0, "gpu/8 exists on an 8-GPU node")

            with open(d.node.feature_file()) as f:
                content = f.read()
            check(content == golden("dgx-h100.features"), "feature file differs from golden:\n" + content)

            st = run([CTL, "status"], bus=d.bus, check_rc=0).stdout
            check("ready" in st and "probe" in st and "labels" in st, "gpunodectl status:\n" + st)
            gpus = json.loads(run([CTL, "--json", "gpus"], bus=d.bus, check_rc=0).stdout)
            gpus = gpus["gpus"] if isinstance(gpus, dict) else gpus
            check(len(gpus) == 8, "gpunodectl --json gpus listed %d GPUs" % len(gpus))
            lab = run([CTL, "labels"], bus=d.bus, check_rc=0).stdout
            check("nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3" in lab, "gpunodectl labels:\n" + lab)
            run([CTL, "wait-ready", "--timeout", "10"], bus=d.bus, check_rc=0)
            stop_clean(d.agent, d.notify)
        finally:
            d.close()


def test_reload_broken_config_keeps_old():
    with TempDir() as tmp:
        d = Daemon(tmp)
        try:
            broken = os.path.join(d.node.confd, "50-broken.yaml")
            with open(broken, "w") as f:
                f.write("labels:\n  enabled: [unclosed\n")
            p = busctl(d.bus, "call", "org.gpunodeagent.Agent1", "/org/gpunodeagent/Agent1",
                       "org.gpunodeagent.Agent1.Manager", "Reload", check_rc=None)
            check(p.returncode != 0, "Reload with a broken config succeeded")
            check("50-broken.yaml" in p.stderr, "Reload error does not name the file: " + p.stderr)
            err = get_property(d.bus, "ConfigError")
            check("50-broken.yaml:" in err, "ConfigError does not name file:line: " + err)
            check(get_property(d.bus, "Ready") == "b true", "a failed reload changed readiness")

            # SIGHUP takes the same path and speaks the notify protocol.
            start = len(d.notify.messages)
            d.agent.proc.send_signal(signal.SIGHUP)
            i = d.notify.wait_for("RELOADING=1", 10 * SCALE, start)
            d.notify.wait_for("READY=1", 10 * SCALE, i)
            check(d.agent.proc.poll() is None, "agent died on SIGHUP with a broken config")

            # Unknown key: also rejected, with the key named.
            with open(broken, "w") as f:
                f.write("labels:\n  expiri: 1h\n")
            p = busctl(d.bus, "call", "org.gpunodeagent.Agent1", "/org/gpunodeagent/Agent1",
                       "org.gpunodeagent.Agent1.Manager", "Reload", check_rc=None)
            check(p.returncode != 0 and "expiri" in p.stderr, "unknown key accepted or not named: " + p.stderr)

            with open(broken, "w") as f:
                f.write("labels:\n  expiry: 1h\n")
            busctl(d.bus, "call", "org.gpunodeagent.Agent1", "/org/gpunodeagent/Agent1",
                   "org.gpunodeagent.Agent1.Manager", "Reload")
            wait_until("ConfigError cleared", lambda: get_property(d.bus, "ConfigError") == 's ""', 10)

            def has_expiry():
                with open(d.node.feature_file()) as f:
                    return "# +expiry-time=" in f.read()
            wait_until("expiry directive in the feature file", has_expiry, 10)
            stop_clean(d.agent)
        finally:
            d.close()


def test_policy_denies_nobody():
    with TempDir() as tmp:
        d = Daemon(tmp)
        try:
            busctl(d.bus, "get-property", "org.gpunodeagent.Agent1", "/org/gpunodeagent/Agent1",
                   "org.gpunodeagent.Agent1.Manager", "Ready", user="nobody")
            busctl(d.bus, "call", "org.gpunodeagent.Agent1", "/org/gpunodeagent/Agent1",
                   "org.gpunodeagent.Agent1.Manager", "GetLabels", user="nobody")
            for method in ("Reload", "Reconcile"):
                p = busctl(d.bus, "call", "org.gpunodeagent.Agent1", "/org/gpunodeagent/Agent1",
                           "org.gpunodeagent.Agent1.Manager", method, user="nobody", check_rc=None)
                check(p.returncode != 0, "%s allowed for nobody" % method)
                check("ccess" in p.stderr or "denied" in p.stderr, "%s denial unclear: %s" % (method, p.stderr))
            p = run([CTL, "reconcile"], bus=d.bus, user="nobody")
            check(p.returncode == 4, "gpunodectl reconcile as nobody exited %d, wanted 4: %s" % (p.returncode, p.stderr))
            stop_clean(d.agent)
        finally:
            d.close()


def test_reconcile_no_churn():
    with TempDir() as tmp:
        d = Daemon(tmp)
        try:
            st1 = os.stat(d.node.feature_file())
            start = len(d.notify.messages)
            busctl(d.bus, "call", "org.gpunodeagent.Agent1", "/org/gpunodeagent/Agent1",
                   "org.gpunodeagent.Agent1.Manager", "Reconcile")
            run([CTL, "reconcile"], bus=d.bus, check_rc=0)
            wait_until("a new pass", lambda: (d.notify.drain(0.05) or True) and
                       any(m.startswith("STATUS=Running stage") for m in d.notify.messages[start:]), 10)
            time.sleep(0.3 * SCALE)
            st2 = os.stat(d.node.feature_file())
            check((st1.st_ino, st1.st_mtime_ns) == (st2.st_ino, st2.st_mtime_ns), "Reconcile rewrote an unchanged file")
            stop_clean(d.agent)
        finally:
            d.close()


def test_bus_name_taken():
    with TempDir() as tmp:
        d = Daemon(tmp)
        try:
            other = os.path.join(tmp, "other")
            os.makedirs(other)
            second = Agent(Node(other, "dgx-h100"), d.bus)
            rc = second.proc.wait(int(30 * SCALE))
            check(rc != 0, "a second agent started on a taken bus name")
            check("already owned" in second.output(), "second agent's error unclear:\n" + second.output())
            check(d.agent.proc.poll() is None, "the first agent died")
            stop_clean(d.agent)
        finally:
            d.close()


def test_check_config_and_oneshot():
    with TempDir() as tmp:
        node = Node(tmp, "h200")
        p = run([AGENT, "--check-config"] + node.args(), check_rc=0, node=node)
        check("pci-ids: " in p.stdout and node.features in p.stdout, "--check-config output:\n" + p.stdout)
        with open(os.path.join(node.confd, "10-bad.yaml"), "w") as f:
            f.write("engine:\n  retry-min: soon\n")
        p = run([AGENT, "--check-config"] + node.args(), check_rc=1, node=node)
        check("10-bad.yaml:2:" in p.stderr and "retry-min" in p.stderr, "--check-config error:\n" + p.stderr)
        # Invalid config at start-up: refuse to start, say why.
        p = run([AGENT, "--oneshot"] + node.args(), check_rc=1, node=node)
        check("10-bad.yaml:2:" in p.stderr, "start-up error:\n" + p.stderr)
        os.unlink(os.path.join(node.confd, "10-bad.yaml"))

        p = run(WRAP + [AGENT, "--oneshot"] + node.args(), timeout=int(120 * SCALE), node=node)
        check(p.returncode == 0, "--oneshot on h200 exited %d:\n%s" % (p.returncode, p.stderr))
        with open(node.feature_file()) as f:
            check("nvidia.com/gpu.count=1\n" in f.read(), "oneshot feature file wrong")
        check(os.path.exists(os.path.join(node.run, "gpu-node-agent/ready")), "no ready file after oneshot")


def test_named_config_missing():
    """A file named with --config that does not exist is an error, not a silent run on defaults."""
    with TempDir() as tmp:
        node = Node(tmp, "h200")
        missing = os.path.join(tmp, "nonexistent.yaml")
        for mode in ("--check-config", "--oneshot"):
            p = run([AGENT, mode, "--config", missing, "--config-dir", node.confd], check_rc=1, node=node)
            check(missing in p.stderr and "No such file" in p.stderr,
                  "%s with a missing --config file: error does not name it:\n%s" % (mode, p.stderr))


def test_cleanup_removes_outputs():
    """--cleanup (the package's removal step) takes back the feature file, our CDI spec and the
    readiness files, and nothing else: another producer's CDI spec stays."""
    with TempDir() as tmp:
        node = Node(tmp, "h200")
        run(WRAP + [AGENT, "--oneshot"] + node.args(), check_rc=0, timeout=int(120 * SCALE), node=node)
        rundir = os.path.join(node.run, "gpu-node-agent")
        ours = [node.feature_file(), node.cdi_spec, os.path.join(rundir, "ready"), os.path.join(rundir, "state")]
        for f in ours:
            check(os.path.exists(f), "%s not written by --oneshot" % f)
        other = os.path.join(tmp, "other-file")
        with open(other, "w") as f:
            f.write("keep me\n")
        p = run(WRAP + [AGENT, "--cleanup"] + node.args(), check_rc=0, node=node)
        for f in ours:
            check(not os.path.exists(f), "%s left by --cleanup:\n%s" % (f, p.stderr))
        check(node.feature_file() in p.stderr and node.cdi_spec in p.stderr, "--cleanup does not say what it removed:\n" + p.stderr)
        check(not os.listdir(node.features), "features.d not empty after --cleanup: %r" % os.listdir(node.features))
        check(os.path.exists(other) and os.path.isdir(node.state), "--cleanup removed what is not its output")
        # A CDI spec of the same name written by someone else (nvidia-ctk) is not ours to remove.
        with open(node.cdi_spec, "w") as f:
            f.write("# generated by nvidia-ctk\ncdiVersion: 0.5.0\n")
        p = run(WRAP + [AGENT, "--cleanup"] + node.args(), check_rc=0, node=node)
        check(os.path.exists(node.cdi_spec) and "not written by gpu-node-agent" in p.stderr,
              "--cleanup removed a foreign CDI spec or did not say why it kept it:\n" + p.stderr)
        # A symlink planted at the spec's name is not followed, even to a file that looks like ours.
        os.unlink(node.cdi_spec)
        target = os.path.join(tmp, "looks-like-ours.yaml")
        with open(target, "w") as f:
            f.write("# Written by gpu-node-agent: planted\n")
        os.symlink(target, node.cdi_spec)
        p = run(WRAP + [AGENT, "--cleanup"] + node.args(), check_rc=0, node=node)
        check(os.path.islink(node.cdi_spec) and os.path.exists(target) and "not a regular file" in p.stderr,
              "--cleanup followed or removed a symlink at the CDI spec's name:\n" + p.stderr)
        # A broken configuration does not keep stale labels: the defaults are used, the error said.
        with open(os.path.join(node.confd, "10-bad.yaml"), "w") as f:
            f.write("labels: [\n")
        p = run([AGENT, "--cleanup", "--root", os.path.join(tmp, "root")] + node.args(), check_rc=0, node=node)
        check("10-bad.yaml" in p.stderr and "default locations" in p.stderr, "--cleanup with a broken config:\n" + p.stderr)


def test_features_dir_unusable():
    with TempDir() as tmp:
        node = Node(tmp, "l40s", features=os.path.join(tmp, "missing-parent/features.d"))
        p = run(WRAP + [AGENT, "--oneshot"] + node.args(), timeout=int(120 * SCALE), node=node)
        check(p.returncode == 1, "--oneshot with an unusable features dir exited %d" % p.returncode)
        check("missing-parent" in p.stderr, "error does not name the directory:\n" + p.stderr)
        check(not os.path.exists(os.path.join(node.run, "gpu-node-agent/ready")), "ready file despite a failure")
        # The parent exists: the directory is created.
        node2 = Node(os.path.join(tmp), "l40s", features=os.path.join(tmp, "features-new.d"))
        run(WRAP + [AGENT, "--oneshot"] + node2.args(), check_rc=0, timeout=int(120 * SCALE), node=node2)
        check(os.path.isfile(node2.feature_file()), "features dir not created")


WRAP = [w for w in os.environ.get("GNA_WRAPPER", "").split() if w]

TESTS = [
    test_ready_status_properties,
    test_reload_broken_config_keeps_old,
    test_policy_denies_nobody,
    test_reconcile_no_churn,
    test_bus_name_taken,
    test_check_config_and_oneshot,
    test_features_dir_unusable,
    test_named_config_missing,
    test_cleanup_removes_outputs,
]


def main():
    return tap_main(TESTS, sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
