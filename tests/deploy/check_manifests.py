#!/usr/bin/python3
"""Checks the deployment files in deploy/ against each other and the daemon.

  check_manifests.py DEPLOY_DIR GPUEXECD

Kubernetes manifests (deploy/kubernetes/*.yaml): they parse; every object
has apiVersion, kind and metadata.name; workloads select their own pod
labels; every gpuexecd container asks for nvidia.com/gpu, passes only flags
that `gpuexecd --help` lists, probes grpc.health.v1 on a port it listens on
(or runs the gpuexec tool over its socket), and has its Prometheus
annotations point at the port --metrics_listen opens; Services select a
workload and target a named port of it; the sidecar example shares the
daemon's socket directory with the application. Then `kubectl kustomize`
(when kubectl is installed) builds the kustomization without a cluster.

The systemd unit: `systemd-analyze verify` (when installed) and the flags
of its ExecStart.
"""
import glob
import os
import re
import shutil
import subprocess
import sys

import yaml

problems = []


def problem(where, what):
    problems.append(f"{where}: {what}")


def daemon_flags(gpuexecd):
    """The flag names `gpuexecd --help` lists (gpuexecd_flags.sh), without --."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpuexecd_flags.sh")
    out = subprocess.run(["bash", script, gpuexecd], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(out.stderr.strip())
    return {f[2:] for f in out.stdout.split()}


def parse_args(args):
    """--flag=value arguments of gpuexecd as a dict."""
    parsed = {}
    for a in args:
        m = re.match(r"^--([a-z_]+)(?:=(.*))?$", a)
        if m:
            parsed[m.group(1)] = m.group(2) or ""
    return parsed


def port_of(address):
    return int(address.rsplit(":", 1)[1]) if address and ":" in address else None


def check_gpuexecd(where, c, pod, flags):
    args = c.get("args", []) + c.get("command", [])[1:]
    parsed = parse_args(args)
    for name in parsed:
        if name not in flags:
            problem(where, f"--{name} is not a gpuexecd flag")
    limits = c.get("resources", {}).get("limits", {})
    if "nvidia.com/gpu" not in limits:
        problem(where, "no nvidia.com/gpu limit")
    ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
    grpc_port = port_of(parsed.get("listen", "127.0.0.1:50051"))
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = c.get(kind)
        if probe is None:
            continue
        if "grpc" in probe:
            if probe["grpc"].get("port") != grpc_port:
                problem(where, f"{kind} probes port {probe['grpc'].get('port')}, "
                        f"gpuexecd listens on {grpc_port}")
            if parsed.get("listen", "").startswith("127."):
                problem(where, f"{kind}: the kubelet cannot reach a loopback listener")
            if probe["grpc"].get("service", "") not in ("", "gpuexec.v1.GpuExec", "liveness"):
                problem(where, f"{kind} asks for health service {probe['grpc']['service']!r}")
        elif "exec" in probe:
            cmd = probe["exec"]["command"]
            target = next((a.split("=", 1)[1] for a in cmd if a.startswith("--target=")), "")
            sock = parsed.get("unix_socket")
            if not cmd[0].endswith("/gpuexec") or target != f"unix:{sock}":
                problem(where, f"{kind} runs {cmd}, not the gpuexec tool on --unix_socket {sock}")
        else:
            problem(where, f"{kind} is neither a grpc nor an exec probe")
    if "startupProbe" not in c and "livenessProbe" not in c:
        problem(where, "no probes")
    if "listen" in parsed and parsed["listen"] and grpc_port not in ports.values():
        problem(where, f"--listen port {grpc_port} is not a containerPort")
    metrics = port_of(parsed.get("metrics_listen", ""))
    annotations = pod.get("metadata", {}).get("annotations", {})
    if metrics is not None:
        if metrics not in ports.values():
            problem(where, f"metrics port {metrics} is not a containerPort")
        if annotations.get("prometheus.io/scrape") != "true":
            problem(where, "metrics on, but no prometheus.io/scrape annotation")
        if annotations.get("prometheus.io/port") != str(metrics):
            problem(where, f"prometheus.io/port is {annotations.get('prometheus.io/port')}, "
                    f"metrics listen on {metrics}")
        if annotations.get("prometheus.io/path", "/metrics") != "/metrics":
            problem(where, "prometheus.io/path is not /metrics")
    sc = {**pod["spec"].get("securityContext", {}), **c.get("securityContext", {})}
    if not sc.get("runAsNonRoot"):
        problem(where, "not runAsNonRoot")
    return parsed


def check_kubernetes(kdir, flags):
    objects = []
    for path in sorted(glob.glob(os.path.join(kdir, "*.yaml"))):
        name = os.path.basename(path)
        with open(path) as f:
            try:
                docs = [d for d in yaml.safe_load_all(f) if d is not None]
            except yaml.YAMLError as e:
                problem(name, f"does not parse: {e}")
                continue
        for d in docs:
            for field in ("apiVersion", "kind"):
                if field not in d:
                    problem(name, f"an object without {field}")
            if d.get("kind") != "Kustomization" and not d.get("metadata", {}).get("name"):
                problem(name, f"a {d.get('kind')} without metadata.name")
            objects.append((name, d))

    workloads = {}
    for name, d in objects:
        if d.get("kind") not in ("DaemonSet", "Deployment", "StatefulSet"):
            continue
        where = f"{name} {d['kind']}/{d['metadata']['name']}"
        pod = d["spec"]["template"]
        labels = pod.get("metadata", {}).get("labels", {})
        selector = d["spec"].get("selector", {}).get("matchLabels", {})
        if not selector or any(labels.get(k) != v for k, v in selector.items()):
            problem(where, "spec.selector does not match the pod template's labels")
        spec = pod["spec"]
        containers = spec.get("containers", []) + spec.get("initContainers", [])
        named_ports = {p.get("name") for c in containers for p in c.get("ports", [])}
        workloads[where] = (labels, named_ports)
        daemons = [c for c in containers if "gpuexec" in c.get("image", "")
                   and "gpuexecd" in c.get("name", "")]
        if not daemons:
            problem(where, "no gpuexecd container")
        for c in containers:
            if "name" not in c or "image" not in c:
                problem(where, "a container without name or image")
        for c in daemons:
            parsed = check_gpuexecd(f"{where} container {c['name']}", c, pod, flags)
            if c in spec.get("initContainers", []) and c.get("restartPolicy") != "Always":
                problem(where, f"init container {c['name']} is not a sidecar (restartPolicy: Always)")
            sock = parsed.get("unix_socket")
            if sock:
                sock_dir = os.path.dirname(sock)
                mounts = {m["name"] for m in c.get("volumeMounts", []) if m["mountPath"] == sock_dir}
                if not mounts:
                    problem(where, f"the socket directory {sock_dir} is not a volume")
                for app in spec.get("containers", []):
                    if app is c:
                        continue
                    shared = {m["name"] for m in app.get("volumeMounts", [])
                              if m["mountPath"] == sock_dir} & mounts
                    env = {e["name"]: e.get("value") for e in app.get("env", [])}
                    if not shared:
                        problem(where, f"container {app['name']} does not mount {sock_dir}")
                    if env.get("GPUEXEC_TARGET") != f"unix:{sock}":
                        problem(where, f"container {app['name']} has GPUEXEC_TARGET "
                                f"{env.get('GPUEXEC_TARGET')!r}, not unix:{sock}")

    for name, d in objects:
        if d.get("kind") != "Service":
            continue
        where = f"{name} Service/{d['metadata']['name']}"
        selector = d["spec"].get("selector", {})
        matches = [w for w, (labels, _) in workloads.items()
                   if selector and all(labels.get(k) == v for k, v in selector.items())]
        if not matches:
            problem(where, f"selects no workload ({selector})")
        for p in d["spec"].get("ports", []):
            target = p.get("targetPort", p.get("port"))
            if isinstance(target, str) and not any(target in workloads[w][1] for w in matches):
                problem(where, f"targetPort {target!r} is no named port of {matches}")

    kubectl = shutil.which("kubectl")
    if kubectl and os.path.exists(os.path.join(kdir, "kustomization.yaml")):
        out = subprocess.run([kubectl, "kustomize", kdir], capture_output=True, text=True,
                             timeout=60)
        if out.returncode != 0:
            problem("kustomization.yaml", f"kubectl kustomize: {out.stderr.strip()}")
        else:
            built = [d for d in yaml.safe_load_all(out.stdout) if d]
            print(f"kubectl kustomize: {', '.join(d['kind'] for d in built)}")
    elif not kubectl:
        print("kubectl not installed: the kustomize build is not checked")
    return len(objects)


def check_systemd(unit, flags):
    text = open(unit).read()
    exec_start = re.search(r"^ExecStart=(.*)$", text, re.M)
    if not exec_start:
        problem(unit, "no ExecStart")
        return
    for name in parse_args(exec_start.group(1).split()[1:]):
        if name not in flags:
            problem(os.path.basename(unit), f"--{name} is not a gpuexecd flag")
    if not re.search(r"^User=(?!root)\S+", text, re.M):
        problem(os.path.basename(unit), "runs as root")
    analyze = shutil.which("systemd-analyze")
    if analyze:
        # The unit names a binary under /usr/local and a user that this build
        # machine lacks; verify the unit's syntax and directives only.
        out = subprocess.run([analyze, "verify", unit], capture_output=True, text=True)
        bad = [l for l in out.stderr.splitlines()
               if l.strip() and "Command" not in l and "not executable" not in l
               and "No such file" not in l and "Failed to " not in l
               and "user" not in l.lower() and "group" not in l.lower()]
        if bad:
            problem(os.path.basename(unit), "systemd-analyze verify: " + "; ".join(bad))
        else:
            print("systemd-analyze verify: no unit errors")
    else:
        print("systemd-analyze not installed: the unit's syntax is not checked")


def main():
    deploy, gpuexecd = sys.argv[1], sys.argv[2]
    flags = daemon_flags(gpuexecd)
    n = check_kubernetes(os.path.join(deploy, "kubernetes"), flags)
    check_systemd(os.path.join(deploy, "systemd", "gpuexecd.service"), flags)
    for p in problems:
        print("FAIL:", p, file=sys.stderr)
    if problems:
        return 1
    print(f"{n} Kubernetes objects and the systemd unit: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
