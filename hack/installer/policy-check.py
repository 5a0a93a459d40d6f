#!/usr/bin/env python3
"""hack/installer/policy-check.py - deploy/kubernetes's admission policies and RBAC, judged on
the manifests as kustomize builds them (hack/installer/test.sh runs it with the venv's python,
where cel-python, module celpy, is pinned).

Usage: policy-check.py INSTALL.yaml NODE_LABELS.yaml
  INSTALL.yaml      `kustomize build deploy/kubernetes`
  NODE_LABELS.yaml  `kustomize build deploy/kubernetes/node-labels`
Prints one line per check; exit status 1 when any fails.

Also the installer pod's privileges (issue 34 item 6): no privileged container, no host `/`
(nor any hostPath that holds it), no nsenter, every capability dropped but those added back,
and every hostPath and added capability named in docs/install.md's table (its section "The
installer pod's privileges"), which gives the reason for each.

The policies' own CEL (validations, matchConditions, variables, read from the YAML) is
evaluated by cel-python on admission requests shaped as the API server hands them to a
ValidatingAdmissionPolicy: `object` as it will be stored (a create's defaults and service
account volume added, omitted fields absent: a pod that is not hostNetwork has no hostNetwork
field; a merge patch applied to the stored Node and managedFields updated), `oldObject` (null
on create), `request` (the AdmissionRequest: kind, resource, operation, userInfo with a
pod-bound token's extra). The order is the API server's (validating/dispatcher.go and
validator.go): matchConstraints, the binding, its params, then matchConditions, variables and
validations; an expression's error counts as failurePolicy says. cel-python is standard CEL:
the policies use no Kubernetes CEL library function, which this check would refuse to compile.
"""
import copy
import json
import re
import sys

import celpy
import yaml

failures = 0


def check(name, ok, detail=""):
    global failures
    if ok:
        print(f"ok: {name}")
    else:
        failures += 1
        print(f"FAILED: {name}{': ' + detail if detail else ''}", file=sys.stderr)


def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


install = load(sys.argv[1])
node_labels = load(sys.argv[2])
policies = {o["metadata"]["name"]: o for o in install if o["kind"] == "ValidatingAdmissionPolicy"}
bindings = [o for o in install if o["kind"] == "ValidatingAdmissionPolicyBinding"]

# --- the API server's evaluation of one request -------------------------------------------

env = celpy.Environment()
programs = {}


def program(expr):
    if expr not in programs:
        programs[expr] = env.program(env.compile(expr))
    return programs[expr]


def evaluate(expr, activation):
    """(value, None) or (None, error text)"""
    try:
        value = program(expr).evaluate(activation)
    except celpy.CELEvalError as e:
        return None, str(e)
    if isinstance(value, celpy.CELEvalError):
        return None, str(value)
    return value, None


def rule_matches(rules, req):
    for r in rules:
        if (
            any(g in ("*", req["resource"]["group"]) for g in r.get("apiGroups", []))
            and any(v in ("*", req["resource"]["version"]) for v in r.get("apiVersions", []))
            and any(o in ("*", req["operation"]) for o in r.get("operations", []))
            and any(x in ("*", req["resource"]["resource"]) for x in r.get("resources", []))
            and not req.get("subResource")
        ):
            return True
    return False


