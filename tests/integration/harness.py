# SPDX-License-Identifier: MIT
"""Runs the real gpu-node-agent binary against a simulated node on a private, system-like dbus-daemon
that includes our policy file, with an sd_notify listener. Shared by the integration tests and the
benchmarks. Python stdlib only (run with /usr/bin/python3)."""
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

SRC = os.environ.get("GNA_SOURCE_ROOT", os.path.abspath(os.path.join(os.path.dirname(__file__), "../..")))
BUILD = os.environ.get("GNA_BUILD_ROOT", os.path.join(SRC, "build"))
AGENT = os.environ.get("GNA_AGENT", os.path.join(BUILD, "gpu-node-agent"))
CTL = os.environ.get("GNA_CTL", os.path.join(BUILD, "gpunodectl"))
NODES = os.environ.get("GNA_FIXTURE_NODES", os.path.join(BUILD, "tests/fixtures/nodes"))
PCI_IDS = os.environ.get("GNA_FIXTURE_PCI_IDS", os.path.join(SRC, "tests/fixtures/pci.ids"))
FAKE_NVML = os.environ.get("GNA_FAKE_NVML", os.path.join(BUILD, "tests/fakes/libnvidia-ml.so.1"))
WRAPPER = shlex.split(os.environ.get("GNA_WRAPPER", ""))



def timeout_scale():
    """How much to stretch a test's time limits: GNA_TIMEOUT_SCALE (6 under valgrind; default 1)
    times the 1-minute load average per CPU when it is above 1. The limits prove that the daemon
    does not block (a stuck loop shows the injected hang, seconds, not a stretched step); on a busy
    machine — the suite runs its vm stream beside these tests, CI machines are shared — every step
    of the daemon, the bus and the test itself stretches with the load."""
    scale = float(os.environ.get("GNA_TIMEOUT_SCALE", "1"))
    try:
        load = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        load = 0.0
    return scale * max(1.0, load)


