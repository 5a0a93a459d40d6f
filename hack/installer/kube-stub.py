#!/usr/bin/env python3
"""hack/installer/kube-stub.py - the two Node calls of the rsandbox installer, answered on
127.0.0.1 (plain HTTP) for its tests, where there is no API server: GET /api/v1/nodes/NAME
(a Node whose kubelet reports the runtime handlers given with --handlers) and PATCH of it
with a JSON merge patch of metadata.labels (null removes a label). After each PATCH the
Node's labels go to STATE (JSON), every request to STATE.log.

With --token FILE, a request must carry `Authorization: Bearer <FILE's token>` (else 401),
and while each request waits for its answer (its curl is alive, with whatever argv it has)
every /proc/<pid>/cmdline of this PID namespace is read: the log line of the request ends in
"argv: token-seen=N curl-seen=M", N the processes whose argv hold the token (must be 0), M
those whose argv hold curl and this request's path (at least the requester: a scan that saw
no requester proves nothing).

Usage: kube-stub.py NODE STATE PORT_FILE [--handlers rsandbox,runc] [--token FILE]
Prints nothing; writes the port it listens on to PORT_FILE; runs until killed.
"""
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

node, state, port_file = sys.argv[1:4]
handlers = ["rsandbox", "runc"]
if "--handlers" in sys.argv:
    handlers = [h for h in sys.argv[sys.argv.index("--handlers") + 1].split(",") if h]
labels = {"kubernetes.io/hostname": node}
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
        "metadata": {"name": node, "labels": dict(labels)},
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
            f.write(f"{self.command} {self.path} {self.headers.get('Content-Type', '')} {body}{scan}\n")

    def authorized(self):
        if token is None or self.headers.get("Authorization") == f"Bearer {token}":
            return True
        self.answer(401, {"kind": "Status", "message": "no or a wrong bearer token"})
        return False

    def do_GET(self):
        self.record()
        if not self.authorized():
            return
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