def admit(req):
    """None when the request is admitted, else 'policy: message' of the first refusal"""
    for binding in bindings:
        policy = policies.get(binding["spec"]["policyName"])
        if policy is None:
            continue
        spec = policy["spec"]
        if not rule_matches(spec["matchConstraints"]["resourceRules"], req):
            continue
        if "matchResources" in binding["spec"]:
            raise SystemExit(f"binding {binding['metadata']['name']}: matchResources not modelled here")
        refuse_on_error = spec.get("failurePolicy", "Fail") == "Fail"
        where = policy["metadata"]["name"]
        # the params are looked up before matchConditions run. Kubernetes issue 133827: the
        # lookup can find nothing while the param object exists; modelled as that failure,
        # which with parameterNotFoundAction Deny is a configuration error (failurePolicy)
        ref = binding["spec"].get("paramRef")
        if "paramKind" in spec and ref:
            if ref.get("parameterNotFoundAction") == "Deny":
                if refuse_on_error:
                    return f"{where}: failed to configure binding: no params found (issue 133827)"
            continue
        act = {
            "object": celpy.json_to_cel(req.get("object")),
            "oldObject": celpy.json_to_cel(req.get("oldObject")),
            "request": celpy.json_to_cel(req),
        }
        matched = True
        for cond in spec.get("matchConditions", []):
            value, err = evaluate(cond["expression"], act)
            if err:
                if refuse_on_error:
                    return f"{where}: matchCondition {cond['name']}: {err}"
                matched = False
                break
            if not value:
                matched = False
                break
        if not matched:
            continue
        variables, var_errors = {}, {}
        for var in spec.get("variables", []):
            # a variable may use the ones before it
            act["variables"] = celpy.celtypes.MapType(
                {celpy.celtypes.StringType(k): v for k, v in variables.items()}
            )
            value, err = evaluate(var["expression"], act)
            if err:
                var_errors[var["name"]] = err
            else:
                variables[var["name"]] = value
        act["variables"] = celpy.celtypes.MapType(
            {celpy.celtypes.StringType(k): v for k, v in variables.items()}
        )
        for v in spec["validations"]:
            used = set(re.findall(r"variables\.(\w+)", v["expression"])) & set(var_errors)
            value, err = (None, var_errors[next(iter(used))]) if used else evaluate(v["expression"], act)
            if err:
                if refuse_on_error:
                    return f"{where}: error: {err}"
                continue
            if value is not True and value != celpy.celtypes.BoolType(True):
                msg = v.get("message", "")
                if "messageExpression" in v:
                    m, merr = evaluate(v["messageExpression"], act)
                    msg = str(m) if not merr else msg
                return f"{where}: {' '.join(msg.split()) or v['expression']}"
    return None


# --- requests as the API server builds them -------------------------------------------------

KUBECTL_USER = {
    "username": "kubernetes-admin",
    "groups": ["kubeadm:cluster-admins", "system:authenticated"],
}
KUBELET_USER = {"username": "system:node:node-a", "groups": ["system:nodes", "system:authenticated"]}


def installer_user(node, claim=True):
    # a pod-bound service account token (Kubernetes >= 1.30): the pod's and its node's names
    # and uids in extra
    user = {
        "username": "system:serviceaccount:rsandbox-system:rsandbox-node-installer",
        "uid": "6c2f36f5-1d5e-4d3f-9a51-0a8f7f1b9c10",
        "groups": [
            "system:serviceaccounts",
            "system:serviceaccounts:rsandbox-system",
            "system:authenticated",
        ],
    }
    if claim:
        user["extra"] = {
            "authentication.kubernetes.io/credential-id": ["JTI=4a1f0c0e-8d53-4a0e-b1a6-2f4f7c3e9d21"],
            "authentication.kubernetes.io/node-name": [node],
            "authentication.kubernetes.io/node-uid": ["0b7b8f3e-5d7c-4f8e-a2c4-7a6f2d9c1e55"],
            "authentication.kubernetes.io/pod-name": ["rsandbox-node-installer-x7k2p"],
            "authentication.kubernetes.io/pod-uid": ["e3d1a9b4-2c6f-4b8a-9f0e-5c7d1b2a3f64"],
        }
    return user


def request(kind, resource, op, obj, old, user, namespace="", group="", version="v1"):
    name = (obj or old)["metadata"].get("name", "")
    r = {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": group, "version": version, "kind": kind},
        "resource": {"group": group, "version": version, "resource": resource},
        "requestKind": {"group": group, "version": version, "kind": kind},
        "requestResource": {"group": group, "version": version, "resource": resource},
        "name": name,
        "operation": op,
        "userInfo": user,
        "object": obj,
        "oldObject": old,
        "dryRun": False,
        "options": {
            "apiVersion": "meta.k8s.io/v1",
            "kind": "CreateOptions" if op == "CREATE" else "PatchOptions",
        },
    }
    if namespace:
        r["namespace"] = namespace
    return r


