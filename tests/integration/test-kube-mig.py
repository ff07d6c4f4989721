#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Integration tests of mig.selected-from: node-label. The real daemon (8 x A100 on the fake NVML) reads
its Node object's nvidia.com/mig.config label from a loopback HTTPS server that answers as the API server
does (GET node, a streaming watch with MODIFIED events, ERROR 410 Gone, 401), with kubeconfig credentials
(inline CA and client certificate, or a bearer token), applies the named config through the MIG manager
and reports nvidia.com/mig.config and nvidia.com/mig.config.state in the feature file. TAP output."""
import base64
import http.server
import json
import os
import queue
import signal
import ssl
import sys
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, Agent, Bus, Fail, Node, Notify, SRC, TempDir, check, tap_main  # noqa: E402

_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _here)
import importlib.util  # noqa: E402
_spec = importlib.util.spec_from_file_location("remote", os.path.join(_here, "test-remote-config.py"))
remote = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(remote)

from harness import timeout_scale  # noqa: E402
SCALE = timeout_scale()
CTL_FAKE = os.path.join(BUILD, "tests/fakes/fake-nvml-ctl")
CONFIG = os.path.join(SRC, "tests/fixtures/mig-parted/config-default.yaml")
NODE = "gpu-node-7"


def node_object(label, rv):
    labels = {"kubernetes.io/hostname": NODE}
    if label is not None:
        labels["nvidia.com/mig.config"] = label
    return {"kind": "Node", "apiVersion": "v1",
            "metadata": {"name": NODE, "resourceVersion": str(rv), "labels": labels}}


class ApiServer:
    """Answers GET /api/v1/nodes/NAME with the node, and the watch with events the test queues (None
    ends the stream). token set: a request without "Bearer token" gets 401."""

    def __init__(self, pki, label, require_client_cert=False, token=None):
        self.label, self.rv, self.token = label, 100, token
        self.events = queue.Queue()
        self.requests = []
        self.lock = threading.Lock()
        srv = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                u = urllib.parse.urlparse(self.path)
                q = urllib.parse.parse_qs(u.query)
                with srv.lock:
                    srv.requests.append((u.path, q, self.headers.get("Authorization")))
                if srv.token and self.headers.get("Authorization") != "Bearer " + srv.token:
                    body = json.dumps({"kind": "Status", "code": 401, "reason": "Unauthorized"}).encode()
                    self.send_response(401)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                if u.path == "/api/v1/nodes/" + NODE:
                    with srv.lock:
                        body = json.dumps(node_object(srv.label, srv.rv)).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                if u.path == "/api/v1/nodes" and q.get("watch") == ["true"]:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.flush()
                    while True:
                        try:
                            ev = srv.events.get(timeout=20)
                        except queue.Empty:
                            return
                        if ev is None:
                            return
                        self.wfile.write((json.dumps(ev) + "\n").encode())
                        self.wfile.flush()
                self.send_error(404)

        class Quiet(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass

        self.httpd = Quiet(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(os.path.join(pki, "server.pem"), os.path.join(pki, "server.key"))
        if require_client_cert:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(os.path.join(pki, "ca.pem"))
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def modified(self, label):
        with self.lock:
            self.rv += 1
            self.label = label
            obj = node_object(label, self.rv)
        self.events.put({"type": "MODIFIED", "object": obj})

    def paths(self):
        with self.lock:
            return list(self.requests)

    def stop(self):
        self.events.put(None)
        self.httpd.shutdown()
        self.httpd.server_close()


def b64file(path):
    with open(path, "rb") as f:
        return base64.b64encode(f.read()).decode()


def write_kubeconfig(tmp, pki, port, token=None):
    if token:
        # A tokenFile named relative to the kubeconfig's folder, as the kubelet's service accounts do.
        with open(os.path.join(tmp, "token"), "w") as f:
            f.write(token + "\n")
    user = ("    tokenFile: token\n" if token else
            "    client-certificate-data: %s\n    client-key-data: %s\n"
            % (b64file(os.path.join(pki, "client.pem")), b64file(os.path.join(pki, "client.key"))))
    path = os.path.join(tmp, "kubelet.conf")
    with open(path, "w") as f:
        f.write("apiVersion: v1\nkind: Config\nclusters:\n- name: default-cluster\n  cluster:\n"
                "    server: https://127.0.0.1:%d\n    certificate-authority-data: %s\n"
                "contexts:\n- name: default-context\n  context:\n    cluster: default-cluster\n"
                "    namespace: default\n    user: default-auth\ncurrent-context: default-context\n"
                "preferences: {}\nusers:\n- name: default-auth\n  user:\n%s"
                % (port, b64file(os.path.join(pki, "ca.pem")), user))
    return path


def labels(node):
    out = {}
    try:
        with open(node.feature_file()) as f:
            for line in f:
                if "=" in line and not line.startswith("#"):
                    k, v = line.strip().split("=", 1)
                    out[k] = v
    except FileNotFoundError:
        pass
    return out


class Daemon:
    def __init__(self, tmp, kubeconfig, extra_env=None):
        self.bus = Bus(tmp)
        self.notify = Notify(tmp)
        yaml = ("driver:\n  enabled: false\nfabric:\n  persistenced: off\n  fabricmanager: off\n"
                "mig:\n  config-file: %s\n  selected-from: node-label\nkubernetes:\n  node-name: %s\n"
                "  kubeconfig: %s\nengine:\n  retry-min: 200ms\n  retry-max: 1s\n" % (CONFIG, NODE, kubeconfig))
        self.node = Node(tmp, "a100-sxm", yaml)
        with open(os.path.join(self.node.confd, "40-dev.yaml"), "w") as f:
            f.write("paths:\n  dev: %s\n" % self.node.dev)
        env = {"GNA_MIG_RESET_PROGRAM": CTL_FAKE}
        env.update(extra_env or {})
        self.agent = Agent(self.node, self.bus, self.notify, extra_env=env)
        try:
            self.notify.wait_for("READY=1", 60 * SCALE)
        except Fail:
            self.close()
            raise Fail("no READY=1; agent output:\n" + self.agent.output())

    def wait_labels(self, config, state, timeout=20):
        def ok():
            lab = labels(self.node)
            return lab.get("nvidia.com/mig.config") == config and lab.get("nvidia.com/mig.config.state") == state
        remote.wait_until("labels mig.config=%s mig.config.state=%s" % (config, state), ok, timeout,
                          lambda: "%r\n%s" % (labels(self.node), self.agent.output()))

    def stop(self):
        rc = self.agent.stop(signal.SIGTERM, timeout=int(60 * SCALE))
        check(rc == 0, "agent exited %d on SIGTERM:\n%s" % (rc, self.agent.output()))

    def close(self):
        if self.agent.proc.poll() is None:
            self.agent.proc.kill()
            self.agent.proc.wait()
        self.notify.close()
        self.bus.stop()


def test_get_then_watch_modified():
    with TempDir() as tmp:
        pki = remote.make_certs(tmp)
        api = ApiServer(pki, "all-1g.5gb", require_client_cert=True)
        d = Daemon(tmp, write_kubeconfig(tmp, pki, api.port))
        try:
            d.wait_labels("all-1g.5gb", "success")
            remote.wait_until("a watch request", lambda: any(q.get("watch") == ["true"] for _, q, _ in api.paths()),
                              10)
            _, q, _ = [r for r in api.paths() if r[1].get("watch")][0]
            check(q.get("resourceVersion") == ["100"], "the watch did not start at the node's resourceVersion: %r" % q)
            check(q.get("fieldSelector") == ["metadata.name=" + NODE], "watch not limited to this node: %r" % q)
            api.modified("all-2g.10gb")
            d.wait_labels("all-2g.10gb", "success")
            # The stream ends (as timeoutSeconds ends it): resumed from the last resourceVersion, no relist.
            n_get = sum(1 for p, _, _ in api.paths() if p.endswith("/" + NODE))
            api.events.put(None)
            remote.wait_until("a resumed watch", lambda: [r[1].get("resourceVersion") for r in api.paths()
                                                          if r[1].get("watch")][-1:] == [["101"]], 10,
                              lambda: repr(api.paths()))
            check(sum(1 for p, _, _ in api.paths() if p.endswith("/" + NODE)) == n_get, "the resume listed again")
            # A label naming a config the file does not have: reported as failed, GPUs left alone.
            api.modified("no-such-config")
            d.wait_labels("no-such-config", "failed")
            d.stop()
        finally:
            d.close()
            api.stop()


def test_pending_while_applying():
    """While a new nvidia.com/mig.config is applied (slow GPU instance creation), the feature file
    already says mig.config.state=pending, as the GPU Operator's MIG manager labels the node."""
    with TempDir() as tmp:
        pki = remote.make_certs(tmp)
        api = ApiServer(pki, "all-1g.5gb", require_client_cert=True)
        slow = {"FAKE_NVML_DELAY": "nvmlDeviceCreateGpuInstanceWithPlacement:*:150"}
        d = Daemon(tmp, write_kubeconfig(tmp, pki, api.port), extra_env=slow)
        try:
            d.wait_labels("all-1g.5gb", "success", timeout=int(120 * SCALE))
            api.modified("all-2g.10gb")
            d.wait_labels("all-2g.10gb", "pending", timeout=int(30 * SCALE))
            d.wait_labels("all-2g.10gb", "success", timeout=int(120 * SCALE))
            d.stop()
        finally:
            d.close()
            api.stop()


