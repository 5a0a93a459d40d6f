#!/usr/bin/env python3
"""hack/installer/kube-stub.py - the rsandbox installer's calls, answered on 127.0.0.1 (plain
HTTP) for its tests, where there is no API server, as the API server answers them:
- GET /api/v1/nodes/NAME (a Node whose kubelet reports the runtime handlers given with
  --handlers) and PATCH of it with a JSON merge patch of metadata.labels (null removes a
  label). After each PATCH the Node's labels go to STATE (JSON).
- coordination.k8s.io/v1 Leases (the restart slots): GET (404 NotFound when absent), POST
  (201; 409 AlreadyExists when the name is taken), PUT (200; 409 Conflict when the body's
  metadata.resourceVersion is not the stored one, as the API server's optimistic concurrency
  answers; a body without one is an unconditional update, as Leases allow). Every lease, after
  each change, goes to STATE.leases (JSON object "NS/NAME": lease).
- core/v1 Events: POST /api/v1/namespaces/NS/events (201, metadata.generateName honoured;
  422 Invalid for an Event without eventTime about a cluster-scoped object outside "default",
  as ValidateEvent refuses it). Each goes to STATE.events, one JSON a line.
With --forbid-patch, every PATCH of the Node answers 403 Forbidden, as the API server does
for the installer's account before (or after) the label grant deploy/kubernetes/node-labels:
RBAC gives it no `patch` on Nodes. --labels k=v,k2=v2 gives the Node those labels at start.
Every request goes to STATE.log: "METHOD PATH CONTENT-TYPE BODY [argv: ...] t=UNIX-TIME".

With --token FILE, a request must carry `Authorization: Bearer <FILE's token>` (else 401),
and while each request waits for its answer (its curl is alive, with whatever argv it has)
every /proc/<pid>/cmdline of this PID namespace is read: the log line of the request ends in
"argv: token-seen=N curl-seen=M", N the processes whose argv hold the token (must be 0), M
those whose argv hold curl and this request's path (at least the requester: a scan that saw
no requester proves nothing).

Usage: kube-stub.py NODE STATE PORT_FILE [--handlers rsandbox,runc] [--token FILE]
                    [--forbid-patch] [--labels k=v,...]
Prints nothing; writes the port it listens on to PORT_FILE; runs until killed.
"""
import json
import os
import random
import string
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

node, state, port_file = sys.argv[1:4]
handlers = ["rsandbox", "runc"]
if "--handlers" in sys.argv:
    handlers = [h for h in sys.argv[sys.argv.index("--handlers") + 1].split(",") if h]
labels = {"kubernetes.io/hostname": node}
if "--labels" in sys.argv:
    labels.update(kv.split("=", 1) for kv in sys.argv[sys.argv.index("--labels") + 1].split(",") if kv)
forbid_patch = "--forbid-patch" in sys.argv
leases = {}
revision = [1000]
token = None
if "--token" in sys.argv:
    with open(sys.argv[sys.argv.index("--token") + 1]) as f:
        token = f.read().strip()


def argv_scan(path):
    """How many processes have the token on their argv, and how many are a curl of path."""
    seen = curls = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read()
        except OSError:
            continue
        if token and token.encode() in argv:
            seen += 1
        words = argv.split(b"\0")
        if any(w.endswith(b"curl") for w in words[:1]) and path.encode() in argv:
            curls += 1
    return seen, curls


def node_object():
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node, "uid": "6f1f5a52-0000-4000-8000-" + node.encode().hex()[:12].ljust(12, "0"), "labels": dict(labels)},
        "status": {"runtimeHandlers": [{"name": ""}] + [{"name": h} for h in handlers]},
    }


