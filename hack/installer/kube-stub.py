#!/usr/bin/env python3
"""hack/installer/kube-stub.py - the two Node calls of the rsandbox installer, answered on
127.0.0.1 (plain HTTP) for its tests, where there is no API server: GET /api/v1/nodes/NAME
(a Node whose kubelet reports the runtime handlers given with --handlers) and PATCH of it
with a JSON merge patch of metadata.labels (null removes a label). After each PATCH the
Node's labels go to STATE (JSON), every request to STATE.log.

Usage: kube-stub.py NODE STATE PORT_FILE [--handlers rsandbox,runc]
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
        with open(state + ".log", "a") as f:
            f.write(f"{self.command} {self.path} {self.headers.get('Content-Type', '')} {body}\n")

    def do_GET(self):
        self.record()
        if self.path != f"/api/v1/nodes/{node}":
            return self.answer(404, {"kind": "Status", "message": f"no {self.path}"})
        self.answer(200, node_object())

    def do_PATCH(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0"))).decode()
        self.record(body)
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
