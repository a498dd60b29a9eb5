#!/usr/bin/python3
"""Checks the deployment files in deploy/ against each other and the daemon.

  check_manifests.py DEPLOY_DIR GPUEXECD

Kubernetes manifests (deploy/kubernetes/*.yaml): they parse; every object
has apiVersion, kind and metadata.name; workloads select their own pod
labels; every gpuexecd container asks for nvidia.com/gpu, passes only flags
that `gpuexecd --help` lists, probes grpc.health.v1 on a port it listens on
(or runs the gpuexec tool over its socket, directly or in `sh -c`), and has
its Prometheus annotations point at the port --metrics_listen opens;
Services select a workload and target a named port of it; the sidecar
example shares the daemon's socket directory with the application.

Identity: no daemon passes --allow_unauthenticated; one that listens beyond
loopback passes --tls_cert, --tls_key and --tenants; its TLS files (and its
tenants file, which holds token digests) come from Secret volumes, and every
such file from a volume mounted whole (a subPath mount never sees the
Secret change, so a certificate rotation would need a restart); a
NetworkPolicy selects its pods and admits its gRPC port only from labelled
pods and its metrics port only from selected ones, and is in the
kustomization with them. A sidecar's daemon listens on its Unix socket only,
with --tenants and --unix_socket_group; the application's uid is a tenant
and its groups hold the socket's group (the Dockerfile's gid); the uid the
probes run as is a tenant. Tenants files the manifests hold are valid
(`gpuexecd --check_tenants`; before the daemon has it, protoc parses them
as gpuexec.config.v1.TenantsConfig). Then
`kubectl kustomize` (when kubectl is installed) builds the kustomization
without a cluster.

The systemd unit: `systemd-analyze verify` (when installed), the flags of
its ExecStart (--tenants among them, and TLS beyond loopback), ExecReload
sending SIGHUP, its hardening (NoNewPrivileges, ProtectSystem=strict,
ProtectHome, PrivateTmp, RestrictAddressFamilies, MemoryMax), the
RuntimeDirectory of its socket, and a device policy that leaves
/dev/nvidia* open.
"""
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

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


DEFAULT_LISTEN = "127.0.0.1:50051"


def beyond_loopback(parsed):
    """Whether gpuexecd's TCP listener (--listen; "" is none) takes connections
    from other hosts."""
    listen = parsed.get("listen", DEFAULT_LISTEN)
    if not listen:
        return False
    host = listen.rsplit(":", 1)[0].strip("[]")
    return not (host.startswith("127.") or host in ("localhost", "::1"))


def check_identity(where, parsed):
    """A daemon others can reach knows who calls it, over TLS."""
    if "allow_unauthenticated" in parsed:
        problem(where, "passes --allow_unauthenticated")
    if bool(parsed.get("tls_cert")) != bool(parsed.get("tls_key")):
        problem(where, "passes one of --tls_cert and --tls_key without the other")
    if beyond_loopback(parsed):
        for flag in ("tls_cert", "tls_key", "tenants"):
            if not parsed.get(flag):
                problem(where, f"listens on {parsed.get('listen', DEFAULT_LISTEN)} "
                        f"without --{flag}")


REPO = None  # the checkout deploy/ is in (set by main)
GPUEXECD = None  # the daemon, and the flags its --help lists (set by main)
FLAGS = set()


def tenants_problems(text):
    """Why TEXT is not a tenants file (a list; empty when it is one). The
    daemon judges it where it has --check_tenants; else protoc parses it as a
    gpuexec.config.v1.TenantsConfig (nothing is checked without protoc or the
    .proto)."""
    if "check_tenants" in FLAGS:
        with tempfile.NamedTemporaryFile("w", suffix=".textproto") as f:
            f.write(text)
            f.flush()
            out = subprocess.run([GPUEXECD, f"--check_tenants={f.name}"],
                                 capture_output=True, text=True)
        return [] if out.returncode == 0 else [out.stderr.strip() or out.stdout.strip()]
    proto = os.path.join(REPO, "proto", "gpuexec", "config", "v1", "tenants.proto")
    protoc = shutil.which("protoc")
    if not protoc or not os.path.exists(proto):
        return []
    out = subprocess.run([protoc, f"--proto_path={os.path.join(REPO, 'proto')}",
                          "--encode=gpuexec.config.v1.TenantsConfig", proto],
                         input=text.encode(), capture_output=True)
    return [] if out.returncode == 0 else [out.stderr.decode().strip()]


