#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Integration tests of mig.selected-from: node-label. The real daemon (8 x A100 on the fake NVML) reads
its Node object's nvidia.com/mig.config label from a loopback HTTPS server that answers as the API server
does (GET node, a streaming watch with MODIFIED, BOOKMARK and ERROR events, Status bodies for 401, 403
and 410) and authorizes every request as the API server would: the kubelet's client certificate as the
Node authorizer does (its own Node only), a service account's bearer token by the RBAC of
packaging/kubernetes/rbac.yaml — so the agent is seen to ask for nothing that file does not grant.
Credentials come from a kubeconfig (inline CA and client certificate, or a tokenFile) or in-cluster
(KUBERNETES_SERVICE_HOST/PORT, the service account's token and ca.crt, the token rotated). The agent
applies the named config through the MIG manager and reports nvidia.com/mig.config.state in the feature
file — never nvidia.com/mig.config, the administrator's input. TAP output."""
import base64
import http.server
import json
import os
import queue
import re
import signal
import ssl
import sys
import threading
import time
import urllib.parse

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (BUILD, CTL, Agent, Bus, Fail, Node, Notify, SRC, TempDir, busctl, check, get_property,  # noqa: E402
                     run, tap_main)

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


RBAC = os.path.join(SRC, "packaging/kubernetes/rbac.yaml")
SA_USER = "system:serviceaccount:gpu-node-agent:gpu-node-agent-" + NODE


def node_object(label, rv, name=NODE):
    labels = {"kubernetes.io/hostname": name}
    if label is not None:
        labels["nvidia.com/mig.config"] = label
    return {"kind": "Node", "apiVersion": "v1",
            "metadata": {"name": name, "resourceVersion": str(rv), "labels": labels}}


def bookmark(rv):
    """A BOOKMARK as the API server sends it: the object's kind and its resourceVersion, nothing else."""
    return {"type": "BOOKMARK", "object": {"kind": "Node", "apiVersion": "v1",
                                           "metadata": {"resourceVersion": str(rv)}}}


def status(code, reason, message, details=None):
    """A metav1.Status, as the API server answers a failed request or ends a watch (ERROR event)."""
    st = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
          "reason": reason, "code": code}
    if details:
        st["details"] = details
    return st


def load_rbac(node):
    """{user: [rule]} from rbac.yaml rendered for node: what each ClusterRoleBinding grants."""
    with open(RBAC) as f:
        docs = [d for d in yaml.safe_load_all(f.read().replace("NODE_NAME", node)) if d]
    roles = {d["metadata"]["name"]: d.get("rules", []) for d in docs if d["kind"] == "ClusterRole"}
    grants = {}
    for d in docs:
        if d["kind"] != "ClusterRoleBinding":
            continue
        for sub in d["subjects"]:
            check(sub["kind"] == "ServiceAccount", "rbac.yaml binds a %s" % sub["kind"])
            user = "system:serviceaccount:%s:%s" % (sub["namespace"], sub["name"])
            grants.setdefault(user, []).extend(roles[d["roleRef"]["name"]])
    return grants


# The Node authorizer (stable since Kubernetes 1.34): a kubelet reads its own Node, no other.
KUBELET_RULES = [{"apiGroups": [""], "resources": ["nodes"], "resourceNames": [NODE],
                  "verbs": ["get", "list", "watch"]}]


def request_info(path, q):
    """(verb, resource, name) as kube-apiserver's RequestInfo makes them: a collection GET is list or
    watch, and a fieldSelector metadata.name=N gives it the name N (which RBAC resourceNames matches)."""
    parts = path.strip("/").split("/")
    if parts[:3] != ["api", "v1", "nodes"] or len(parts) > 4:
        return None, None, None
    if len(parts) == 4:
        return "get", "nodes", parts[3]
    verb = "watch" if q.get("watch", ["false"])[0] in ("true", "1") else "list"
    name = None
    sel = q.get("fieldSelector", [""])[0]
    terms = [t for t in sel.split(",") if t]
    if len(terms) == 1 and (terms[0].startswith("metadata.name=") and not terms[0].startswith("metadata.name!=")):
        name = terms[0].split("=", 1)[1].lstrip("=")
    return verb, "nodes", name