class Handler(BaseHTTPRequestHandler):
    def answer(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def record(self, body=""):
        scan = ""
        if token:
            scan = " argv: token-seen=%d curl-seen=%d" % argv_scan(self.path)
        with open(state + ".log", "a") as f:
            f.write(f"{self.command} {self.path} {self.headers.get('Content-Type', '')} {body}{scan} t={time.time():.6f}\n")

    def authorized(self):
        if token is None or self.headers.get("Authorization") == f"Bearer {token}":
            return True
        self.answer(401, {"kind": "Status", "message": "no or a wrong bearer token"})
        return False

    def status(self, code, reason, message):
        self.answer(code, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                           "message": message, "reason": reason, "code": code})

    def body_json(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0"))).decode()
        self.record(body)
        if not self.authorized():
            return None
        if self.headers.get("Content-Type") != "application/json":
            self.status(415, "UnsupportedMediaType", "want application/json")
            return None
        try:
            return json.loads(body)
        except ValueError as e:
            self.status(400, "BadRequest", f"not JSON: {e}")
            return None

    def lease_path(self):
        """(namespace, name or None) of a Lease path, else None"""
        p = self.path.split("/")
        # ['', 'apis', 'coordination.k8s.io', 'v1', 'namespaces', NS, 'leases'(, NAME)]
        if len(p) in (7, 8) and p[1:5] == ["apis", "coordination.k8s.io", "v1", "namespaces"] and p[6] == "leases":
            return p[5], (p[7] if len(p) == 8 else None)
        return None

    def save_leases(self):
        with open(state + ".leases.new", "w") as f:
            json.dump({f"{k[0]}/{k[1]}": v for k, v in leases.items()}, f)
        os.replace(state + ".leases.new", state + ".leases")

    def store_lease(self, ns, name, obj, code):
        revision[0] += 1
        obj.setdefault("metadata", {}).update({"name": name, "namespace": ns, "resourceVersion": str(revision[0])})
        obj["metadata"].setdefault("uid", "lease-%d" % revision[0])
        obj["apiVersion"], obj["kind"] = "coordination.k8s.io/v1", "Lease"
        leases[(ns, name)] = obj
        self.save_leases()
        self.answer(code, obj)

    def do_POST(self):
        obj = self.body_json()
        if obj is None:
            return
        lp = self.lease_path()
        if lp and lp[1] is None:
            ns, name = lp[0], obj.get("metadata", {}).get("name", "")
            if obj.get("kind") != "Lease" or not name:
                return self.status(400, "BadRequest", "want a Lease with metadata.name")
            if obj["metadata"].get("namespace", ns) != ns:
                return self.status(400, "BadRequest", "the namespace of the provided object does not match the namespace sent on the request")
            if (ns, name) in leases:
                return self.status(409, "AlreadyExists", f'leases.coordination.k8s.io "{name}" already exists')
            if obj["metadata"].get("resourceVersion"):
                return self.status(400, "BadRequest", "resourceVersion should not be set on objects to be created")
            return self.store_lease(ns, name, obj, 201)
        p = self.path.split("/")
        if len(p) == 6 and p[1:4] == ["api", "v1", "namespaces"] and p[5] == "events":
            ns, meta = p[4], obj.get("metadata", {})
            if obj.get("kind") != "Event" or not (meta.get("name") or meta.get("generateName")):
                return self.status(400, "BadRequest", "want an Event with metadata.name or generateName")
            if meta.get("namespace", ns) != ns:
                return self.status(400, "BadRequest", "the namespace of the provided object does not match the namespace sent on the request")
            inv = obj.get("involvedObject", {})
            if not obj.get("eventTime") and not inv.get("namespace") and ns not in ("", "default"):
                return self.status(422, "Invalid", 'Event "x" is invalid: involvedObject.namespace: Invalid value: "": does not match event.namespace')
            if not meta.get("name"):
                meta["name"] = meta["generateName"] + "".join(random.choice(string.ascii_lowercase + string.digits) for _ in range(5))
            meta["namespace"] = ns
            obj["metadata"] = meta
            with open(state + ".events", "a") as f:
                f.write(json.dumps(obj) + "\n")
            return self.answer(201, obj)
        self.status(404, "NotFound", f"no {self.path}")

    def do_PUT(self):
        obj = self.body_json()
        if obj is None:
            return
        lp = self.lease_path()
        if not lp or lp[1] is None:
            return self.status(404, "NotFound", f"no {self.path}")
        ns, name = lp
        if obj.get("metadata", {}).get("name") != name:
            return self.status(400, "BadRequest", "the name of the object does not match the name on the URL")
        old = leases.get((ns, name))
        if old is None:
            return self.status(404, "NotFound", f'leases.coordination.k8s.io "{name}" not found')
        rv = obj["metadata"].get("resourceVersion")
        if rv and rv != old["metadata"]["resourceVersion"]:
            return self.status(409, "Conflict", f'Operation cannot be fulfilled on leases.coordination.k8s.io "{name}": the object has been modified; please apply your changes to the latest version and try again')
        obj["metadata"]["uid"] = old["metadata"]["uid"]
        self.store_lease(ns, name, obj, 200)

    def do_GET(self):
        self.record()
        if not self.authorized():
            return
        lp = self.lease_path()
        if lp and lp[1] is not None:
            if lp not in leases:
                return self.status(404, "NotFound", f'leases.coordination.k8s.io "{lp[1]}" not found')
            return self.answer(200, leases[lp])
        if self.path != f"/api/v1/nodes/{node}":
            return self.answer(404, {"kind": "Status", "message": f"no {self.path}"})
        self.answer(200, node_object())

    def do_PATCH(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0"))).decode()
        self.record(body)
        if not self.authorized():
            return
        if self.path != f"/api/v1/nodes/{node}":
            return self.answer(404, {"kind": "Status", "message": f"no {self.path}"})
        if forbid_patch:
            # the RBAC authorizer's answer (no rule grants the verb), before any admission
            return self.status(403, "Forbidden", f'nodes "{node}" is forbidden: User "system:serviceaccount:rsandbox-system:rsandbox-node-installer" cannot patch resource "nodes" in API group "" at the cluster scope')
        if self.headers.get("Content-Type") != "application/merge-patch+json":
            return self.answer(415, {"kind": "Status", "message": "want a JSON merge patch"})
        patch = json.loads(body)
        if set(patch) != {"metadata"} or set(patch["metadata"]) != {"labels"}:
            return self.answer(422, {"kind": "Status", "message": "only metadata.labels may change"})
        for k, v in patch["metadata"]["labels"].items():
            if v is None:
                labels.pop(k, None)
            else:
                labels[k] = v
        with open(state + ".new", "w") as f:
            json.dump(labels, f)
        os.replace(state + ".new", state)
        self.answer(200, node_object())

    def log_message(self, *args):
        pass


with open(state + ".new", "w") as f:
    json.dump(labels, f)
os.replace(state + ".new", state)
server = HTTPServer(("127.0.0.1", 0), Handler)
with open(port_file + ".new", "w") as f:
    f.write(str(server.server_address[1]))
os.replace(port_file + ".new", port_file)
server.serve_forever()