def tenant_uids(text):
    """The uids a tenants file names."""
    text = re.sub(r"#.*", "", text)
    return {int(u) for u in re.findall(r"\buid\s*:\s*(\d+)", text)}


def dockerfile_group():
    """(name, gid) of the group the Dockerfile's runtime stage adds, or None."""
    path = os.path.join(REPO, "Dockerfile")
    if not os.path.exists(path):
        return None
    m = re.search(r"groupadd\b[^&\n]*--gid[ =](\d+)\s+([a-z_][a-z0-9_-]*)", open(path).read())
    return (m.group(2), int(m.group(1))) if m else None


def gpuexec_invocation(cmd):
    """The words of the gpuexec tool's command line in an exec probe: the
    command itself, or the gpuexec part of an `sh -c` pipeline."""
    if len(cmd) == 3 and os.path.basename(cmd[0]) in ("sh", "bash") and cmd[1] == "-c":
        lexer = shlex.shlex(cmd[2], posix=True, punctuation_chars=True)
        lexer.whitespace_split = True  # words split at blanks and at | ; &
        words = list(lexer)
        start = next((i for i, w in enumerate(words) if w.endswith("/gpuexec")), None)
        if start is None:
            return []
        end = next((i for i in range(start, len(words)) if words[i] in ("|", "||", "&&", ";")),
                   len(words))
        return words[start:end]
    return cmd if cmd and cmd[0].endswith("/gpuexec") else []