def authorized(rules, verb, resource, name):
    for r in rules:
        if "" not in r["apiGroups"] or resource not in r["resources"]:
            continue
        if verb not in r["verbs"] and "*" not in r["verbs"]:
            continue
        if not r.get("resourceNames") or (name and name in r["resourceNames"]):
            return True
    return False


class ApiServer:
    """Answers GET /api/v1/nodes/NAME with the node, and the watch with events the test queues (None
    ends the stream); every request is authenticated (token set: "Bearer token" is the service account
    of rbac.yaml, anything else 401; else the client certificate is the kubelet) and authorized (403 and
    a Status otherwise; each refused request is kept in .forbidden). name: the name the server puts into
    the Node objects it sends."""

    def __init__(self, pki, label, require_client_cert=False, token=None, name=NODE):
        self.label, self.rv, self.token, self.name = label, 100, token, name
        self.events = queue.Queue()
        self.requests = []
        self.forbidden = []
        self.watch_gen = 0
        self.rbac = load_rbac(NODE)
        self.lock = threading.Lock()
        srv = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def answer(self, code, obj):
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                u = urllib.parse.urlparse(self.path)
                q = urllib.parse.parse_qs(u.query)
                auth = self.headers.get("Authorization")
                verb, resource, name = request_info(u.path, q)
                with srv.lock:
                    if verb == "watch":
                        srv.watch_gen += 1
                    gen = srv.watch_gen
                    srv.requests.append((u.path, q, auth))
                    token = srv.token
                if token:
                    if auth != "Bearer " + token:
                        return self.answer(401, status(401, "Unauthorized", "Unauthorized"))
                    user, rules = SA_USER, srv.rbac.get(SA_USER, [])
                else:
                    user, rules = "system:node:" + NODE, KUBELET_RULES
                if not verb or not authorized(rules, verb, resource, name):
                    with srv.lock:
                        srv.forbidden.append((user, verb, resource, name, self.path))
                    what = ('nodes "%s" is forbidden' % name) if name else "nodes is forbidden"
                    return self.answer(403, status(
                        403, "Forbidden", '%s: User "%s" cannot %s resource "nodes" in API group "" at the '
                        "cluster scope" % (what, user, verb), {"name": name, "kind": "nodes"}))
                if verb == "get":
                    if name != srv.name and srv.name == NODE:
                        return self.answer(404, status(404, "NotFound", 'nodes "%s" not found' % name,
                                                       {"name": name, "kind": "nodes"}))
                    with srv.lock:
                        obj = node_object(srv.label, srv.rv, srv.name)
                    return self.answer(200, obj)
                if verb == "watch":
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    self.wfile.flush()
                    deadline = time.monotonic() + 20
                    # Only the newest watch takes events: an older one the agent left is abandoned.
                    while time.monotonic() < deadline:
                        with srv.lock:
                            if srv.watch_gen != gen:
                                return
                            try:
                                ev = srv.events.get_nowait()
                            except queue.Empty:
                                ev = False
                        if ev is False:
                            time.sleep(0.02)
                            continue
                        if ev is None:
                            break
                        data = (json.dumps(ev) + "\n").encode()
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                    return
                self.answer(405, status(405, "MethodNotAllowed", "the server does not allow this method"))

        class Quiet(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass

        Handler.protocol_version = "HTTP/1.1"
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
            obj = node_object(label, self.rv, self.name)
        self.events.put({"type": "MODIFIED", "object": obj})

    def bookmark(self, step=10):
        with self.lock:
            self.rv += step
            rv = self.rv
        self.events.put(bookmark(rv))
        return rv

    def paths(self):
        with self.lock:
            return list(self.requests)

    def watches(self):
        return [r for r in self.paths() if r[1].get("watch")]

    def gets(self):
        return [r for r in self.paths() if not r[1].get("watch")]

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


def write_service_account(tmp, pki, token):
    """A pod's /var/run/secrets/kubernetes.io/serviceaccount: token, ca.crt, namespace. The token is
    replaced as the kubelet does it (a new file renamed over the old)."""
    d = os.path.join(tmp, "serviceaccount")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(pki, "ca.pem")) as f, open(os.path.join(d, "ca.crt"), "w") as g:
        g.write(f.read())
    with open(os.path.join(d, "namespace"), "w") as f:
        f.write("gpu-node-agent")
    rotate_token(d, token)
    return d


