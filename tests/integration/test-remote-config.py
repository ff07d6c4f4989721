#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Integration tests of the remote configuration source (config.remote): the real daemon fetches a
drop-in from a real TLS server on 127.0.0.1 (Python's ssl module, a CA + server + client certificate
made with openssl in the test's directory). Good document, 304, 500, timeout (with the loop still
answering D-Bus), bad certificate, invalid document, server down at boot with a last-known-good copy,
a server that requires a client certificate, every key the remote document may not set refused by name
with nothing changed (and a document of policy keys applied), and signed documents (config.remote.signing-key,
keys made with openssl): good, bad signature, wrong key, unsigned, a replayed older serial, and a copy
that no longer verifies at boot. TAP output."""
import base64
import http.server
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (AGENT, BUILD, CTL, Agent, Bus, Fail, Node, Notify, Skip, TempDir, check,  # noqa: E402
                     get_property, run, tap_main)

from harness import timeout_scale  # noqa: E402
SCALE = timeout_scale()
NO_INET_TRAP = os.environ.get("GNA_NO_INET_TRAP", os.path.join(BUILD, "tests/fakes/no-inet-trap.so"))
DUMP_CONFIG_KEYS = os.path.join(BUILD, "tests/docs/dump-config-keys")

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
        self.sig = None  # bytes served for <path>.sig; None: 404
        self.requests = []
        self.lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                with server.lock:
                    server.requests.append((self.path, dict(self.headers)))
                    mode, doc, etag, sig = server.mode, server.doc, server.etag, server.sig
                if self.path.endswith(".sig") and mode != "500":
                    if sig is None:
                        self.send_error(404, "Not Found")
                        return
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(sig)))
                    self.end_headers()
                    self.wfile.write(sig)
                    return
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


def remote_yaml(port, pki, ca="ca.pem", client=False, interval="1s", timeout="10s", signing_key=None):
    y = ("config:\n  remote:\n    url: https://127.0.0.1:%d/nodes/{hostname}.yaml\n    ca-file: %s\n"
         "    interval: %s\n    timeout: %s\n" % (port, os.path.join(pki, ca), interval, timeout))
    if client:
        y += "    cert: %s\n    key: %s\n" % (os.path.join(pki, "client.pem"), os.path.join(pki, "client.key"))
    if signing_key:
        y += "    signing-key: %s\n" % signing_key
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


def remote_keys():
    """{key: True when the remote document may set it} from agent/config.c's key table."""
    if not os.path.exists(DUMP_CONFIG_KEYS):
        raise Fail("%s is missing: build the tests first" % DUMP_CONFIG_KEYS)
    out = subprocess.run([DUMP_CONFIG_KEYS], check=True, capture_output=True, text=True).stdout
    return {k: r == "yes" for k, _, r in (line.split("\t") for line in out.splitlines())}


def current_values(d):
    """{key: value} of the node's merged configuration, from --check-config (a document that loads)."""
    import yaml
    p = run([AGENT, "--check-config"] + d.node.args(), check_rc=0)

    def flat(prefix, m, out):
        for k, v in m.items():
            if isinstance(v, dict):
                flat(prefix + k + ".", v, out)
            else:
                out[prefix + k] = v
        return out
    return flat("", yaml.safe_load(p.stdout), {})


