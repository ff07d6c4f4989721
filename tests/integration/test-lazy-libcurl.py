#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""libcurl is loaded only when something needs it (issue 14): the agent is not linked against it and
dlopen()s libcurl.so.4 on the first remote-configuration or Kubernetes fetch. Without either, neither
`--oneshot` (glibc's LD_DEBUG=files lists every object the loader maps) nor the running daemon
(/proc/PID/maps after READY=1) has libcurl or its TLS libraries mapped. test-remote-config.py checks
that the daemon maps it once it fetches. TAP output."""
import glob
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import AGENT, Agent, Bus, Fail, Node, Notify, TempDir, check, run, tap_main  # noqa: E402

from harness import timeout_scale  # noqa: E402
SCALE = timeout_scale()
# libcurl and what only libcurl pulls in (Debian's libcurl4: OpenSSL's libssl, Kerberos, LDAP, ...).
CURL_ONLY = ("/libcurl.so", "/libssl.so", "/libgssapi_krb5.so", "/libldap", "/libnghttp2.so", "/libssh2.so",
             "/libgnutls.so", "/libp11-kit.so", "libcurl.so.4")


def test_oneshot_does_not_load_libcurl():
    with TempDir() as tmp:
        node = Node(tmp, "gen-1")
        ld = os.path.join(tmp, "ld")
        os.environ["LD_DEBUG"] = "files"
        os.environ["LD_DEBUG_OUTPUT"] = ld
        try:
            p = run([AGENT] + node.args() + ["--oneshot"], node=node)
        finally:
            del os.environ["LD_DEBUG"], os.environ["LD_DEBUG_OUTPUT"]
        # Every stage ran. (The exit status is not checked: the forked NVML worker closes its inherited
        # descriptors, so the loader's trace of its dlopen() can land on the worker's socket and fail the
        # nvml stage; which objects were loaded is what this test is about.)
        check("Stage labels: running → done" in p.stdout + p.stderr, "--oneshot did not label:\n" + p.stdout + p.stderr)
        logs = "".join(open(p).read() for p in glob.glob(ld + ".*"))
        # The trace works: the agent's own libraries are in it.
        check("file=libsystemd.so.0" in logs, "LD_DEBUG=files listed nothing:\n" + logs[:2000])
        loaded = [line.strip() for line in logs.splitlines() if "file=" in line and any(c in line for c in CURL_ONLY)]
        check(not loaded, "--oneshot without config.remote loaded:\n" + "\n".join(loaded))


def test_daemon_without_remote_does_not_map_libcurl():
    with TempDir() as tmp:
        bus = Bus(tmp)
        notify = Notify(tmp)
        node = Node(tmp, "gen-1")
        agent = Agent(node, bus, notify)
        try:
            try:
                notify.wait_for("READY=1", 60 * SCALE)
            except Fail:
                raise Fail("no READY=1; agent output:\n" + agent.output())
            with open("/proc/%d/maps" % agent.proc.pid) as f:
                maps = f.read()
            check("libsystemd.so" in maps, "/proc/PID/maps lacks libsystemd:\n" + maps)
            mapped = sorted({line.split()[-1] for line in maps.splitlines() if any(c in line for c in CURL_ONLY)})
            check(not mapped, "the daemon without config.remote maps: %s" % ", ".join(mapped))
        finally:
            agent.stop()
            notify.close()
            bus.stop()


def test_unloadable_libcurl_is_named_with_the_fix():
    """config.remote set but libcurl.so.4 cannot be loaded (here: an empty file of that name first on
    LD_LIBRARY_PATH): the daemon says which library and which package, and keeps running."""
    with TempDir() as tmp:
        lib = os.path.join(tmp, "lib")
        os.makedirs(lib)
        open(os.path.join(lib, "libcurl.so.4"), "w").close()
        bus = Bus(tmp)
        notify = Notify(tmp)
        node = Node(tmp, "gen-1", "config:\n  remote:\n    url: https://127.0.0.1:9/{hostname}.yaml\n"
                                  "    interval: 1h\n")
        agent = Agent(node, bus, notify, extra_env={"LD_LIBRARY_PATH": lib})
        try:
            try:
                notify.wait_for("READY=1", 60 * SCALE)
            except Fail:
                raise Fail("no READY=1; agent output:\n" + agent.output())
            want = "Cannot load libcurl.so.4, which the remote configuration (config.remote.url) and the Kubernetes"
            deadline = time.monotonic() + 10 * SCALE
            while want not in agent.output() and time.monotonic() < deadline:
                time.sleep(0.1)
            out = agent.output()
            check(want in out and "Install libcurl (Debian: libcurl4, RPM: libcurl)" in out,
                  "no error naming libcurl.so.4 and its package:\n" + out)
            check(agent.proc.poll() is None, "the daemon exited:\n" + out)
        finally:
            agent.stop()
            notify.close()
            bus.stop()


TESTS = [
    test_oneshot_does_not_load_libcurl,
    test_daemon_without_remote_does_not_map_libcurl,
    test_unloadable_libcurl_is_named_with_the_fix,
]

if __name__ == "__main__":
    sys.exit(tap_main(TESTS, sys.argv[1:]))