def file_source(where, c, spec, path):
    """Where the file PATH of container C comes from: (volume kind, object
    name, key), or None. A subPath mount is a problem."""
    mounts = [m for m in c.get("volumeMounts", [])
              if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")]
    if not mounts:
        problem(where, f"{path} is in no volume")
        return None
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    if "subPath" in mount or "subPathExpr" in mount:
        problem(where, f"{path}: volume {mount['name']} is mounted with subPath, "
                "which never sees the object change")
    volume = next((v for v in spec.get("volumes", []) if v["name"] == mount["name"]), None)
    if volume is None:
        problem(where, f"volume {mount['name']} is not in the pod's volumes")
        return None
    rel = mount.get("subPath") or os.path.relpath(path, mount["mountPath"])
    for kind, name_field in (("secret", "secretName"), ("configMap", "name")):
        if kind not in volume:
            continue
        items = volume[kind].get("items")
        if items:
            key = next((i["key"] for i in items if i["path"] == rel), None)
            if key is None:
                problem(where, f"{path}: volume {mount['name']} has no item {rel}")
        else:
            key = rel
            if "/" in rel:
                problem(where, f"{path}: volume {mount['name']} has no directory "
                        f"{os.path.dirname(rel)}")
        return kind, volume[kind].get(name_field), key
    return next(iter(k for k in volume if k != "name"), "?"), None, rel


def pod_uid(c, spec):
    return c.get("securityContext", {}).get("runAsUser",
                                            spec.get("securityContext", {}).get("runAsUser"))


def pod_groups(c, spec):
    psc, csc = spec.get("securityContext", {}), c.get("securityContext", {})
    groups = {csc.get("runAsGroup", psc.get("runAsGroup")), psc.get("fsGroup")}
    groups |= set(psc.get("supplementalGroups", []))
    return groups - {None}


def check_drain(where, c, pod, parsed):
    """A daemon with a TCP listener (a pool's) drains before it stops: its
    preStop hook runs `gpuexec drain --wait` on its Unix socket, with a
    deadline the pod's grace period covers."""
    if not parsed.get("listen", DEFAULT_LISTEN):
        return
    hook = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    tool = gpuexec_invocation(hook)
    if "drain" not in tool:
        problem(where, "no preStop hook that runs `gpuexec drain`")
        return
    target = next((a.split("=", 1)[1] for a in tool if a.startswith("--target=")), "")
    if target != f"unix:{parsed.get('unix_socket')}":
        problem(where, f"the preStop drain targets {target!r}, not --unix_socket")
    if "--wait" not in tool:
        problem(where, "the preStop drain does not --wait: the pod would stop at once")
    deadline = next((a.split("=", 1)[1] for a in tool if a.startswith("--deadline=")), "")
    if not re.fullmatch(r"[0-9]+s", deadline):
        problem(where, f"the preStop drain's --deadline {deadline!r} is not whole seconds")
        return
    grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
    if int(deadline[:-1]) + 10 > grace:
        problem(where, f"the preStop drain's --deadline={deadline} leaves less than 10 s of the "
                f"pod's terminationGracePeriodSeconds ({grace}) for the daemon to stop")


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
        elif "httpGet" in probe:
            http = probe["httpGet"]
            port = http.get("port")
            port = ports.get(port, port)
            metrics_port = port_of(parsed.get("metrics_listen", ""))
            if metrics_port is None or port != metrics_port:
                problem(where, f"{kind} probes HTTP port {http.get('port')}, "
                        f"not the metrics port gpuexecd serves /healthz and /readyz on")
            if parsed.get("metrics_listen", "").startswith("127."):
                problem(where, f"{kind}: the kubelet cannot reach a loopback metrics listener")
            want = "/readyz" if kind == "readinessProbe" else "/healthz"
            if http.get("path") != want:
                problem(where, f"{kind} asks for {http.get('path')!r}, not {want}")
        elif "exec" in probe:
            cmd = probe["exec"]["command"]
            tool = gpuexec_invocation(cmd)
            target = next((a.split("=", 1)[1] for a in tool if a.startswith("--target=")), "")
            sock = parsed.get("unix_socket")
            if not tool or target != f"unix:{sock}":
                problem(where, f"{kind} runs {cmd}, not the gpuexec tool on --unix_socket {sock}")
        else:
            problem(where, f"{kind} is neither a grpc nor an exec probe")
    if "startupProbe" not in c and "livenessProbe" not in c:
        problem(where, "no probes")
    check_drain(where, c, pod, parsed)
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
    check_identity(where, parsed)
    return parsed


def check_daemon_files(where, c, spec, parsed, configmaps):
    """The TLS and tenants files: from Secrets (a tenants file with no TCP
    listener, hence no tokens, may be a ConfigMap), mounted whole. Returns the
    tenants file's text when the manifests hold it."""
    for flag in ("tls_cert", "tls_key", "tls_client_ca"):
        if parsed.get(flag):
            source = file_source(where, c, spec, parsed[flag])
            if source and source[0] != "secret":
                problem(where, f"--{flag} comes from a {source[0]} volume, not a Secret")
    if not parsed.get("tenants"):
        return None
    source = file_source(where, c, spec, parsed["tenants"])
    if not source:
        return None
    kind, name, key = source
    tcp = bool(parsed.get("listen", DEFAULT_LISTEN))
    if kind not in ("secret", "configMap") or (kind == "configMap" and tcp):
        problem(where, f"--tenants comes from a {kind} volume; with a TCP listener "
                "(bearer tokens) it belongs in a Secret")
    if kind != "configMap":
        return None
    cm = configmaps.get(name)
    if cm is None:
        return None  # made elsewhere
    text = cm.get("data", {}).get(key)
    if text is None:
        problem(where, f"ConfigMap {name} has no key {key} for --tenants")
        return None
    for p in tenants_problems(text):
        problem(f"ConfigMap {name} {key}", f"not a TenantsConfig: {p}")
    if "token_sha256" in re.sub(r"#.*", "", text):
        problem(f"ConfigMap {name} {key}", "holds token digests: they belong in a Secret")
    return text


def selects(selector, labels):
    """Whether a NetworkPolicy's podSelector selects pods labelled LABELS (only
    matchLabels; matchExpressions count as not selecting)."""
    match = selector.get("matchLabels", {})
    return (bool(match) and not selector.get("matchExpressions")
            and all(labels.get(k) == v for k, v in match.items()))


def covers(rule, port, names):
    """Whether an ingress rule admits traffic to PORT, whose containerPort
    names are NAMES (a rule without ports: all of them)."""
    ports = rule.get("ports")
    return not ports or any(p.get("port") in (port, None) or p.get("port") in names
                            for p in ports)


def check_network_policies(kdir, objects, exposed):
    """Each daemon others can reach has a NetworkPolicy: gRPC only from
    labelled pods, metrics only from selected ones, and in the kustomization
    with the daemon's workload."""
    resources = None
    kust = os.path.join(kdir, "kustomization.yaml")
    if os.path.exists(kust):
        resources = yaml.safe_load(open(kust)).get("resources", [])
    policies = [(name, d) for name, d in objects if d.get("kind") == "NetworkPolicy"]
    for file, where, labels, grpc, metrics, port_names in exposed:
        mine = [(name, d) for name, d in policies
                if selects(d["spec"].get("podSelector", {}), labels)
                and "Ingress" in d["spec"].get("policyTypes", ["Ingress"])]
        if not mine:
            problem(where, f"listens on {grpc} and no NetworkPolicy selects its pods {labels}")
            continue
        for name, d in mine:
            pwhere = f"{name} NetworkPolicy/{d['metadata']['name']}"
            if resources is not None and file in resources and name not in resources:
                problem("kustomization.yaml", f"has {file} but not {name}, its NetworkPolicy")
            rules = d["spec"].get("ingress", [])
            for port, what in ((grpc, "gRPC"), (metrics, "metrics")):
                if port is None:
                    continue
                admitting = [r for r in rules if covers(r, port, port_names.get(port, set()))]
                if not admitting:
                    problem(pwhere, f"admits nothing to the {what} port {port}")
                for r in admitting:
                    peers = r.get("from")
                    if not peers:
                        problem(pwhere, f"admits every source to the {what} port {port}")
                        continue
                    for peer in peers:
                        pods = peer.get("podSelector", {})
                        namespaces = peer.get("namespaceSelector", {})
                        if "ipBlock" in peer:
                            problem(pwhere, f"admits an ipBlock to the {what} port {port}")
                        elif what == "gRPC" and not pods.get("matchLabels"):
                            problem(pwhere, f"admits unlabelled pods to the gRPC port {port}: "
                                    f"{peer}")
                        elif not pods.get("matchLabels") and not namespaces.get("matchLabels"):
                            problem(pwhere, f"admits any pod to the {what} port {port}: {peer}")


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

    configmaps = {d["metadata"]["name"]: d for _, d in objects
                  if d.get("kind") == "ConfigMap" and d.get("metadata", {}).get("name")}
    workloads = {}
    exposed = []  # (file, where, pod labels, grpc port, metrics port, port names) beyond loopback
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
            cwhere = f"{where} container {c['name']}"
            parsed = check_gpuexecd(cwhere, c, pod, flags)
            tenants = check_daemon_files(cwhere, c, spec, parsed, configmaps)
            if beyond_loopback(parsed):
                port_names = {}
                for cp in c.get("ports", []):
                    port_names.setdefault(cp["containerPort"], set()).add(cp.get("name"))
                exposed.append((name, cwhere, labels, port_of(parsed["listen"]),
                                port_of(parsed.get("metrics_listen", "")), port_names))
            if c in spec.get("initContainers", []) and c.get("restartPolicy") != "Always":
                problem(where, f"init container {c['name']} is not a sidecar (restartPolicy: Always)")
            sock = parsed.get("unix_socket")
            apps = [a for a in spec.get("containers", []) if a is not c]
            # Probes over the socket run as the daemon's own uid: a tenant.
            probes_on_socket = any(
                f"--target=unix:{sock}" in gpuexec_invocation(c[k]["exec"]["command"])
                for k in ("startupProbe", "readinessProbe", "livenessProbe")
                if sock and "exec" in c.get(k, {}))
            uid = pod_uid(c, spec)
            if probes_on_socket and tenants is not None and uid not in tenant_uids(tenants):
                problem(cwhere, f"its probes run as uid {uid}, which no tenant names")
            if c in spec.get("initContainers", []) or apps:
                # A sidecar: the application reaches it over the socket only.
                if parsed.get("listen", DEFAULT_LISTEN) != "":
                    problem(cwhere, "a sidecar listens on TCP (--listen= should be empty)")
                for flag in ("unix_socket", "tenants", "unix_socket_group"):
                    if not parsed.get(flag):
                        problem(cwhere, f"a sidecar without --{flag}")
                group = dockerfile_group()
                for app in apps:
                    uid = pod_uid(app, spec)
                    if tenants is not None and uid not in tenant_uids(tenants):
                        problem(where, f"container {app['name']} runs as uid {uid}, "
                                "which no tenant names")
                    if group and parsed.get("unix_socket_group") == group[0]:
                        if group[1] not in pod_groups(app, spec):
                            problem(where, f"container {app['name']} is not in group {group[0]} "
                                    f"({group[1]}), the socket's group")
                    elif group and parsed.get("unix_socket_group"):
                        problem(cwhere, f"--unix_socket_group={parsed['unix_socket_group']}: the "
                                f"image has group {group[0]}")
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

    check_network_policies(kdir, objects, exposed)

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


def unit_settings(text):
    """KEY -> [values] of a unit file's [Service] section, in order."""
    settings, section = {}, None
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line:
            key, value = line.split("=", 1)
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


TRUE = ("yes", "true", "on", "1")


def check_systemd(unit, flags):
    text = open(unit).read()
    where = os.path.basename(unit)
    exec_start = re.search(r"^ExecStart=(.*)$", text, re.M)
    if not exec_start:
        problem(unit, "no ExecStart")
        return
    parsed = parse_args(exec_start.group(1).split()[1:])
    for name in parsed:
        if name not in flags:
            problem(where, f"--{name} is not a gpuexecd flag")
    if not re.search(r"^User=(?!root)\S+", text, re.M):
        problem(where, "runs as root")
    check_identity(where, parsed)
    if not parsed.get("tenants"):
        problem(where, "ExecStart passes no --tenants")

    settings = unit_settings(text)
    last = {k: v[-1] for k, v in settings.items()}
    reload = last.get("ExecReload", "")
    if not re.search(r"\bkill\b.*(-HUP|-s\s*HUP|-SIGHUP|-s\s*SIGHUP)\b.*\$MAINPID", reload):
        problem(where, f"ExecReload={reload!r} does not send SIGHUP to $MAINPID "
                "(which rereads the tenants)")
    for key, want in (("NoNewPrivileges", TRUE), ("ProtectSystem", ("strict",)),
                      ("ProtectHome", TRUE), ("PrivateTmp", TRUE)):
        if last.get(key, "").lower() not in want:
            problem(where, f"{key}={last.get(key, '')!r}, not {want[0]}")
    families = " ".join(settings.get("RestrictAddressFamilies", [])).split()
    if not families or families[0].startswith("~"):
        problem(where, "RestrictAddressFamilies= does not list the allowed families")
    elif not {"AF_UNIX", "AF_INET", "AF_INET6"} <= set(families):
        problem(where, f"RestrictAddressFamilies={' '.join(families)} lacks one of "
                "AF_UNIX AF_INET AF_INET6")
    if last.get("MemoryMax", "infinity") in ("", "infinity"):
        problem(where, "no MemoryMax")
    sock = parsed.get("unix_socket")
    if sock and (not sock.startswith("/run/")
                 or os.path.dirname(sock)[len("/run/"):] not in
                 " ".join(settings.get("RuntimeDirectory", [])).split()):
        problem(where, f"--unix_socket={sock}: its directory is not a RuntimeDirectory=")
    # The workers open /dev/nvidia*: no private /dev, and no device policy
    # that leaves them out (ProtectClock= implies a DeviceAllow=).
    if last.get("PrivateDevices", "").lower() in TRUE:
        problem(where, "PrivateDevices= hides /dev/nvidia*")
    restricted = (last.get("DevicePolicy", "auto") in ("closed", "strict")
                  or "DeviceAllow" in settings or last.get("ProtectClock", "").lower() in TRUE)
    if restricted and not any("nvidia" in v for v in settings.get("DeviceAllow", [])):
        problem(where, "the device policy is closed and allows no /dev/nvidia*")
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
    global REPO, GPUEXECD, FLAGS
    deploy, gpuexecd = sys.argv[1], sys.argv[2]
    REPO = os.path.dirname(os.path.abspath(deploy))
    flags = daemon_flags(gpuexecd)
    GPUEXECD, FLAGS = gpuexecd, flags
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