def evil_value(key, value, evil):
    """A value for key that an attacker would like: a path, program or library under evil, a command,
    another unit, the other boolean; otherwise the node's own (still a key the document sets)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, list):
        return ["evil.service"]
    special = {"health.on-unhealthy": "touch %s/pwned" % evil, "labels.file": "evil",
               "kubernetes.node-name": "evil-node", "config.remote.url": "https://evil.example/x.yaml",
               "config.remote.signature-url": "https://evil.example/x.sig", "driver.dkms.module": "evil/1.0",
               "nvml.library": evil + "/libevil.so", "driver.dkms.program": evil + "/dkms",
               "metrics.textfile": evil + "/x.prom", "mig.selected-from": "node-label"}
    if key in special:
        return special[key]
    if key.startswith("driver.parameters."):
        return "NVreg_Evil=1"
    if isinstance(value, str) and (value.startswith("/") or key.startswith("paths.") or
                                   key in ("config.remote.ca-file", "config.remote.cert", "config.remote.key",
                                           "config.remote.signing-key")):
        return evil + "/" + key
    return value


def nested(flat_items):
    out = {}
    for key, value in flat_items:
        m = out
        parts = key.split(".")
        for p in parts[:-1]:
            m = m.setdefault(p, {})
        m[parts[-1]] = value
    return out


def doctor(d):
    env = dict(os.environ, DBUS_SYSTEM_BUS_ADDRESS=d.bus.address)
    env.update(d.node.nvml_env)
    p = subprocess.run([CTL, "doctor", "--json", "--agent-config", d.node.config, "--agent-config-dir",
                        d.node.confd], env=env, capture_output=True, text=True, timeout=120 * SCALE)
    try:
        return {layer["name"]: layer for layer in json.loads(p.stdout)["layers"]}
    except ValueError:
        raise Fail("doctor --json printed no JSON (exit %d):\n%s%s" % (p.returncode, p.stdout, p.stderr))


def test_refused_keys_and_policy_document():
    """Every key the table does not mark remote, each in a document of its own, with a value an attacker
    would choose: refused by name, line and reason, nothing of it applied (labels, the last-known-good
    copy, no file under the attacker's paths). Then a document of policy keys only applies."""
    import yaml
    keys = remote_keys()
    refused = [k for k, ok in keys.items() if not ok]
    check(len(refused) >= 40 and "nvml.library" in refused and "health.on-unhealthy" in refused and
          "sharing.replicas" not in refused, "unexpected key table: %r" % refused)
    with TempDir() as tmp:
        pki = make_certs(tmp)
        evil = os.path.join(tmp, "evil")
        srv = Server(pki)
        d = Daemon(tmp, remote_yaml(srv.port, pki, interval="100ms"))
        try:
            wait_until("replicas=4 from the remote document", lambda: d.replicas(4), 15, d.agent.output)
            url = "https://127.0.0.1:%d/nodes/%s.yaml" % (srv.port, socket.gethostname())
            values = current_values(d)
            labels = d.labels()
            sources = get_property(d.bus, "ConfigSources")
            for i, key in enumerate(refused):
                doc = "log:\n  level: debug\n" + yaml.safe_dump(nested([(key, evil_value(key, values[key], evil))]))
                line = 3 + key.count(".")
                col = 1 + 2 * key.count(".")
                want = "%s:%d:%d: %s: may not be set by the remote configuration: it " % (url, line, col, key)
                srv.set(doc=doc, etag='"evil-%d"' % i)
                wait_until("%s refused in ConfigError" % key, lambda: want in get_property(d.bus, "ConfigError"),
                           15, lambda: "document:\n%s\nConfigError: %s\n%s" % (
                               doc, get_property(d.bus, "ConfigError"), d.agent.output()[-3000:]))
                check("The whole document is refused" in get_property(d.bus, "ConfigError"),
                      "%s: the refusal does not say the document is refused whole" % key)
                if i == 0:
                    v = doctor(d)
                    check(v["config"]["verdict"] == "warning" and want in v["config"]["message"] and
                          v["config"]["fix"], "doctor's config layer after a refused key: %r" % v["config"])
            d.wait_log("The remote configuration is invalid, keeping the last known good copy: %s:4:3: "
                       "nvml.library: may not be set by the remote configuration: it names a shared object the "
                       "agent loads as root; set it in a local file such as /etc/gpu-node-agent/agent.yaml. The "
                       "whole document is refused" % url)
            check(d.labels() == labels, "a refused document changed the labels:\n" + d.labels())
            with open(lkg_path(d)) as f:
                check(f.read() == DOC4, "a refused document replaced the last-known-good copy")
            check(get_property(d.bus, "ConfigSources") == sources, "a refused document changed ConfigSources")
            check(not os.path.exists(evil), "a refused document left something under its paths: %r" %
                  (os.listdir(evil) if os.path.isdir(evil) else evil))
            check(d.agent.output().count("changed, reloading") == 1, "a refused document reloaded")
            with open("/proc/%d/maps" % d.agent.proc.pid) as f:
                check("libevil" not in f.read(), "the refused nvml.library was loaded")

            # Policy keys only: taken whole, and the error is gone.
            policy = ("serial: 3\nsharing:\n  strategy: time-slicing\n  replicas: 2\nlabels:\n  mig-strategy: mixed\n"
                      "  timestamp: true\nhealth:\n  xid:\n    ignore: [13, 31]\n  recheck-delay: 30s\n"
                      "log:\n  level: debug\nengine:\n  retry-max: 10min\ndriver:\n  reload-on-mismatch: when-idle\n")
            srv.set(doc=policy, etag='"policy"')
            wait_until("replicas=2 from the policy document", lambda: d.replicas(2), 15, d.agent.output)
            wait_until("ConfigError cleared", lambda: get_property(d.bus, "ConfigError") == 's ""', 15)
            check("nvidia.com/gfd.timestamp=" in d.labels(), "labels.timestamp from the document not applied")
            with open(lkg_path(d)) as f:
                check(f.read() == policy, "the policy document is not the last-known-good copy")
            check(doctor(d)["config"]["verdict"] == "ok", "doctor's config layer after a good document")
            d.stop()
        finally:
            d.close()
            srv.stop()


def make_signing_keys(tmp):
    d = os.path.join(tmp, "sign")
    os.makedirs(d)
    for name in ("fleet", "other"):
        openssl("genpkey", "-algorithm", "ed25519", "-out", name + ".key", cwd=d)
        openssl("pkey", "-in", name + ".key", "-pubout", "-out", name + ".pub", cwd=d)
    return d


def sign(keys, name, doc, b64=False):
    path = os.path.join(keys, "doc.yaml")
    with open(path, "w") as f:
        f.write(doc)
    openssl("pkeyutl", "-sign", "-rawin", "-inkey", name + ".key", "-in", path, "-out", "doc.sig", cwd=keys)
    with open(os.path.join(keys, "doc.sig"), "rb") as f:
        sig = f.read()
    return base64.b64encode(sig) + b"\n" if b64 else sig


def signed_doc(serial, replicas):
    return "serial: %d\nsharing:\n  strategy: time-slicing\n  replicas: %d\n" % (serial, replicas)


def test_signed_documents():
    with TempDir() as tmp:
        pki = make_certs(tmp)
        keys = make_signing_keys(tmp)
        fleet_pub = os.path.join(keys, "fleet.pub")
        doc5, doc6, doc7 = signed_doc(5, 4), signed_doc(6, 2), signed_doc(7, 2)
        srv = Server(pki)
        srv.set(doc=doc5, etag='"s5"', sig=sign(keys, "fleet", doc5, b64=True))
        d = Daemon(tmp, remote_yaml(srv.port, pki, interval="200ms", signing_key=fleet_pub))
        url = "https://127.0.0.1:%d/nodes/%s.yaml" % (srv.port, socket.gethostname())
        sig_url = url + ".sig"

        def sig_fetches():
            with srv.lock:
                return sum(1 for p, _ in srv.requests if p.endswith(".sig"))

        def refused(what, words):
            wait_until(what, lambda: words in get_property(d.bus, "ConfigError"), 15,
                       lambda: get_property(d.bus, "ConfigError") + "\n" + d.agent.output()[-3000:])
            check(d.replicas(4), "%s changed the configuration:\n%s" % (what, d.labels()))
            with open(lkg_path(d)) as f:
                check(f.read() == doc5, "%s replaced the last-known-good copy" % what)

        try:
            # Good: applied, saved with its signature, the serial kept; the signature is fetched after
            # the document, unconditionally; later fetches are 304 and keep it.
            wait_until("replicas=4 from the signed document", lambda: d.replicas(4), 15, d.agent.output)
            paths = [p for p, _ in srv.requests]
            check(paths[:2] == ["/nodes/%s.yaml" % socket.gethostname(), "/nodes/%s.yaml.sig" % socket.gethostname()],
                  "document and signature not fetched in that order: %r" % paths)
            check("If-None-Match" not in srv.requests[1][1], "the signature was fetched conditionally")
            with open(os.path.join(d.node.state, "remote-config.sig"), "rb") as f:
                check(f.read() == srv.sig, "the signature is not saved beside the copy")
            with open(os.path.join(d.node.state, "remote-config.serial")) as f:
                check(f.read() == "url=%s\nserial=5\n" % url, "the serial is not kept")
            n = srv.count()
            wait_until("304s", lambda: srv.count() >= n + 2, 10)
            check(get_property(d.bus, "ConfigError") == 's ""', "an error after a good signed document")

            # Bad signature: the signature of another document (a changed document, or a stale .sig).
            srv.set(doc=doc6, etag='"s6"', sig=sign(keys, "fleet", doc7))
            refused("a bad signature", "%s: refused, its signature %s: the signature does not verify with the "
                                       "Ed25519 key in %s" % (url, sig_url, fleet_pub))
            d.wait_log("fetching the document and its signature again in 2s.")
            # The wrong key: a good signature by another key (fetched twice: once more after 2 s).
            n = sig_fetches()
            srv.set(doc=doc6, etag='"s6b"', sig=sign(keys, "other", doc6))
            wait_until("the other key's signature fetched twice", lambda: sig_fetches() >= n + 2, 15, d.agent.output)
            refused("the wrong key", "%s: refused, its signature %s: the signature does not verify with the "
                                     "Ed25519 key in %s" % (url, sig_url, fleet_pub))
            # Unsigned: no signature on the server.
            srv.set(doc=doc6, etag='"s6c"', sig=None)
            refused("an unsigned document", "%s: refused, its signature %s cannot be fetched (the server answered "
                                            "HTTP 404), and config.remote.signing-key takes only signed documents"
                    % (url, sig_url))

            # A newer signed document is taken; the older one served again (a replay) is refused.
            srv.set(doc=doc7, etag='"s7"', sig=sign(keys, "fleet", doc7))
            wait_until("replicas=2 from serial 7", lambda: d.replicas(2), 15, d.agent.output)
            wait_until("ConfigError cleared", lambda: get_property(d.bus, "ConfigError") == 's ""', 15)
            srv.set(doc=doc5, etag='"s5-replayed"', sig=sign(keys, "fleet", doc5))
            want = ("%s: refused, its serial 5 is older than 7, the newest this node has taken: a document served "
                    "again to turn the node back (a rollback) is refused" % url)
            wait_until("the replayed serial refused", lambda: want in get_property(d.bus, "ConfigError"), 15,
                       d.agent.output)
            check(d.replicas(2), "the replayed document changed the configuration")
            with open(lkg_path(d)) as f:
                check(f.read() == doc7, "the replayed document replaced the last-known-good copy")
            check(d.agent.output().count("changed, reloading") == 2, "a refused document reloaded:\n" +
                  d.agent.output())
            d.stop()
        finally:
            d.close()

        # At boot the copy is checked again: with another key configured it is not used.
        srv.set(mode="500")
        d = Daemon(tmp, remote_yaml(srv.port, pki, interval="1h", signing_key=os.path.join(keys, "other.pub")))
        try:
            d.wait_log("Not using the last known good remote configuration: the signature does not verify with "
                       "the Ed25519 key in %s" % os.path.join(keys, "other.pub"))
            check(not d.replicas(2), "a copy that does not verify with the key was used")
            d.stop()
        finally:
            d.close()
            srv.stop()
        # A signing key that cannot be read fails the load that names it.
        with open(os.path.join(tmp, "agent.yaml")) as f:
            text = f.read()
        with open(os.path.join(tmp, "agent.yaml"), "w") as f:
            f.write(text.replace(os.path.join(keys, "other.pub"), os.path.join(keys, "missing.pub")))
        p = run([AGENT, "--check-config", "--config", os.path.join(tmp, "agent.yaml"), "--config-dir",
                 os.path.join(tmp, "conf.d")])
        check(p.returncode != 0 and "config.remote.signing-key: %s: cannot read the public key: No such file or directory" %
              os.path.join(keys, "missing.pub") in p.stdout + p.stderr, "--check-config with a missing key:\n" +
              p.stdout + p.stderr)


TESTS = [
    test_good_304_change_and_local_wins,
    test_500_and_invalid_keep_last_known_good,
    test_timeout_does_not_block_the_loop,
    test_bad_certificate,
    test_server_down_at_boot_uses_last_known_good,
    test_mtls_required,
    test_sandbox_without_ip_sockets_names_the_dropin,
    test_refused_keys_and_policy_document,
    test_signed_documents,
]

if __name__ == "__main__":
    sys.exit(tap_main(TESTS, sys.argv[1:]))