class Fail(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Fail(what)


class Bus:
    """A private dbus-daemon with the system bus's default-deny policy plus ours."""

    def __init__(self, tmp):
        self.sock = os.path.join(tmp, "system_bus_socket")
        conf = os.path.join(tmp, "bus.conf")
        with open(os.path.join(SRC, "tests/integration/system-like.conf.in")) as f:
            template = f.read()
        with open(conf, "w") as f:
            f.write(template.replace("@SOCKET@", self.sock)
                    .replace("@POLICY@", os.path.join(SRC, "units/org.gpunodeagent.Agent1.conf")))
        # Its stderr (e.g. "Failed to set fd limit" when not allowed to) goes to a file, not the TAP stream.
        self.log = open(os.path.join(tmp, "dbus-daemon.log"), "w")
        self.proc = subprocess.Popen(["dbus-daemon", "--config-file=" + conf, "--nofork", "--print-address"],
                                     stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.address = self.proc.stdout.readline().strip()
        check(self.address.startswith("unix:"), "dbus-daemon did not start")
        os.chmod(tmp, 0o755)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)
        self.proc.stdout.close()
        self.log.close()


class Notify:
    """An sd_notify listener: a thread drains the socket continuously, as systemd does (a full datagram
    queue would block the daemon inside sd_notify), and collects every message."""

    def __init__(self, tmp):
        self.path = os.path.join(tmp, "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.2)
        self.messages = []
        self.times = []  # time.monotonic() of each message's arrival
        self.cond = threading.Condition()
        self.stopped = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stopped:
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            now = time.monotonic()
            with self.cond:
                lines = data.decode().split("\n")
                self.messages.extend(lines)
                self.times.extend([now] * len(lines))
                self.cond.notify_all()

    def drain(self, timeout=0.0):
        """Waits up to timeout for anything new (kept for callers that poll)."""
        with self.cond:
            self.cond.wait(timeout if timeout > 0 else 0.0001)

    def wait_for(self, line, timeout, start=0):
        """Waits until `line` is among the messages received after index `start`; returns its index."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for i in range(start, len(self.messages)):
                    if self.messages[i] == line:
                        return i
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Fail("timed out waiting for %r on NOTIFY_SOCKET; got %r" % (line, self.messages[start:]))
                self.cond.wait(min(left, 0.5))

    def arrivals(self, line):
        """time.monotonic() of every arrival of `line` (e.g. WATCHDOG=1)."""
        with self.cond:
            return [t for m, t in zip(self.messages, self.times) if m == line]

    def statuses(self):
        with self.cond:
            return [m[len("STATUS="):] for m in self.messages if m.startswith("STATUS=")]

    def close(self):
        self.stopped = True
        self.thread.join(2)
        self.sock.close()


class Node:
    """A temporary config + output tree around a simulated node."""

    def __init__(self, tmp, node, extra_yaml="", features=None, nvml_library=None, pci_ids=PCI_IDS):
        """pci_ids=None leaves paths.pci-ids unset: the agent names devices from the host's udev hwdb and
        pci.ids, as on a real host (the benchmark); the tests use the fixture's, for stable names."""
        self.tmp = tmp
        self.node = os.path.join(NODES, node)
        check(os.path.isdir(self.node), "fixture node %s missing (build the tests first)" % self.node)
        self.features = features or os.path.join(tmp, "features.d")
        self.run = os.path.join(tmp, "run")
        self.state = os.path.join(tmp, "state")
        self.confd = os.path.join(tmp, "conf.d")
        # The devices stage creates nodes here (never in the build's fixture tree).
        self.dev = os.path.join(tmp, "dev")
        os.makedirs(self.dev, exist_ok=True)
        os.makedirs(self.run, exist_ok=True)
        os.makedirs(self.confd, exist_ok=True)
        self.config = os.path.join(tmp, "agent.yaml")
        self.cdi_spec = os.path.join(self.run, "cdi/nvidia.yaml")
        # The fake NVML reads the node's description; its state (MIG layout) lives with the test.
        self.nvml_env = {"FAKE_NVML_DESCRIPTION": os.path.join(self.node, "nvml.yaml"),
                         "FAKE_NVML_STATE": os.path.join(tmp, "nvml.state")}
        with open(self.config, "w") as f:
            f.write("paths:\n  sys: %s/sys\n  proc: %s/proc\n  dev: %s\n  run: %s\n  state: %s\n"
                    "%snvml:\n  library: %s\nlabels:\n  directory: %s\ncdi:\n  driver-root: %s\n%s"
                    % (self.node, self.node, self.dev, self.run, self.state,
                       "  pci-ids: %s\n" % pci_ids if pci_ids else "",
                       nvml_library or FAKE_NVML, self.features, self.node, extra_yaml))

    def args(self):
        return ["--config", self.config, "--config-dir", self.confd]

    def feature_file(self):
        return os.path.join(self.features, "gpu-node-agent")


class Agent:
    def __init__(self, node, bus=None, notify=None, extra_env=None, extra_args=(), wrapper=None):
        env = dict(os.environ)
        env.pop("NOTIFY_SOCKET", None)
        env.pop("WATCHDOG_USEC", None)
        if bus:
            env["DBUS_SYSTEM_BUS_ADDRESS"] = bus.address
        if notify:
            env["NOTIFY_SOCKET"] = notify.path
        env.update(node.nvml_env)
        env.update(extra_env or {})
        self.log_path = os.path.join(node.tmp, "agent-%d.log" % time.monotonic_ns())
        self.log = open(self.log_path, "w")
        cmd = (WRAPPER if wrapper is None else wrapper) + [AGENT] + node.args() + list(extra_args)
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def output(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def wait_output(self, text, timeout, what, poll=0.1):
        """Waits until text is in the agent's output; fails naming what was awaited, or that it died."""
        deadline = time.monotonic() + timeout
        while text not in self.output():
            check(time.monotonic() < deadline, "%s:\n%s" % (what, self.output()))
            check(self.proc.poll() is None, "agent died:\n" + self.output())
            time.sleep(poll)

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise Fail("agent did not exit within %ds after signal %d" % (timeout, sig))


def run(cmd, bus=None, user=None, check_rc=None, timeout=60, node=None):
    env = dict(os.environ)
    if node:
        env.update(node.nvml_env)
    if bus:
        env["DBUS_SYSTEM_BUS_ADDRESS"] = bus.address
    if user:
        import pwd
        pw = pwd.getpwnam(user)
        cmd = ["setpriv", "--reuid=%d" % pw.pw_uid, "--regid=%d" % pw.pw_gid, "--clear-groups"] + cmd
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if check_rc is not None and p.returncode != check_rc:
        raise Fail("%s exited %d (wanted %d):\n%s%s" % (" ".join(cmd), p.returncode, check_rc, p.stdout, p.stderr))
    return p


def busctl(bus, *args, user=None, check_rc=0):
    return run(["busctl", "--address=" + bus.address] + list(args), user=user, check_rc=check_rc)


def get_property(bus, name, path="/org/gpunodeagent/Agent1", interface="org.gpunodeagent.Agent1.Manager"):
    return busctl(bus, "get-property", "org.gpunodeagent.Agent1", path, interface, name).stdout.strip()


class LatencyProbe:
    """Reads the Manager's State property over and over from a thread; stop() returns the slowest read."""

    def __init__(self, bus):
        self.bus, self.worst, self.done = bus, 0.0, False
        self.thread = threading.Thread(target=self.run)
        self.thread.start()

    def run(self):
        while not self.done:
            t0 = time.monotonic()
            get_property(self.bus, "State")
            self.worst = max(self.worst, time.monotonic() - t0)
            time.sleep(0.02)

    def stop(self):
        self.done = True
        self.thread.join()
        return self.worst


class TempDir:
    def __enter__(self):
        self.path = tempfile.mkdtemp(prefix="gna-it-")
        return self.path

    def __exit__(self, *exc):
        shutil.rmtree(self.path, ignore_errors=True)


class Skip(Exception):
    """Raised by a test that cannot run here; reported as a TAP skip with the reason."""


def tap_main(tests, argv=()):
    """Runs the test functions as a TAP stream (meson's protocol: 'tap'). argv may name tests to run
    only those. Every integration test needs root: the private bus's policy and setpriv to nobody."""
    import sys
    import traceback

    if os.geteuid() != 0:
        print("1..0 # SKIP the integration tests need root (private system bus policy, setpriv to nobody)")
        return 0
    only = [a for a in argv if not a.startswith("-")]
    tests = [t for t in tests if not only or t.__name__ in only]
    print("1..%d" % len(tests), flush=True)
    failed = 0
    for i, t in enumerate(tests, 1):
        start = time.monotonic()
        try:
            t()
            print("ok %d - %s (%.1fs)" % (i, t.__name__, time.monotonic() - start), flush=True)
        except Skip as e:
            print("ok %d - %s # SKIP %s" % (i, t.__name__, e), flush=True)
        except Exception as e:  # noqa: BLE001 - report every failure as TAP
            failed += 1
            print("not ok %d - %s" % (i, t.__name__), flush=True)
            for line in ("".join(traceback.format_exception_only(type(e), e)) +
                         ("" if isinstance(e, Fail) else traceback.format_exc())).splitlines():
                print("# " + line, flush=True)
        sys.stdout.flush()
    return 1 if failed else 0
