#!/usr/bin/env python3
"""Checks the pods of a chart render as a platform team's admission policies would.

Usage: pod-checks.py RENDER.yaml [--command DEPLOYMENT/CONTAINER]

For every pod template (Deployment, Job) in RENDER (a `helm template` output):
  - Pod Security Standards, `restricted` profile (what a namespace labelled
    `pod-security.kubernetes.io/enforce: restricted` admits): non-root, RuntimeDefault or
    Localhost seccomp, no privilege escalation, every capability dropped (at most
    NET_BIND_SERVICE added), no host namespaces, ports or hostPath volumes, not privileged;
  - the chart's own hardening (docs/install.md): a read-only root filesystem;
  - every container has CPU and memory requests and a memory limit, an image with a tag other
    than `latest`, and an explicit pull policy;
  - a Deployment's containers have readiness and liveness probes;
  - a Deployment of more than one replica spreads them across nodes or zones (a topology spread
    constraint on `kubernetes.io/hostname` or `topology.kubernetes.io/zone`, or a pod
    anti-affinity on one of them) selecting its own pods.

With --command, then prints (NUL-separated) that Deployment container's environment as
NAME=VALUE (a placeholder for values from fields or Secrets), `--`, and the command line it runs:
the image's ENTRYPOINT (from the Dockerfile) and the rendered `args`, for the caller to exec with
a local binary. Exits 1 naming every problem found.
"""
import argparse
import importlib.util
import pathlib
import sys

import yaml

HERE = pathlib.Path(__file__).resolve().parent
POD_KINDS = {"Deployment", "Job"}
SPREAD_KEYS = {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}


def entrypoint():
    """The Dockerfile's ENTRYPOINT, read as tests/helm/uninstall-hook.py reads it."""
    spec = importlib.util.spec_from_file_location("uninstall_hook", HERE / "uninstall-hook.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.entrypoint()


def matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def check_pod(where, kind, spec, problems):
    pod = spec["template"]["spec"]
    labels = spec["template"].get("metadata", {}).get("labels", {})
    psc = pod.get("securityContext") or {}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            problems.append(f"{where}: {key} (restricted forbids host namespaces)")
    for v in pod.get("volumes", []):
        if "hostPath" in v:
            problems.append(f"{where}: volume {v['name']} is a hostPath")
    containers = pod.get("initContainers", []) + pod.get("containers", [])
    for c in containers:
        at = f"{where} container {c['name']}"
        sc = c.get("securityContext") or {}
        if not (sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True):
            problems.append(f"{at}: runAsNonRoot is not true (pod or container)")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            problems.append(f"{at}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{at}: seccompProfile.type is {seccomp!r}, not RuntimeDefault or Localhost")
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{at}: allowPrivilegeEscalation is not false")
        if sc.get("privileged"):
            problems.append(f"{at}: privileged")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            problems.append(f"{at}: capabilities.drop does not list ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            problems.append(f"{at}: adds capabilities {caps['add']}")
        if sc.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{at}: readOnlyRootFilesystem is not true")
        for p in c.get("ports", []):
            if p.get("hostPort"):
                problems.append(f"{at}: hostPort {p['hostPort']}")
        image = c.get("image", "")
        tag = image.rsplit("/", 1)[-1].partition(":")[2].split("@")[0]
        if "@sha256:" not in image and tag in ("", "latest"):
            problems.append(f"{at}: image {image!r} has no tag or `latest`")
        if not c.get("imagePullPolicy"):
            problems.append(f"{at}: no imagePullPolicy")
        res = c.get("resources") or {}
        for r in ("cpu", "memory"):
            if r not in (res.get("requests") or {}):
                problems.append(f"{at}: no {r} request")
        if "memory" not in (res.get("limits") or {}):
            problems.append(f"{at}: no memory limit")
        if kind == "Deployment":
            for probe in ("readinessProbe", "livenessProbe"):
                if probe not in c:
                    problems.append(f"{at}: no {probe}")
    if kind == "Deployment" and int(spec.get("replicas", 1)) > 1:
        spread = [t for t in pod.get("topologySpreadConstraints", [])
                  if t.get("topologyKey") in SPREAD_KEYS and matches(t.get("labelSelector"), labels)]
        anti = (pod.get("affinity") or {}).get("podAntiAffinity") or {}
        terms = anti.get("requiredDuringSchedulingIgnoredDuringExecution", []) + [
            t.get("podAffinityTerm", {}) for t in anti.get("preferredDuringSchedulingIgnoredDuringExecution", [])]
        anti = [t for t in terms if t.get("topologyKey") in SPREAD_KEYS
                and matches(t.get("labelSelector"), labels)]
        if not spread and not anti:
            problems.append(f"{where}: {spec['replicas']} replicas and nothing spreads them across nodes "
                            "(topologySpreadConstraints or podAntiAffinity on kubernetes.io/hostname or a zone, selecting its pods)")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("render")
    ap.add_argument("--command", help="DEPLOYMENT/CONTAINER whose command line to print")
    args = ap.parse_args()
    objs = [o for o in yaml.safe_load_all(pathlib.Path(args.render).read_text()) if o]
    problems = []
    pods = 0
    for o in objs:
        if o.get("kind") in POD_KINDS:
            pods += 1
            where = f"{o['kind']} {o['metadata'].get('namespace', '')}/{o['metadata']['name']}"
            check_pod(where, o["kind"], o["spec"], problems)
    if pods == 0:
        problems.append("no Deployment or Job in the render")
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    if args.command:
        name, _, container = args.command.partition("/")
        found = [c for o in objs if o.get("kind") == "Deployment" and o["metadata"]["name"] == name
                 for c in o["spec"]["template"]["spec"]["containers"] if c["name"] == container]
        if len(found) != 1:
            print(f"no Deployment {name} with a container {container}", file=sys.stderr)
            return 1
        (c,) = found
        if "command" in c:
            print(f"{args.command} overrides the image's ENTRYPOINT with command: {c['command']}", file=sys.stderr)
            return 1
        words = [f"{e['name']}={e.get('value', 'placeholder-from-' + e['name'])}" for e in c.get("env", [])]
        words += ["--"] + entrypoint() + [str(a) for a in c.get("args", [])]
        sys.stdout.write("\0".join(words))
    else:
        print(f"ok: {pods} pod templates")
    return 0


if __name__ == "__main__":
    sys.exit(main())
