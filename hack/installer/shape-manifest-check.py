#!/usr/bin/env python3
"""hack/installer/shape-manifest-check.py - the node-shape components (deploy/kubernetes/shapes/*)
as kustomize builds them over deploy/kubernetes, judged against the base build, and the
installer pod each gives, written for the node test that runs it (integration/tests/installer/
distro.rs runs the installer image with exactly these volumes and arguments).

Usage: shape-manifest-check.py BASE.yaml OUT-DIR NAME=SHAPE.yaml...
  BASE.yaml   `kustomize build deploy/kubernetes`
  SHAPE.yaml  the same with the component deploy/kubernetes/shapes/NAME
Writes OUT-DIR/NAME.json: {"args": [...], "volumes": [{"name", "path", "type", "mountPath",
"readOnly"}]} of the DaemonSet's hostPath volumes. Prints one line per shape; exit status 1 when
any check fails:
  - every object but the DaemonSet is the base's, unchanged;
  - the DaemonSet differs only in hostPath paths, their mount paths, added hostPath volumes and
    one added `--distro=NAME` argument;
  - each hostPath volume is mounted at /host + its path (the installer's --host-root view of the
    node), and every volume of the base is still there under its name.
"""
import copy
import json
import sys

import yaml


def objects(path):
    with open(path) as f:
        return [o for o in yaml.safe_load_all(f) if o]


def daemonset(objs):
    ds = [o for o in objs if o.get("kind") == "DaemonSet"]
    if len(ds) != 1:
        raise SystemExit(f"want one DaemonSet, found {len(ds)}")
    return ds[0]


def host_volumes(ds):
    pod = ds["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in pod["containers"][0].get("volumeMounts", [])}
    out = []
    for v in pod.get("volumes", []):
        if "hostPath" not in v:
            continue
        m = mounts.get(v["name"])
        out.append(
            {
                "name": v["name"],
                "path": v["hostPath"]["path"],
                "type": v["hostPath"].get("type", ""),
                "mountPath": m["mountPath"] if m else None,
                "readOnly": bool(m and m.get("readOnly")),
            }
        )
    return out


def without_paths(ds):
    """The DaemonSet with what a shape may change blanked: host paths, their mount paths, the
    host volumes a shape adds, the --distro argument."""
    d = copy.deepcopy(ds)
    pod = d["spec"]["template"]["spec"]
    c = pod["containers"][0]
    base_names = {"containerd-config", "install-dir", "containerd-run", "state", "lock",
                  "systemd-private", "tmp"}
    pod["volumes"] = [v for v in pod["volumes"] if v["name"] in base_names]
    c["volumeMounts"] = [m for m in c["volumeMounts"] if m["name"] in base_names]
    for v in pod["volumes"]:
        if "hostPath" in v:
            v["hostPath"]["path"] = "*"
    for m in c["volumeMounts"]:
        m["mountPath"] = "*"
    c["args"] = [a for a in c["args"] if not a.startswith("--distro=")]
    return d


def main(argv):
    if len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    base = objects(argv[1])
    out_dir = argv[2]
    base_ds = daemonset(base)
    base_rest = [o for o in base if o.get("kind") != "DaemonSet"]
    failed = 0
    # the base too, for the test's containerd shape
    shapes = [("base", argv[1])] + [a.split("=", 1) for a in argv[3:]]
    for name, path in shapes:
        objs = objects(path)
        ds = daemonset(objs)
        problems = []
        if [o for o in objs if o.get("kind") != "DaemonSet"] != base_rest:
            problems.append("objects other than the DaemonSet differ from the base's")
        if without_paths(ds) != without_paths(base_ds):
            problems.append("the DaemonSet changes more than host paths, mount paths, --distro")
        args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
        distro = [a for a in args if a.startswith("--distro=")]
        if name != "base" and distro != [f"--distro={name}"]:
            problems.append(f"--distro arguments {distro}, want [--distro={name}]")
        vols = host_volumes(ds)
        for v in vols:
            if v["mountPath"] != "/host" + v["path"] and v["name"] != "systemd-private":
                problems.append(f"volume {v['name']}: host {v['path']} mounted at {v['mountPath']}")
        if problems:
            failed += 1
            print(f"shape {name}: FAILED: " + "; ".join(problems))
            continue
        with open(f"{out_dir}/{name}.json", "w") as f:
            json.dump({"args": args, "volumes": vols}, f, indent=1)
        changed = [v["name"] + "=" + v["path"] for v in vols
                   if v not in host_volumes(base_ds)]
        print(f"shape {name}: ok ({', '.join(changed) or 'the base'}{', ' + distro[0] if distro else ''})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