def stored_pod(name, namespace, spec, labels=None):
    """a pod as the API server stores it: defaults filled in, the service account's token
    volume added (ServiceAccount admission), fields left at their zero value absent"""
    spec = copy.deepcopy(spec)
    for c in spec["containers"]:
        c.setdefault("imagePullPolicy", "IfNotPresent")
        c.setdefault("resources", {})
        c.setdefault("terminationMessagePath", "/dev/termination-log")
        c.setdefault("terminationMessagePolicy", "File")
        c.setdefault("volumeMounts", []).append(
            {"mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "name": "kube-api-access-4m7qz", "readOnly": True}
        )
    spec.setdefault("dnsPolicy", "ClusterFirstWithHostNet" if spec.get("hostNetwork") else "ClusterFirst")
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    spec.setdefault("priority", 0)
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    spec.setdefault("serviceAccount", spec.get("serviceAccountName", "default"))
    spec.setdefault("serviceAccountName", "default")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("tolerations", []).extend(
        [
            {"effect": "NoExecute", "key": "node.kubernetes.io/not-ready", "operator": "Exists", "tolerationSeconds": 300},
            {"effect": "NoExecute", "key": "node.kubernetes.io/unreachable", "operator": "Exists", "tolerationSeconds": 300},
        ]
    )
    spec.setdefault("volumes", []).append(
        {
            "name": "kube-api-access-4m7qz",
            "projected": {
                "defaultMode": 420,
                "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"items": [{"key": "ca.crt", "path": "ca.crt"}], "name": "kube-root-ca.crt"}},
                ],
            },
        }
    )
    meta = {
        "name": name,
        "namespace": namespace,
        "uid": "9d3c5c8e-3c59-4d0c-8f4e-2b6c0b7a1d11",
        "creationTimestamp": "2026-12-05T12:00:00Z",
        "managedFields": [
            {
                "apiVersion": "v1",
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:spec": {"f:containers": {}}},
                "manager": "kubectl-create",
                "operation": "Update",
                "time": "2026-12-05T12:00:00Z",
            }
        ],
    }
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": {"phase": "Pending", "qosClass": "BestEffort"}}


def pod_create(name, namespace="default", user=KUBECTL_USER, **spec):
    spec.setdefault("containers", [{"name": "c", "image": "registry.k8s.io/pause:3.10"}])
    return request("Pod", "pods", "CREATE", stored_pod(name, namespace, spec), None, user, namespace)


def runtimeclass_create(name, handler, extra=None):
    rc = {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": name, "uid": "1f0a6b8c-9d2e-4f3a-8b7c-6d5e4f3a2b1c", "creationTimestamp": "2026-12-05T12:00:00Z"},
        "handler": handler,
    }
    rc.update(extra or {})
    return request("RuntimeClass", "runtimeclasses", "CREATE", rc, None, KUBECTL_USER, group="node.k8s.io")


def stored_node(name, bare=False):
    """a Node as a kubeadm node's kubelet keeps it (bare: a Node with no labels, annotations
    or taints at all, which the API server sends without those fields)"""
    meta = {
        "name": name,
        "uid": "0b7b8f3e-5d7c-4f8e-a2c4-7a6f2d9c1e55",
        "resourceVersion": "48211",
        "creationTimestamp": "2026-12-05T11:00:00Z",
        "managedFields": [
            {
                "apiVersion": "v1",
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:labels": {"f:kubernetes.io/hostname": {}}}},
                "manager": "kubelet",
                "operation": "Update",
                "time": "2026-12-05T11:00:00Z",
            }
        ],
    }
    spec = {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"]}
    if not bare:
        meta["labels"] = {
            "beta.kubernetes.io/arch": "amd64",
            "beta.kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
        }
        meta["annotations"] = {
            "kubeadm.alpha.kubernetes.io/cri-socket": "unix:///run/containerd/containerd.sock",
            "node.alpha.kubernetes.io/ttl": "0",
            "volumes.kubernetes.io/controller-managed-attach-detach": "true",
        }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": meta,
        "spec": spec,
        "status": {
            "addresses": [{"address": "10.0.0.11", "type": "InternalIP"}, {"address": name, "type": "Hostname"}],
            "allocatable": {"cpu": "2", "memory": "3925020Ki", "pods": "110"},
            "capacity": {"cpu": "2", "memory": "4027420Ki", "pods": "110"},
            "conditions": [
                {
                    "lastHeartbeatTime": "2026-12-05T11:59:00Z",
                    "lastTransitionTime": "2026-12-05T11:00:30Z",
                    "message": "kubelet is posting ready status",
                    "reason": "KubeletReady",
                    "status": "True",
                    "type": "Ready",
                }
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"containerRuntimeVersion": "containerd://2.1.9", "kubeletVersion": "v1.36.2", "operatingSystem": "linux", "architecture": "amd64"},
            "runtimeHandlers": [
                {"name": "", "features": {"recursiveReadOnlyMounts": True, "userNamespaces": True}},
                {"name": "rsandbox", "features": {"recursiveReadOnlyMounts": False, "userNamespaces": False}},
                {"name": "runc", "features": {"recursiveReadOnlyMounts": True, "userNamespaces": True}},
            ],
        },
    }