def rotate_token(sa_dir, token):
    tmp = os.path.join(sa_dir, ".token.new")
    with open(tmp, "w") as f:
        f.write(token)
    os.rename(tmp, os.path.join(sa_dir, "token"))


def fake_mig_devices(node):
    """{gpu index: [(gi, ci, profile)]} from `fake-nvml-ctl show`: the GPUs' layout, as the fake has it."""
    p = run([CTL_FAKE, "show"], node=node, check_rc=0)
    gpus, cur, gi = {}, None, None
    for line in p.stdout.splitlines():
        m = re.match(r"^GPU (\d+) ", line)
        if m:
            cur = gpus.setdefault(int(m.group(1)), [])
            continue
        m = re.match(r"^  GI (\d+) profile \d+ \((\S+)\)", line)
        if m:
            gi = int(m.group(1))
            continue
        m = re.match(r"^    CI (\d+) profile \d+ \((\S+)\)", line)
        if m:
            cur.append((gi, int(m.group(1)), m.group(2)))
    return gpus


class Daemon:
    """The agent with mig.selected-from: node-label. kubeconfig: that file's credentials; sa_dir instead:
    in-cluster credentials (the environment a pod has, pointing at port)."""

    def __init__(self, tmp, kubeconfig=None, extra_env=None, sa_dir=None, port=None, node_name=NODE):
        self.bus = Bus(tmp)
        self.notify = Notify(tmp)
        kube = "kubernetes:\n  node-name: %s\n" % node_name
        if sa_dir:
            kube += "  credentials: in-cluster\n  service-account-dir: %s\n" % sa_dir
        else:
            kube += "  kubeconfig: %s\n" % kubeconfig
        yaml_text = ("driver:\n  enabled: false\nfabric:\n  persistenced: off\n  fabricmanager: off\n"
                     "mig:\n  config-file: %s\n  selected-from: node-label\n%s"
                     "engine:\n  retry-min: 200ms\n  retry-max: 1s\n" % (CONFIG, kube))
        self.node = Node(tmp, "a100-sxm", yaml_text)
        with open(os.path.join(self.node.confd, "40-dev.yaml"), "w") as f:
            f.write("paths:\n  dev: %s\n" % self.node.dev)
        env = {"GNA_MIG_RESET_PROGRAM": CTL_FAKE}
        if sa_dir:
            env.update({"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(port)})
        env.update(extra_env or {})
        self.agent = Agent(self.node, self.bus, self.notify, extra_env=env)
        try:
            self.notify.wait_for("READY=1", 60 * SCALE)
        except Fail:
            self.close()
            raise Fail("no READY=1; agent output:\n" + self.agent.output())

    def mig_config(self):
        """The MigConfig property (through gpunodectl): the config the agent keeps, "" none."""
        return self.mig_show()["config"] or ""

    def mig_show(self):
        return json.loads(run([CTL, "--json", "mig"], bus=self.bus, check_rc=0).stdout)

    def wait_labels(self, config, state, timeout=20):
        """mig.config.state=state in the feature file (None: absent) and MigConfig=config on D-Bus; the
        feature file never has nvidia.com/mig.config (it is the administrator's input on the Node: NFD
        would put our copy back over it)."""
        def ok():
            lab = labels(self.node)
            check("nvidia.com/mig.config" not in lab,
                  "the feature file publishes the input label nvidia.com/mig.config: %r" % lab)
            # D-Bus says config and state together; the feature file follows in the pass after.
            shown = self.mig_show()
            return ((shown["config"] or "") == (config or "") and shown["state"] == state and
                    lab.get("nvidia.com/mig.config.state") == state)
        remote.wait_until("mig.config.state=%s, MigConfig=%s" % (state, config), ok, timeout,
                          lambda: "%r %r\n%s" % (labels(self.node), self.mig_show(), self.agent.output()))

    def reconcile(self):
        busctl(self.bus, "call", "org.gpunodeagent.Agent1", "/org/gpunodeagent/Agent1",
               "org.gpunodeagent.Agent1.Manager", "Reconcile")

    def stop(self):
        rc = self.agent.stop(signal.SIGTERM, timeout=int(60 * SCALE))
        check(rc == 0, "agent exited %d on SIGTERM:\n%s" % (rc, self.agent.output()))

    def close(self):
        if self.agent.proc.poll() is None:
            self.agent.proc.kill()
            self.agent.proc.wait()
        self.notify.close()
        self.bus.stop()


def check_granted(api):
    check(api.forbidden == [], "the agent asked for what RBAC does not grant: %r" % api.forbidden)


def wait_watch(api, n, what="a watch request"):
    remote.wait_until(what, lambda: len(api.watches()) >= n, 10, lambda: repr(api.paths()))


def test_rbac_file_is_minimal():
    """rbac.yaml grants get and watch of the one Node and nothing else (no write, no other resource)."""
    grants = load_rbac(NODE)
    check(list(grants) == [SA_USER], "rbac.yaml binds %r" % list(grants))
    for r in grants[SA_USER]:
        check(r["apiGroups"] == [""] and r["resources"] == ["nodes"] and r["resourceNames"] == [NODE] and
              sorted(r["verbs"]) == ["get", "watch"], "rbac.yaml grants more than get/watch of its Node: %r" % r)
    check(authorized(grants[SA_USER], "watch", "nodes", NODE), "the watch of the node is not granted")
    check(not authorized(grants[SA_USER], "watch", "nodes", None), "a watch of all nodes is granted")
    check(not authorized(grants[SA_USER], "get", "nodes", "gpu-node-8"), "another node is granted")


def test_get_then_watch_modified():
    with TempDir() as tmp:
        pki = remote.make_certs(tmp)
        api = ApiServer(pki, "all-1g.5gb", require_client_cert=True)
        d = Daemon(tmp, write_kubeconfig(tmp, pki, api.port))
        try:
            d.wait_labels("all-1g.5gb", "success")
            wait_watch(api, 1)
            _, q, _ = api.watches()[0]
            check(q.get("resourceVersion") == ["100"], "the watch did not start at the node's resourceVersion: %r" % q)
            check(q.get("fieldSelector") == ["metadata.name=" + NODE], "watch not limited to this node: %r" % q)
            check(q.get("allowWatchBookmarks") == ["true"], "the watch does not ask for bookmarks: %r" % q)
            api.modified("all-2g.10gb")
            d.wait_labels("all-2g.10gb", "success")
            # The stream ends (as timeoutSeconds ends it): resumed from the last resourceVersion, no relist.
            n_get = len(api.gets())
            api.events.put(None)
            remote.wait_until("a resumed watch", lambda: [r[1].get("resourceVersion") for r in api.watches()][-1:]
                              == [["101"]], 10, lambda: repr(api.paths()))
            check(len(api.gets()) == n_get, "the resume listed again")
            check_granted(api)
            d.stop()
        finally:
            d.close()
            api.stop()


def test_bookmarks_keep_the_layout():
    """BOOKMARKs (a resourceVersion, no labels) between the events are resume points, not the Node: the
    selection stays, a GPU reset is undone by the next pass, the resumed watch starts at the last
    bookmark."""
    with TempDir() as tmp:
        pki = remote.make_certs(tmp)
        api = ApiServer(pki, "all-1g.5gb", require_client_cert=True)
        d = Daemon(tmp, write_kubeconfig(tmp, pki, api.port))
        try:
            d.wait_labels("all-1g.5gb", "success")
            wait_watch(api, 1)
            api.bookmark()
            api.modified("all-2g.10gb")
            api.bookmark()
            d.wait_labels("all-2g.10gb", "success")
            layout = fake_mig_devices(d.node)
            check(all(len(v) == 3 for v in layout.values()) and len(layout) == 8, "not all-2g.10gb: %r" % layout)
            last = api.bookmark()
            api.bookmark(step=0)  # the same resourceVersion again, as a quiet server repeats it
            time.sleep(0.5)
            d.wait_labels("all-2g.10gb", "success")
            # The GPUs lose their instances (a reset behind the agent's back): the next pass re-applies.
            run([CTL_FAKE, "reset"], node=d.node, check_rc=0)
            check(fake_mig_devices(d.node) != layout, "the reset left the instances")
            d.reconcile()
            remote.wait_until("all-2g.10gb again after the reset", lambda: fake_mig_devices(d.node) == layout, 30,
                              lambda: "%r\n%s" % (fake_mig_devices(d.node), d.agent.output()))
            d.wait_labels("all-2g.10gb", "success")
            # Resumed from the last bookmark's resourceVersion, without a relist.
            n_get = len(api.gets())
            api.events.put(None)
            remote.wait_until("a watch resumed at the bookmark",
                              lambda: [r[1].get("resourceVersion") for r in api.watches()][-1:] == [[str(last)]], 10,
                              lambda: repr(api.paths()))
            check(len(api.gets()) == n_get, "the resume listed again")
            check("not set" not in d.agent.output(), "a bookmark was taken for an unset label:\n" + d.agent.output())
            check_granted(api)
            d.stop()
        finally:
            d.close()
            api.stop()


def test_error_event_resumes_with_backoff():
    """An ERROR event other than 410 (a Status, not a Node) ends the watch; it is resumed from the same
    resourceVersion after the backoff, without a relist, and the selection stays."""
    with TempDir() as tmp:
        pki = remote.make_certs(tmp)
        api = ApiServer(pki, "all-1g.5gb", require_client_cert=True)
        d = Daemon(tmp, write_kubeconfig(tmp, pki, api.port))
        try:
            d.wait_labels("all-1g.5gb", "success")
            wait_watch(api, 1)
            rv = api.bookmark()
            api.events.put({"type": "ERROR", "object": status(500, "InternalError",
                                                              "etcdserver: leader changed")})
            d.agent.wait_output("ended the watch of node %s with an ERROR event (code 500: etcdserver: leader "
                                "changed)" % NODE, 10 * SCALE, "the ERROR event in the log")
            wait_watch(api, 2, "the resumed watch")
            check(api.watches()[-1][1].get("resourceVersion") == [str(rv)], "not resumed at %d: %r" % (rv, api.paths()))
            check(len(api.gets()) == 1, "an ERROR other than 410 listed again: %r" % api.paths())
            d.wait_labels("all-1g.5gb", "success")
            api.modified("all-3g.20gb")
            d.wait_labels("all-3g.20gb", "success")
            check_granted(api)
            d.stop()
        finally:
            d.close()
            api.stop()


def test_label_removed_not_published():
    """The agent never writes nvidia.com/mig.config (wait_labels checks it every time): after the label is
    removed from the Node nothing would put it back. MIG is then not managed: no mig.config.state
    either, and the GPUs are left as they are."""
    with TempDir() as tmp:
        pki = remote.make_certs(tmp)
        api = ApiServer(pki, "all-1g.5gb", require_client_cert=True)
        d = Daemon(tmp, write_kubeconfig(tmp, pki, api.port))
        try:
            d.wait_labels("all-1g.5gb", "success")
            layout = fake_mig_devices(d.node)
            wait_watch(api, 1)
            api.modified(None)
            d.wait_labels(None, None)
            check(fake_mig_devices(d.node) == layout, "removing the label changed the GPUs")
            d.agent.wait_output("Node label nvidia.com/mig.config is not set.", 10, "the removal in the log")
            api.modified("all-1g.5gb")
            d.wait_labels("all-1g.5gb", "success")
            check_granted(api)
            d.stop()
        finally:
            d.close()
            api.stop()


def test_unknown_config_refused():
    """A label naming no config of mig.config-file: mig.config.state=failed with the reason (D-Bus, the
    mig stage, the journal), nothing applied."""
    with TempDir() as tmp:
        pki = remote.make_certs(tmp)
        api = ApiServer(pki, "all-1g.5gb", require_client_cert=True)
        d = Daemon(tmp, write_kubeconfig(tmp, pki, api.port))
        try:
            d.wait_labels("all-1g.5gb", "success")
            layout = fake_mig_devices(d.node)
            wait_watch(api, 1)
            api.modified("no-such-config")
            d.wait_labels("no-such-config", "failed")
            check(get_property(d.bus, "MigConfigState") == 's "failed"', "MigConfigState")
            shown = d.mig_show()
            check(shown["state"] == "failed" and "no-such-config" in (shown["stage_message"] or ""), shown)
            check(fake_mig_devices(d.node) == layout, "a refused config changed the GPUs")
            d.stop()
        finally:
            d.close()
            api.stop()


def test_hostile_values_refused():
    """What only a broken or hostile server sends — a label value too long for a label, one with control
    bytes, an object of another node — is refused with a clear error; nothing is applied, the agent
    stays up, D-Bus stays readable."""
    with TempDir() as tmp:
        pki = remote.make_certs(tmp)
        api = ApiServer(pki, "all-1g.5gb", require_client_cert=True)
        d = Daemon(tmp, write_kubeconfig(tmp, pki, api.port))
        try:
            d.wait_labels("all-1g.5gb", "success")
            layout = fake_mig_devices(d.node)
            wait_watch(api, 1)
            api.modified("all-1g.5gb" + "x" * 4000)
            d.wait_labels("all-1g.5gb" + "x" * 70 + "...", "failed")
            shown = d.mig_show()
            check("not a valid label value" in shown["stage_message"] and "nothing was applied" in
                  shown["stage_message"], shown)
            api.modified("all-1g.5gb\n\x01\u00ff;$(reboot)")
            d.wait_labels("all-1g.5gb\\x0a\\x01\\xc3\\xbf;$(reboot)", "failed")
            check(fake_mig_devices(d.node) == layout, "a refused value changed the GPUs")
            # Another node's object on our watch: ignored, said so.
            with api.lock:
                api.rv += 1
                other = node_object("all-7g.80gb", api.rv, "gpu-node-8")
            api.events.put({"type": "MODIFIED", "object": other})
            d.agent.wait_output("for the Node 'gpu-node-8', not for this node %s (kubernetes.node-name); ignored" % NODE,
                                10 * SCALE, "the other node's object refused")
            d.wait_labels("all-1g.5gb\\x0a\\x01\\xc3\\xbf;$(reboot)", "failed")
            api.modified("all-1g.5gb")
            d.wait_labels("all-1g.5gb", "success")
            check(fake_mig_devices(d.node) == layout, "the GPUs moved")
            d.stop()
        finally:
            d.close()
            api.stop()


def test_other_node_get_refused():
    """The node name is local configuration: a server answering the GET with another Node is refused,
    MIG is not managed from it, and no watch starts from its resourceVersion."""
    with TempDir() as tmp:
        pki = remote.make_certs(tmp)
        api = ApiServer(pki, "all-1g.5gb", require_client_cert=True, name="gpu-node-8")
        d = Daemon(tmp, write_kubeconfig(tmp, pki, api.port))
        try:
            d.agent.wait_output("sent an answer to the GET for the Node 'gpu-node-8', not for this node %s" % NODE,
                                10 * SCALE, "the other node refused")
            remote.wait_until("a retry", lambda: len(api.gets()) >= 2, 10)
            check(api.watches() == [], "a watch started from another node's object: %r" % api.paths())
            d.wait_labels(None, None)
            d.stop()
        finally:
            d.close()
            api.stop()


def test_in_cluster_rbac_token_rotation():
    """In-cluster credentials (the environment, token and ca.crt of a pod), authorized by nothing but
    rbac.yaml. The kubelet rotates the token and the server stops taking the old one: the 401 makes the
    agent read the token file again and retry at once — no error reported, no backoff."""
    with TempDir() as tmp:
        pki = remote.make_certs(tmp)
        api = ApiServer(pki, "all-1g.5gb", token="token-1")
        sa = write_service_account(tmp, pki, "token-1")
        d = Daemon(tmp, sa_dir=sa, port=api.port)
        try:
            d.wait_labels("all-1g.5gb", "success")
            wait_watch(api, 1)
            check(api.paths()[0][2] == "Bearer token-1", "the token was not sent: %r" % api.paths()[0][2])
            rotate_token(sa, "token-2\n")
            with api.lock:
                api.token = "token-2"
            n = len(api.paths())
            api.events.put(None)  # the watch ends; the next request has the old token
            remote.wait_until("a watch with the new token", lambda: any(
                r[2] == "Bearer token-2" and r[1].get("watch") for r in api.paths()[n:]), 10, lambda: repr(api.paths()))
            after = api.paths()[n:]
            check([r[2] for r in after[:2]] == ["Bearer token-1", "Bearer token-2"],
                  "not one 401 then the new token: %r" % after)
            check("refused the credentials" not in d.agent.output(), "the rotation was reported:\n" + d.agent.output())
            api.modified("all-2g.10gb")
            d.wait_labels("all-2g.10gb", "success")
            check_granted(api)
            d.stop()
        finally:
            d.close()
            api.stop()


def test_rbac_other_node_forbidden():
    """Credentials granted for gpu-node-7, an agent configured as gpu-node-8: 403, reported with what is
    missing; nothing managed."""
    with TempDir() as tmp:
        pki = remote.make_certs(tmp)
        api = ApiServer(pki, "all-1g.5gb", token="token-1")
        sa = write_service_account(tmp, pki, "token-1")
        d = Daemon(tmp, sa_dir=sa, port=api.port, node_name="gpu-node-8")
        try:
            d.agent.wait_output("forbids the service account token %s/token to get (HTTP 403) of node gpu-node-8; "
                                "they need get and watch on that Node" % sa, 10 * SCALE, "the 403 in the log")
            check(api.forbidden and api.forbidden[0][1:4] == ("get", "nodes", "gpu-node-8"), repr(api.forbidden))
            d.wait_labels(None, None)
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
            wait_watch(api, 1)
            # History expired; meanwhile the label changed without an event we saw.
            with api.lock:
                api.label, api.rv = "all-3g.20gb", 500
            api.events.put({"type": "ERROR", "object": status(410, "Expired",
                                                              "too old resource version: 100 (400)")})
            d.wait_labels("all-3g.20gb", "success")
            check(len(api.gets()) == 2, "410 did not relist exactly once: %r" % api.paths())
            check_granted(api)
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
            check("nvidia.com/mig.config.state" not in labels(d.node), "MIG managed without the label")
            # The credentials are fixed (the token rotated on the server side): the next retry works.
            api.token = "wrong-token"
            d.wait_labels("all-1g.5gb", "success")
            d.stop()
        finally:
            d.close()
            api.stop()


TESTS = [
    test_rbac_file_is_minimal,
    test_get_then_watch_modified,
    test_bookmarks_keep_the_layout,
    test_error_event_resumes_with_backoff,
    test_label_removed_not_published,
    test_unknown_config_refused,
    test_hostile_values_refused,
    test_other_node_get_refused,
    test_pending_while_applying,
    test_410_gone_relists,
    test_401_reported_and_retried,
    test_in_cluster_rbac_token_rotation,
    test_rbac_other_node_forbidden,
]

if __name__ == "__main__":
    sys.exit(tap_main(TESTS, sys.argv[1:]))