def test_410_gone_relists():
    with TempDir() as tmp:
        pki = remote.make_certs(tmp)
        api = ApiServer(pki, "all-1g.5gb", require_client_cert=True)
        d = Daemon(tmp, write_kubeconfig(tmp, pki, api.port))
        try:
            d.wait_labels("all-1g.5gb", "success")
            remote.wait_until("a watch", lambda: any(r[1].get("watch") for r in api.paths()), 10)
            # History expired; meanwhile the label changed without an event we saw.
            with api.lock:
                api.label, api.rv = "all-3g.20gb", 500
            api.events.put({"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired",
                                                        "message": "too old resource version: 100 (400)"}})
            d.wait_labels("all-3g.20gb", "success")
            gets = [p for p, _, _ in api.paths() if p.endswith("/" + NODE)]
            check(len(gets) == 2, "410 did not relist exactly once: %r" % api.paths())
            d.stop()
        finally:
            d.close()
            api.stop()


def test_401_reported_and_retried():
    with TempDir() as tmp:
        pki = remote.make_certs(tmp)
        api = ApiServer(pki, "all-1g.5gb", token="right-token")
        d = Daemon(tmp, write_kubeconfig(tmp, pki, api.port, token="wrong-token"))
        try:
            out = lambda: d.agent.output()  # noqa: E731
            remote.wait_until("the 401 in the log", lambda: "refused the credentials (HTTP 401) for node %s" % NODE
                              in out(), 10, out)
            check("Bearer wrong-token" == api.paths()[0][2], "the token was not sent: %r" % api.paths()[0][2])
            remote.wait_until("a retry", lambda: len(api.paths()) >= 2, 10)
            check("nvidia.com/mig.config" not in labels(d.node), "MIG managed without the label")
            # The credentials are fixed (the token rotated on the server side): the next retry works.
            api.token = "wrong-token"
            d.wait_labels("all-1g.5gb", "success")
            d.stop()
        finally:
            d.close()
            api.stop()


TESTS = [
    test_get_then_watch_modified,
    test_pending_while_applying,
    test_410_gone_relists,
    test_401_reported_and_retried,
]

if __name__ == "__main__":
    sys.exit(tap_main(TESTS, sys.argv[1:]))