def merge_patch(target, patch):
    """RFC 7386, as the API server applies application/merge-patch+json"""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    # the API server's JSON has no empty labels or annotations map
    return out


def node_patch(node, patch, user, bare=False):
    old = stored_node(node, bare)
    new = merge_patch(old, patch)
    for k in ("labels", "annotations"):
        if k in new["metadata"] and not new["metadata"][k]:
            del new["metadata"][k]
    # the patch's field manager: curl's User-Agent up to the slash
    new["metadata"]["managedFields"] = old["metadata"]["managedFields"] + [
        {
            "apiVersion": "v1",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:labels": {f"f:{k}": {} for k in patch.get("metadata", {}).get("labels", {})}}},
            "manager": "curl",
            "operation": "Update",
            "time": "2026-12-05T12:00:00Z",
        }
    ]
    return request("Node", "nodes", "UPDATE", new, old, user)


def expect(name, req, refused_by=None, because=""):
    """refused_by: the policy that must refuse; because: words its message must hold (a
    refusal by an expression's error is never the one meant)"""
    got = admit(req)
    if refused_by is None:
        check(f"{name}: admitted", got is None, f"refused: {got}")
    else:
        check(
            f"{name}: refused by {refused_by} ({because})",
            got is not None and got.startswith(refused_by + ":") and because in got and ": error:" not in got,
            f"got: {got}",
        )


# --- structure ------------------------------------------------------------------------------

for name, p in policies.items():
    check(f"policy {name} has no paramKind (Kubernetes issue 133827)", "paramKind" not in p["spec"])
    check(f"policy {name} has a binding", any(b["spec"]["policyName"] == name for b in bindings))
for b in bindings:
    check(f"binding {b['metadata']['name']} has no paramRef", "paramRef" not in b["spec"])
    check(f"binding {b['metadata']['name']} names a policy of these manifests", b["spec"]["policyName"] in policies)


def node_writers(objs):
    """(ClusterRole, verbs) of each rule that may change Nodes"""
    out = []
    for o in objs:
        if o["kind"] in ("ClusterRole", "Role"):
            for r in o.get("rules", []):
                if set(r.get("apiGroups", [])) & {"", "*"} and set(r.get("resources", [])) & {"nodes", "*"}:
                    verbs = set(r.get("verbs", [])) - {"get", "list", "watch"}
                    if verbs:
                        out.append((o["metadata"]["name"], sorted(verbs)))
    return out


# `kubectl apply -k deploy/kubernetes` on Kubernetes < 1.30 creates everything but the
# policies: it must not grant a change of Nodes then
check("deploy/kubernetes grants no change of Nodes", node_writers(install) == [], str(node_writers(install)))
check(
    "deploy/kubernetes/node-labels grants only patch on Nodes",
    node_writers(node_labels) == [("rsandbox-node-installer-label", ["patch"])],
    str(node_writers(node_labels)),
)


def grants(objs):
    """every (namespace or "cluster", apiGroup, resource, verb) a Role or ClusterRole grants"""
    out = set()
    for o in objs:
        if o["kind"] in ("ClusterRole", "Role"):
            where = o["metadata"].get("namespace", "cluster") if o["kind"] == "Role" else "cluster"
            for r in o.get("rules", []):
                for g in r.get("apiGroups", []):
                    for res in r.get("resources", []):
                        for v in r.get("verbs", []):
                            out.add((where, g, res, v))
    return out


