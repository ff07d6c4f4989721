#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Integration tests of the remote configuration source (config.remote): the real daemon fetches a
drop-in from a real TLS server on 127.0.0.1 (Python's ssl module, a CA + server + client certificate
made with openssl in the test's directory). Good document, 304, 500, timeout (with the loop still
answering D-Bus), bad certificate, invalid document, server down at boot with a last-known-good copy,
and a server that requires a client certificate. TAP output."""
import http.server
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (AGENT, BUILD, Agent, Bus, Fail, Node, Notify, Skip, TempDir, check, get_property,  # noqa: E402
                     run, tap_main)

from harness import timeout_scale  # noqa: E402
SCALE = timeout_scale()
NO_INET_TRAP = os.environ.get("GNA_NO_INET_TRAP", os.path.join(BUILD, "tests/fakes/no-inet-trap.so"))

DOC4 = "sharing:\n  strategy: time-slicing\n  replicas: 4\n"
DOC2 = "sharing:\n  strategy: time-slicing\n  replicas: 2\n"
INVALID = "sharing:\n  replicas: lots\n"


def wait_until(what, fn, timeout, detail=lambda: ""):
    deadline = time.monotonic() + timeout * SCALE
    while time.monotonic() < deadline:
        if fn():
            return
        time.sleep(0.05)
    raise Fail("timed out waiting for %s\n%s" % (what, detail()))


def openssl(*args, cwd):
    subprocess.run(["openssl"] + list(args), cwd=cwd, check=True, capture_output=True)


def make_certs(tmp):
    """ca.pem signs server.pem (127.0.0.1) and client.pem; other-ca.pem signs nothing we serve."""
    d = os.path.join(tmp, "pki")
    os.makedirs(d)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", *ec, "-keyout", ca + ".key", "-out", ca + ".pem", "-days", "2",
                "-subj", "/CN=gna test " + ca, cwd=d)
    with open(os.path.join(d, "server.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    with open(os.path.join(d, "client.ext"), "w") as f:
        f.write("extendedKeyUsage=clientAuth\n")
    for name in ("server", "client"):
        openssl("req", *ec, "-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=gna " + name, cwd=d)
        openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", name + ".pem", "-days", "2", "-extfile", name + ".ext", cwd=d)
    return d


class Server:
    """HTTPS on 127.0.0.1: serves self.doc with self.etag, answers If-None-Match with 304, or fails as
    self.mode says ("500", "hang"); records each request's path and headers."""

    def __init__(self, pki, require_client_cert=False, port=0):
        self.doc, self.etag, self.mode, self.hang = DOC4, '"v1"', "good", 5.0
        self.requests = []
        self.lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                with server.lock:
                    server.requests.append((self.path, dict(self.headers)))
                    mode, doc, etag = server.mode, server.doc, server.etag
                if mode == "500":
                    self.send_error(500, "Internal Server Error")
                    return
                if mode == "hang":
                    time.sleep(server.hang)
                if self.headers.get("If-None-Match") == etag:
                    self.send_response(304)
                    self.send_header("ETag", etag)
                    self.end_headers()
                    return
                body = doc.encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/yaml")
                self.send_header("ETag", etag)
                self.send_header("Last-Modified", "Tue, 01 Dec 2026 10:00:00 GMT")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        class Quiet(http.server.ThreadingHTTPServer):
            def handle_error(self, request, client_address):
                pass  # a client that hangs up (a failed handshake, a timeout) is part of the tests

        self.httpd = Quiet(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(os.path.join(pki, "server.pem"), os.path.join(pki, "server.key"))
        if require_client_cert:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(os.path.join(pki, "ca.pem"))
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def set(self, **kw):
        with self.lock:
            for k, v in kw.items():
                setattr(self, k, v)

    def count(self):
        with self.lock:
            return len(self.requests)

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def remote_yaml(port, pki, ca="ca.pem", client=False, interval="1s", timeout="10s"):
    y = ("config:\n  remote:\n    url: https://127.0.0.1:%d/nodes/{hostname}.yaml\n    ca-file: %s\n"
         "    interval: %s\n    timeout: %s\n" % (port, os.path.join(pki, ca), interval, timeout))
    if client:
        y += "    cert: %s\n    key: %s\n" % (os.path.join(pki, "client.pem"), os.path.join(pki, "client.key"))
    return y


class Daemon:
    def __init__(self, tmp, extra_yaml, env=None):
        # A second daemon on the same node (state directory) reuses the directory's socket names.
        for stale in ("notify", "system_bus_socket"):
            if os.path.exists(os.path.join(tmp, stale)):
                os.remove(os.path.join(tmp, stale))
        self.bus = Bus(tmp)
        self.notify = Notify(tmp)
        self.node = Node(tmp, "dgx-h100", extra_yaml)
        self.agent = Agent(self.node, self.bus, self.notify, extra_env=env)
        try:
            self.notify.wait_for("READY=1", 60 * SCALE)
        except Fail:
            self.close()
            raise Fail("no READY=1; agent output:\n" + self.agent.output())

    def labels(self):
        try:
            with open(self.node.feature_file()) as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def replicas(self, n):
        return "nvidia.com/gpu.replicas=%d\n" % n in self.labels()

    def wait_log(self, text, timeout=15):
        wait_until("%r in the agent's log" % text, lambda: text in self.agent.output(), timeout,
                   self.agent.output)

    def stop(self):
        rc = self.agent.stop(signal.SIGTERM, timeout=int(60 * SCALE))
        check(rc == 0, "agent exited %d on SIGTERM:\n%s" % (rc, self.agent.output()))

    def close(self):
        if self.agent.proc.poll() is None:
            self.agent.proc.kill()
            self.agent.proc.wait()
        self.notify.close()
        self.bus.stop()


def lkg_path(d):
    return os.path.join(d.node.state, "remote-config.yaml")


def test_good_304_change_and_local_wins():
    with TempDir() as tmp:
        pki = make_certs(tmp)
        srv = Server(pki)
        d = Daemon(tmp, remote_yaml(srv.port, pki))
        try:
            wait_until("replicas=4 from the remote document", lambda: d.replicas(4), 15, d.agent.output)
            # libcurl is dlopen()ed for the fetch (test-lazy-libcurl.py: not loaded without config.remote).
            with open("/proc/%d/maps" % d.agent.proc.pid) as f:
                check("/libcurl.so.4" in f.read(), "libcurl.so.4 is not mapped after a remote fetch")
            path, _ = srv.requests[0]
            check(path == "/nodes/%s.yaml" % socket.gethostname(), "URL not templated: " + path)
            sources = get_property(d.bus, "ConfigSources")
            check("https://127.0.0.1:%d/nodes/" % srv.port in sources, "ConfigSources lacks the URL: " + sources)
            with open(lkg_path(d)) as f:
                check(f.read() == DOC4, "last-known-good copy differs from the document")

            # Later fetches are conditional and the server says 304: no reload.
            n = srv.count()
            wait_until("two more fetches", lambda: srv.count() >= n + 2, 10)
            _, headers = srv.requests[-1]
            check(headers.get("If-None-Match") == '"v1"', "no If-None-Match: %r" % headers)
            check(headers.get("If-Modified-Since") == "Tue, 01 Dec 2026 10:00:00 GMT",
                  "no If-Modified-Since: %r" % headers)
            check(d.agent.output().count("changed, reloading") == 1, "a 304 reloaded:\n" + d.agent.output())

            # A new document is applied through the reload path.
            srv.set(doc=DOC2, etag='"v2"')
            wait_until("replicas=2 after the document changed", lambda: d.replicas(2), 15, d.agent.output)
            with open(lkg_path(d)) as f:
                check(f.read() == DOC2, "last-known-good copy not updated")

            # A local /etc drop-in wins over the remote document.
            with open(os.path.join(d.node.confd, "90-local.yaml"), "w") as f:
                f.write("sharing:\n  replicas: 8\n")
            d.agent.proc.send_signal(signal.SIGHUP)
            wait_until("replicas=8 from the local drop-in", lambda: d.replicas(8), 15, d.agent.output)
            d.stop()
        finally:
            d.close()
            srv.stop()


def test_500_and_invalid_keep_last_known_good():
    with TempDir() as tmp:
        pki = make_certs(tmp)
        srv = Server(pki)
        d = Daemon(tmp, remote_yaml(srv.port, pki))
        try:
            wait_until("replicas=4", lambda: d.replicas(4), 15, d.agent.output)
            srv.set(mode="500")
            d.wait_log("the server answered HTTP 500; keeping the last known good copy.")
            check(d.replicas(4), "a 500 changed the configuration")

            srv.set(mode="good", doc=INVALID, etag='"bad"')
            url = "https://127.0.0.1:%d/nodes/%s.yaml" % (srv.port, socket.gethostname())
            want = ("The remote configuration is invalid, keeping the last known good copy: %s:2:13: "
                    "sharing.replicas: expected a whole number from 0 to 4294967295, got 'lots'" % url)
            d.wait_log(want)
            err = get_property(d.bus, "ConfigError")
            check(url + ":2:13:" in err, "ConfigError does not name URL:line:column: " + err)
            check(d.replicas(4), "an invalid document changed the configuration")
            with open(lkg_path(d)) as f:
                check(f.read() == DOC4, "an invalid document replaced the last-known-good copy")

            # The server is fixed (back to the copy we have: 304): the error is cleared.
            srv.set(doc=DOC4, etag='"v1"')
            wait_until("ConfigError cleared", lambda: get_property(d.bus, "ConfigError") == 's ""', 15,
                       d.agent.output)
            check(d.replicas(4), "labels changed when the server was fixed")
            d.stop()
        finally:
            d.close()
            srv.stop()


def test_timeout_does_not_block_the_loop():
    with TempDir() as tmp:
        pki = make_certs(tmp)
        srv = Server(pki)
        srv.set(mode="hang", hang=4.0)
        d = Daemon(tmp, remote_yaml(srv.port, pki, timeout="2s", interval="1h"))
        try:
            wait_until("the request", lambda: srv.count() >= 1, 10)
            # While the server holds the request, the daemon answers D-Bus at once.
            start = time.monotonic()
            check(get_property(d.bus, "Ready") == "b true", "not ready while the fetch hangs")
            check(time.monotonic() - start < 1.0 * SCALE, "D-Bus answer took %.1fs during a fetch" %
                  (time.monotonic() - start))
            d.wait_log("Cannot fetch the remote configuration from https://127.0.0.1:%d/" % srv.port)
            d.wait_log("Operation timed out")
            d.wait_log("keeping the local configuration.")
            check(not d.replicas(4), "labels show a document that never arrived")
            d.stop()
        finally:
            d.close()
            srv.stop()


def test_bad_certificate():
    with TempDir() as tmp:
        pki = make_certs(tmp)
        srv = Server(pki)
        d = Daemon(tmp, remote_yaml(srv.port, pki, ca="other-ca.pem", interval="1h"))
        try:
            d.wait_log("SSL certificate problem")
            d.wait_log("keeping the local configuration.")
            check(srv.count() == 0, "a request was sent to a server with an untrusted certificate")
            check(not d.replicas(4), "a document from an untrusted server was applied")
            check(not os.path.exists(lkg_path(d)), "a last-known-good copy from an untrusted server")
            d.stop()
        finally:
            d.close()
            srv.stop()


def test_server_down_at_boot_uses_last_known_good():
    with TempDir() as tmp:
        pki = make_certs(tmp)
        srv = Server(pki)
        port = srv.port
        d = Daemon(tmp, remote_yaml(port, pki, interval="1h"))
        try:
            wait_until("replicas=4", lambda: d.replicas(4), 15, d.agent.output)
            d.stop()
        finally:
            d.close()
            srv.stop()
        os.remove(d.node.feature_file())
        # --check-config shows what the daemon will use: the copy, named by its URL.
        p = run([AGENT, "--check-config"] + d.node.args(), check_rc=0)
        check("#   https://127.0.0.1:%d/nodes/%s.yaml\n" % (port, socket.gethostname()) in p.stdout and
              "  replicas: 4\n" in p.stdout, "--check-config does not show the last-known-good copy:\n" + p.stdout)
        # Same node, server gone: the first pass already has the document's settings.
        d = Daemon(tmp, remote_yaml(port, pki, interval="1h"))
        try:
            check(d.replicas(4), "the first pass did not use the last-known-good copy:\n" + d.labels())
            d.wait_log("Cannot fetch the remote configuration from https://127.0.0.1:%d/" % port)
            d.wait_log("keeping the last known good copy.")
            check(d.replicas(4), "the failed fetch changed the configuration")
            d.stop()
        finally:
            d.close()


def test_mtls_required():
    with TempDir() as tmp:
        pki = make_certs(tmp)
        srv = Server(pki, require_client_cert=True)
        d = Daemon(tmp, remote_yaml(srv.port, pki, interval="1h"))
        try:
            d.wait_log("Cannot fetch the remote configuration")
            d.wait_log("keeping the local configuration.")
            check(srv.count() == 0, "served without a client certificate")
            check(not d.replicas(4), "applied without a client certificate")
            d.stop()
        finally:
            d.close()
        d = Daemon(tmp, remote_yaml(srv.port, pki, client=True, interval="1h"))
        try:
            wait_until("replicas=4 with a client certificate", lambda: d.replicas(4), 15, d.agent.output)
            # A reload fetches at once (interval is 1h), conditionally, and a 304 reloads nothing more.
            n = srv.count()
            d.agent.proc.send_signal(signal.SIGHUP)
            wait_until("a fetch on SIGHUP", lambda: srv.count() == n + 1, 10)
            check(srv.requests[-1][1].get("If-None-Match") == '"v1"', "the reload's fetch is not conditional")
            time.sleep(0.5)
            check(d.agent.output().count("changed, reloading") == 1, "a 304 reloaded:\n" + d.agent.output())
            d.stop()
        finally:
            d.close()
            srv.stop()


def test_sandbox_without_ip_sockets_names_the_dropin():
    if os.environ.get("GNA_WRAPPER"):
        raise Skip("an LD_PRELOAD library under a wrapper (valgrind) would load into the wrapper")
    if not os.path.exists(NO_INET_TRAP):
        raise Fail("%s is missing: build the tests first" % NO_INET_TRAP)
    with TempDir() as tmp:
        pki = make_certs(tmp)
        srv = Server(pki)
        env = {"LD_PRELOAD": NO_INET_TRAP,
               "ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "") + ":verify_asan_link_order=0"}
        d = Daemon(tmp, remote_yaml(srv.port, pki, interval="1h"), env=env)
        try:
            d.wait_log("config.remote is set, but this process may not open IP sockets (the unit's "
                       "RestrictAddressFamilies=); copy /usr/share/gpu-node-agent/remote-config.conf to "
                       "/etc/systemd/system/gpu-node-agent.service.d/")
            check(srv.count() == 0, "a request got through the trap")
            check(get_property(d.bus, "Ready") == "b true", "not ready without the network")
            d.stop()
        finally:
            d.close()
            srv.stop()


TESTS = [
    test_good_304_change_and_local_wins,
    test_500_and_invalid_keep_last_known_good,
    test_timeout_does_not_block_the_loop,
    test_bad_certificate,
    test_server_down_at_boot_uses_last_known_good,
    test_mtls_required,
    test_sandbox_without_ip_sockets_names_the_dropin,
]

if __name__ == "__main__":
    sys.exit(tap_main(TESTS, sys.argv[1:]))