# the installer's whole grant from deploy/kubernetes: read Nodes; its restart slots (Leases in
# its own namespace: read, create, take by update; no delete, no list); Events about its Node
# (core/v1, valid only in "default" for a cluster-scoped object: create only)
check(
    "deploy/kubernetes grants exactly: get nodes; get/create/update leases in rsandbox-system; create events in default",
    grants(install) == {
        ("cluster", "", "nodes", "get"),
        ("rsandbox-system", "coordination.k8s.io", "leases", "get"),
        ("rsandbox-system", "coordination.k8s.io", "leases", "create"),
        ("rsandbox-system", "coordination.k8s.io", "leases", "update"),
        ("default", "", "events", "create"),
    },
    str(sorted(grants(install))),
)
role_subjects = [s for o in install if o["kind"] in ("RoleBinding", "ClusterRoleBinding") for s in o["subjects"]]
check(
    "deploy/kubernetes binds its roles only to the installer's service account",
    role_subjects and all(s == {"kind": "ServiceAccount", "name": "rsandbox-node-installer", "namespace": "rsandbox-system"} for s in role_subjects),
    str(role_subjects),
)
ds_tpl = next(o for o in install if o["kind"] == "DaemonSet")["spec"]["template"]["spec"]
check(
    "the installer runs on opted-in nodes only (nodeSelector rsandbox.io/node-installer=true)",
    ds_tpl.get("nodeSelector", {}).get("rsandbox.io/node-installer") == "true",
    str(ds_tpl.get("nodeSelector")),
)
check(
    "the installer tolerates no taint by default (control planes only with deploy/kubernetes/control-plane)",
    not ds_tpl.get("tolerations"),
    str(ds_tpl.get("tolerations")),
)
subjects = [s for o in node_labels if o["kind"] == "ClusterRoleBinding" for s in o["subjects"]]
check(
    "deploy/kubernetes/node-labels binds only the installer's service account",
    subjects == [{"kind": "ServiceAccount", "name": "rsandbox-node-installer", "namespace": "rsandbox-system"}],
    str(subjects),
)
check(
    "deploy/kubernetes/node-labels holds only the grant (the policy it needs is in deploy/kubernetes)",
    sorted(o["kind"] for o in node_labels) == ["ClusterRole", "ClusterRoleBinding"],
)

# --- the installer pod's privileges -----------------------------------------------------------

import os.path
import posixpath

DOCS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "install.md")


def documented_privileges():
    """(host paths, capabilities) named in the first column of docs/install.md's table under
    the heading "The installer pod's privileges": `| `/etc/containerd` | ...` rows"""
    paths, caps, inside = set(), set(), False
    with open(DOCS) as f:
        for line in f:
            if line.startswith("#"):
                inside = "The installer pod's privileges" in line
                continue
            m = inside and re.match(r"^\| `([^`]+)` \|", line)
            if m:
                (paths if m.group(1).startswith("/") else caps).add(m.group(1))
    return paths, caps


doc_paths, doc_caps = documented_privileges()
containers = ds_tpl.get("containers", []) + ds_tpl.get("initContainers", [])
host_paths = {posixpath.normpath(v["hostPath"]["path"]) for v in ds_tpl.get("volumes", []) if "hostPath" in v}
for c in containers:
    sc = c.get("securityContext", {})
    check(f"container {c['name']}: not privileged", sc.get("privileged") is not True, str(sc))
    check(f"container {c['name']}: no privilege escalation", sc.get("allowPrivilegeEscalation") is False, str(sc))
    check(f"container {c['name']}: a read-only root file system", sc.get("readOnlyRootFilesystem") is True, str(sc))
    caps = sc.get("capabilities", {})
    check(f"container {c['name']}: drops every capability", caps.get("drop") == ["ALL"], str(caps))
    added = set(caps.get("add", []))
    check(
        f"container {c['name']}: each capability added back is in docs/install.md with its reason",
        added <= doc_caps,
        f"added {sorted(added)}, documented {sorted(doc_caps)}",
    )
    argv = " ".join(c.get("command", []) + c.get("args", []))
    check(f"container {c['name']}: no nsenter", "nsenter" not in argv, argv)
check("no host `/` mounted", "/" not in host_paths, str(sorted(host_paths)))
check(
    "every hostPath is in docs/install.md with its reason, and every one listed there is mounted",
    host_paths == doc_paths,
    f"mounted {sorted(host_paths)}, documented {sorted(doc_paths)}",
)
check("no hostNetwork, no hostIPC", not ds_tpl.get("hostNetwork") and not ds_tpl.get("hostIPC"), "")

# --- the hostNetwork guard ------------------------------------------------------------------

expect("a pod without runtimeClassName", pod_create("web"))
expect("a hostNetwork pod without runtimeClassName (kube-proxy's kind)", pod_create("kube-proxy-8xk2l", "kube-system", hostNetwork=True, priorityClassName="system-node-critical"))
expect("a hostNetwork pod of another class", pod_create("net", hostNetwork=True, runtimeClassName="kata"))
expect("an rsandbox pod on the pod network", pod_create("sbx", runtimeClassName="rsandbox"))
expect("a hostNetwork rsandbox pod", pod_create("sbx-host", hostNetwork=True, runtimeClassName="rsandbox"), "rsandbox-hostnetwork", "containerd 2.1 and 2.2 crash")
ds = next(o for o in install if o["kind"] == "DaemonSet")
ds_spec = copy.deepcopy(ds["spec"]["template"]["spec"])
ds_spec["nodeName"] = "node-a"
expect(
    "the installer's own pod (the DaemonSet's template)",
    request("Pod", "pods", "CREATE", stored_pod("rsandbox-node-installer-x7k2p", "rsandbox-system", ds_spec, ds["spec"]["template"]["metadata"]["labels"]), None,
            {"username": "system:serviceaccount:kube-system:daemon-set-controller", "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"]}, "rsandbox-system"),
)
rc = next(o for o in install if o["kind"] == "RuntimeClass")
expect("the manifests' RuntimeClass rsandbox", runtimeclass_create(rc["metadata"]["name"], rc["handler"], {k: rc[k] for k in ("overhead", "scheduling")}))
expect("a RuntimeClass of another name with handler rsandbox", runtimeclass_create("rsandbox-host", "rsandbox"), "rsandbox-runtimeclass-handler", "only the RuntimeClass rsandbox")
expect("a RuntimeClass of another handler", runtimeclass_create("kata", "kata"))

# --- the installer's token on Nodes ---------------------------------------------------------

INSTALLER = installer_user("node-a")
# what deploy/node/rsandbox-node.sh sends: node_labels on install, the nulls on uninstall
install_labels = {"metadata": {"labels": {"rsandbox.io/installed": "true", "rsandbox.io/shim-version": "0.2.0", "rsandbox.io/containerd-hostnetwork-crash": "true"}}}
uninstall_labels = {"metadata": {"labels": {"rsandbox.io/installed": None, "rsandbox.io/shim-version": None, "rsandbox.io/containerd-hostnetwork-crash": None}}}
expect("the installer's labels on its own Node", node_patch("node-a", install_labels, INSTALLER))
expect("the installer's labels on its own Node without labels or annotations", node_patch("node-a", install_labels, INSTALLER, bare=True))
expect("the uninstall's label removal on its own Node", node_patch("node-a", uninstall_labels, INSTALLER))
expect("the installer's labels on another Node", node_patch("node-b", install_labels, INSTALLER), "rsandbox-node-installer-own-node-labels", "may not change Node node-b")
expect("a token without the node claim", node_patch("node-a", install_labels, installer_user("node-a", claim=False)), "rsandbox-node-installer-own-node-labels", "no node claim")
owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "gone", "uid": "3c1e2d4f-0000-4000-8000-000000000001"}
for what, patch, because in [
    ("an ownerReference", {"metadata": {"ownerReferences": [owner]}}, "ownerReferences"),
    ("a finalizer", {"metadata": {"finalizers": ["example.com/hold"]}}, "finalizers"),
    ("an annotation", {"metadata": {"annotations": {"example.com/a": "b"}}}, "annotations"),
    ("an annotation removed", {"metadata": {"annotations": {"node.alpha.kubernetes.io/ttl": None}}}, "annotations"),
    ("a label outside rsandbox.io/", {"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}}, "labels under rsandbox.io/"),
    ("a label outside rsandbox.io/ changed", {"metadata": {"labels": {"kubernetes.io/hostname": "node-b"}}}, "labels under rsandbox.io/"),
    ("a label outside rsandbox.io/ removed", {"metadata": {"labels": {"kubernetes.io/os": None}}}, "labels under rsandbox.io/"),
    ("a label under a subdomain of rsandbox.io", {"metadata": {"labels": {"x.rsandbox.io/installed": "true"}}}, "labels under rsandbox.io/"),
    ("a taint", {"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}}, "spec"),
    ("unschedulable", {"spec": {"unschedulable": True}}, "spec"),
]:
    p = copy.deepcopy(patch)
    p.setdefault("metadata", {}).setdefault("labels", {}).setdefault("rsandbox.io/installed", "true")
    expect(f"the installer's labels with {what}", node_patch("node-a", p, INSTALLER), "rsandbox-node-installer-own-node-labels", because)
# the policy narrows the installer's account only
expect("the kubelet's own Node update", node_patch("node-a", {"metadata": {"labels": {"example.com/x": "y"}}}, KUBELET_USER))
expect("an admin adding an ownerReference", node_patch("node-a", {"metadata": {"ownerReferences": [owner]}}, KUBECTL_USER))

print(f"{'policy checks: ' + str(failures) + ' failed' if failures else 'policy checks: all passed'}")
sys.exit(1 if failures else 0)
