#!/usr/bin/python3
"""Checks deploy/monitoring against the daemon it watches.

  check_monitoring.py MONITORING_DIR KUBERNETES_DIR GPUEXECD FAKE_DRIVER GPUEXEC_CLI
                      KERNELS_DIR CACHE_DIR

The dashboard (dashboard.json): it parses; its datasource is the template
variable ${datasource} (a datasource variable of type prometheus) on every
panel and target; it has the variables node and instance, and every metric
selector filters on both; panel ids are unique, every panel but a row has
targets with an expr, and the figures an operator watches each have one.

The alerts (rules.yaml): a PrometheusRule whose rules each have a severity
label and summary, description and runbook annotations, the alerts
operators need among them; `promtool check rules` passes on its spec.groups.
promtool comes from Debian's prometheus package, downloaded (never
installed: it would start a server) into CACHE_DIR and unpacked there.

The Kubernetes objects: the metrics Service selects the DaemonSet's pods and
targets its metrics container port, the one --metrics_listen opens; the
ServiceMonitor selects that Service and its port; the NetworkPolicy admits
the port; the up{job=...} alert names the job the ServiceMonitor makes; the
kustomization lists every manifest here.

The metric names: every name in the dashboard's and the rules' expressions
(a small PromQL tokenizer, itself checked first on a few expressions) is a
family the daemon exports, as its `# TYPE` lines say, scraped from a
gpuexecd on the driver double after a session ran a kernel (so that the
series made on first use are there), and from a second one serving TLS for
the names in TLS_ONLY. Label names in selectors must be labels of the
family's series, and those in by (...) labels the daemon exports at all,
besides the ones Prometheus adds (TARGET_LABELS).
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

import yaml

from promql import PromQLError, parse, self_test  # beside this script

problems = []


def problem(where, what):
    problems.append(f"{where}: {what}")


# --- the dashboard ---------------------------------------------------------

DATASOURCE = "${datasource}"
# A metric for each figure an operator watches (issue 40).
DASHBOARD_FIGURES = {
    "gpuexec_device_healthy", "gpuexec_device_answering", "gpuexec_device_resets_total",
    "gpuexec_tenant_memory_held_bytes", "gpuexec_device_memory_used_bytes",
    "gpuexec_device_memory_total_bytes", "gpuexec_tenant_gpu_seconds_total",
    "gpuexec_kernel_launches_total", "gpuexec_strike_refusals_total",
    "gpuexec_auth_refused_total", "grpc_server_handled_total", "gpuexec_sessions",
    "gpuexec_tenant_sessions", "gpuexec_read_bytes_total", "gpuexec_write_bytes_total",
    "grpc_server_handling_seconds_bucket", "process_cpu_seconds_total",
    "process_resident_memory_bytes", "process_open_fds", "gpuexec_build_info",
    "gpuexec_draining",
}


def all_panels(panels):
    for p in panels:
        yield p
        yield from all_panels(p.get("panels", []))


def templated(ds):
    return isinstance(ds, dict) and ds.get("uid") == DATASOURCE or ds == DATASOURCE


def check_dashboard(path):
    """The dashboard's expressions, as (where, expr)."""
    where = os.path.basename(path)
    try:
        dash = json.load(open(path))
    except (OSError, ValueError) as e:
        problem(where, f"does not parse: {e}")
        return []
    if dash.get("id") is not None:
        problem(where, "has an id: Grafana's import wants none (null)")
    for key in ("uid", "title", "panels", "templating", "schemaVersion"):
        if not dash.get(key):
            problem(where, f"has no {key}")
    variables = {v.get("name"): v for v in dash.get("templating", {}).get("list", [])}
    ds = variables.get("datasource")
    if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        problem(where, "has no variable datasource of type datasource, query prometheus")
    exprs = []
    for name in ("node", "instance"):
        v = variables.get(name)
        if not v:
            problem(where, f"has no variable {name}")
            continue
        if not templated(v.get("datasource")):
            problem(where, f"variable {name} does not query ${{datasource}}")
        query = v.get("query")
        query = query.get("query", "") if isinstance(query, dict) else query or ""
        m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", query.strip())
        if not m or m.group(2) != name:
            problem(where, f"variable {name} is not label_values(..., {name}): {query!r}")
        else:
            exprs.append((f"{where} variable {name}", m.group(1)))
    ids = {}
    panels_with_targets = 0
    for p in all_panels(dash.get("panels", [])):
        title = p.get("title", "?")
        pw = f"{where} panel {p.get('id')} '{title}'"
        if not isinstance(p.get("id"), int):
            problem(pw, "has no integer id")
        elif p["id"] in ids:
            problem(pw, f"has the id of panel '{ids[p['id']]}'")
        else:
            ids[p["id"]] = title
        grid = p.get("gridPos", {})
        if not all(isinstance(grid.get(k), int) for k in "hwxy") or grid["x"] + grid["w"] > 24:
            problem(pw, f"has no gridPos inside 24 columns: {grid}")
        if p.get("type") == "row":
            continue
        if not templated(p.get("datasource")):
            problem(pw, f"datasource is not ${{datasource}}: {p.get('datasource')}")
        targets = p.get("targets") or []
        if not targets:
            problem(pw, "has no targets")
        refs = [t.get("refId") for t in targets]
        if len(set(refs)) != len(refs) or None in refs:
            problem(pw, f"target refIds are missing or repeated: {refs}")
        for t in targets:
            if not t.get("expr", "").strip():
                problem(pw, f"target {t.get('refId')} has no expr")
                continue
            if not templated(t.get("datasource", DATASOURCE)):
                problem(pw, f"target {t.get('refId')} datasource is not ${{datasource}}")
            exprs.append((f"{pw} target {t.get('refId')}", t["expr"]))
        panels_with_targets += 1
    if panels_with_targets == 0:
        problem(where, "has no panels with targets")
    used = set()
    for w, expr in exprs:
        try:
            selectors, _ = parse(expr)
        except PromQLError as e:
            problem(w, f"{e}: {expr}")
            continue
        for metric, matchers in selectors:
            used.add(metric)
            if "variable" in w:
                continue
            for var in ("node", "instance"):
                if matchers.get(var) != ("=~", f"${var}"):
                    problem(w, f"{metric} is not filtered by {var}=~\"${var}\"")
    for m in sorted(DASHBOARD_FIGURES - used):
        problem(where, f"no panel shows {m}")
    return exprs


# --- the alerts --------------------------------------------------------------

# The alerts issue 40 asks for, each by the metric it watches.
ALERT_METRICS = {
    "gpuexec_device_answering", "gpuexec_device_resets_total", "gpuexec_strike_refusals_total",
    "gpuexec_device_memory_used_bytes", "gpuexec_tls_certificate_expiry_timestamp_seconds",
    "up", "gpuexec_draining",
}
SEVERITIES = {"critical", "warning", "info"}


def check_rules(path, work):
    """The rules' expressions as (where, expr), and a plain rules file of
    spec.groups for promtool."""
    where = os.path.basename(path)
    try:
        doc = yaml.safe_load(open(path))
    except (OSError, yaml.YAMLError) as e:
        problem(where, f"does not parse: {e}")
        return [], None
    if doc.get("apiVersion") != "monitoring.coreos.com/v1" or doc.get("kind") != "PrometheusRule":
        problem(where, "is not a monitoring.coreos.com/v1 PrometheusRule")
    if not doc.get("metadata", {}).get("name"):
        problem(where, "has no metadata.name")
    groups = doc.get("spec", {}).get("groups") or []
    exprs, alerts, watched = [], set(), set()
    for g in groups:
        for r in g.get("rules") or []:
            name = r.get("alert") or r.get("record") or "?"
            rw = f"{where} {name}"
            if not isinstance(r.get("expr"), str):
                problem(rw, "has no expr")
                continue
            exprs.append((rw, r["expr"]))
            if "alert" not in r:
                continue
            if name in alerts:
                problem(rw, "is defined twice")
            alerts.add(name)
            if r.get("labels", {}).get("severity") not in SEVERITIES:
                problem(rw, f"has no severity label of {sorted(SEVERITIES)}")
            for a in ("summary", "description", "runbook"):
                if not str(r.get("annotations", {}).get(a, "")).strip():
                    problem(rw, f"has no {a} annotation")
            try:
                watched |= {s[0] for s in parse(r["expr"])[0]}
            except PromQLError as e:
                problem(rw, f"{e}: {r['expr']}")
    for m in sorted(ALERT_METRICS - watched):
        problem(where, f"no alert watches {m}")
    plain = os.path.join(work, "rules.plain.yaml")
    with open(plain, "w") as f:
        yaml.safe_dump({"groups": groups}, f, sort_keys=False)
    return exprs, plain


def promtool(cache):
    """usr/bin/promtool from Debian's prometheus package, downloaded into
    cache (once) and unpacked there, never installed."""
    tool = os.path.join(cache, "root", "usr", "bin", "promtool")
    if os.access(tool, os.X_OK):
        return tool
    os.makedirs(cache, exist_ok=True)
    for old in glob.glob(os.path.join(cache, "prometheus_*.deb")):
        os.remove(old)
    try:
        out = subprocess.run(["apt-get", "download", "prometheus"], cwd=cache,
                             capture_output=True, text=True, timeout=240)
        said = (out.stderr or out.stdout).strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        out, said = None, str(e)
    debs = glob.glob(os.path.join(cache, "prometheus_*.deb"))
    if out is None or out.returncode != 0 or not debs:
        sys.exit("FAIL: promtool is needed to check rules.yaml; `apt-get download prometheus` "
                 f"in {cache} failed (no network or Debian mirror? CI has one):\n{said}")
    unpacked = os.path.join(cache, "root.tmp")
    shutil.rmtree(unpacked, ignore_errors=True)
    subprocess.run(["dpkg-deb", "-x", debs[0], unpacked], check=True)
    shutil.rmtree(os.path.join(cache, "root"), ignore_errors=True)
    os.rename(unpacked, os.path.join(cache, "root"))
    os.remove(debs[0])  # 19 MB; the unpacked promtool is what is kept
    return tool


# --- the Kubernetes objects --------------------------------------------------

def load_objects(path):
    try:
        return [d for d in yaml.safe_load_all(open(path)) if d]
    except (OSError, yaml.YAMLError) as e:
        problem(os.path.basename(path), f"does not parse: {e}")
        return []


def check_objects(mdir, kdir, rules_exprs):
    objs = {}
    for path in sorted(glob.glob(os.path.join(mdir, "*.yaml"))):
        if os.path.basename(path) == "kustomization.yaml":
            continue
        for d in load_objects(path):
            for key in ("apiVersion", "kind"):
                if not d.get(key):
                    problem(os.path.basename(path), f"an object has no {key}")
            if not d.get("metadata", {}).get("name"):
                problem(os.path.basename(path), "an object has no metadata.name")
            objs.setdefault(d.get("kind"), []).append((os.path.basename(path), d))
    daemonsets = [d for p in glob.glob(os.path.join(kdir, "*.yaml")) for d in load_objects(p)
                  if d.get("kind") == "DaemonSet"]
    if not daemonsets:
        problem(kdir, "has no DaemonSet")
        return
    pod = daemonsets[0]["spec"]["template"]
    pod_labels = pod["metadata"].get("labels", {})
    container = next((c for c in pod["spec"]["containers"] if c["name"] == "gpuexecd"), None)
    ports = {p.get("name"): p.get("containerPort") for p in (container or {}).get("ports", [])}
    metrics_port = None
    for a in (container or {}).get("args", []):
        m = re.match(r"--metrics_listen=.*:(\d+)$", a)
        if m:
            metrics_port = int(m.group(1))
    if metrics_port is None:
        problem("daemonset.yaml", "gpuexecd passes no --metrics_listen")

    services = objs.get("Service", [])
    metrics_services = []
    for f, svc in services:
        sel = svc.get("spec", {}).get("selector", {})
        if not sel or any(pod_labels.get(k) != v for k, v in sel.items()):
            problem(f, f"Service {svc['metadata']['name']} does not select the DaemonSet's pods")
        for p in svc.get("spec", {}).get("ports", []):
            target = p.get("targetPort")
            if target not in ports:
                problem(f, f"port {p.get('name')} targets {target!r}, no named port of gpuexecd")
            elif ports[target] != metrics_port:
                problem(f, f"port {p.get('name')} targets {target} ({ports[target]}), not the "
                           f"port --metrics_listen opens ({metrics_port})")
            else:
                metrics_services.append((svc, p))
    if not metrics_services:
        problem("deploy/monitoring", "no Service exposes the daemon's metrics port")

    jobs = set()
    for f, sm in objs.get("ServiceMonitor", []):
        if sm.get("apiVersion") != "monitoring.coreos.com/v1":
            problem(f, "is not monitoring.coreos.com/v1")
        match = sm.get("spec", {}).get("selector", {}).get("matchLabels", {})
        picked = [(svc, p) for svc, p in metrics_services
                  if match and all(svc["metadata"].get("labels", {}).get(k) == v
                                   for k, v in match.items())]
        if not picked:
            problem(f, f"selects no metrics Service (matchLabels {match})")
        for ep in sm.get("spec", {}).get("endpoints", []):
            if not any(p.get("name") == ep.get("port") for _, p in picked):
                problem(f, f"endpoint port {ep.get('port')!r} is no port of the selected Service")
            relabeled = {r.get("targetLabel") for r in ep.get("relabelings", [])}
            if "node" not in relabeled:
                problem(f, "does not label the series with their node (the dashboard's $node)")
        job_label = sm.get("spec", {}).get("jobLabel")
        for svc, _ in picked:
            jobs.add(svc["metadata"].get("labels", {}).get(job_label) if job_label
                     else svc["metadata"]["name"])
    if not objs.get("ServiceMonitor"):
        problem("deploy/monitoring", "has no ServiceMonitor")
    for w, expr in rules_exprs:
        try:
            for metric, matchers in parse(expr)[0]:
                if metric == "up" and matchers.get("job", ("=", None))[1] not in jobs:
                    problem(w, f"up's job {matchers.get('job')} is not the ServiceMonitor's "
                               f"job ({sorted(j for j in jobs if j)})")
        except PromQLError:
            pass  # said already

    admitted = set()
    for p in glob.glob(os.path.join(kdir, "*.yaml")):
        for d in load_objects(p):
            if d.get("kind") == "NetworkPolicy":
                for rule in d["spec"].get("ingress", []):
                    admitted |= {q.get("port") for q in rule.get("ports", [])}
    if metrics_port is not None and metrics_port not in admitted:
        problem("networkpolicy.yaml", f"admits nothing to the metrics port {metrics_port}")

    kust = os.path.join(mdir, "kustomization.yaml")
    if os.path.exists(kust):
        doc = yaml.safe_load(open(kust))
        listed = set(doc.get("resources", []))
        for path in glob.glob(os.path.join(mdir, "*.yaml")):
            name = os.path.basename(path)
            if name != "kustomization.yaml" and name not in listed:
                problem("kustomization.yaml", f"does not list {name}")
        kubectl = shutil.which("kubectl")
        if kubectl:
            out = subprocess.run([kubectl, "kustomize", mdir], capture_output=True, text=True)
            if out.returncode != 0:
                problem("kustomization.yaml", f"kubectl kustomize: {out.stderr.strip()}")


# --- the daemon's metrics ----------------------------------------------------

# Labels Prometheus (and the ServiceMonitor) put on every series.
TARGET_LABELS = {"instance", "job", "node", "namespace", "pod", "service", "container",
                 "endpoint", "__name__"}
# Families the daemon exports only while it serves TLS; checked on a second
# daemon that does.
TLS_ONLY = {
    "gpuexec_tls_certificate_expiry_timestamp_seconds",  # {kind}: each certificate served
}
# Not the daemon's: Prometheus makes it for every target.
PROMETHEUS_OWN = {"up"}


class Daemon:
    def __init__(self, argv, work, name):
        self.log = os.path.join(work, f"{name}.log")
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                     stderr=open(self.log, "w"), cwd=work)
        deadline = time.monotonic() + 60
        self.serving = None
        while time.monotonic() < deadline and self.proc.poll() is None:
            m = re.search(r"gpuexecd serving .* on (\S+) with .*metrics on 127\.0\.0\.1:(\d+)/",
                          open(self.log).read())
            if m:
                self.serving, self.metrics_port = m.group(1), int(m.group(2))
                break
            time.sleep(0.05)
        if self.serving is None:
            self.stop()
            sys.exit(f"FAIL: gpuexecd ({name}) did not start:\n{open(self.log).read()}")

    def scrape(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                    timeout=10) as r:
            return r.read().decode()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+\S+")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*"')


def exposition(text):
    """{family: (type, set of label names over its samples)}."""
    families = {}
    for line in text.splitlines():
        m = re.match(r"^# TYPE (\S+) (\S+)", line)
        if m:
            families.setdefault(m.group(1), [m.group(2), set()])[0] = m.group(2)
            continue
        m = SAMPLE.match(line)
        if not m or line.startswith("#"):
            continue
        family = family_of(m.group(1), families)
        if family:
            families[family][1] |= set(LABEL.findall(m.group(2) or ""))
    return families


def family_of(name, families):
    """The family a sample or selector name belongs to, or None."""
    if name in families:
        return name
    for suffix, kinds in (("_bucket", {"histogram"}), ("_sum", {"histogram", "summary"}),
                          ("_count", {"histogram", "summary"})):
        base = name[: -len(suffix)]
        if name.endswith(suffix) and families.get(base, [None])[0] in kinds:
            return base
    return None


def merge(a, b):
    out = {k: [v[0], set(v[1])] for k, v in a.items()}
    for k, (kind, labels) in b.items():
        out.setdefault(k, [kind, set()])[1] |= labels
    return out


def scrape_daemons(args, work):
    gpuexecd, driver, cli, kernels = args
    common = [gpuexecd, "--metrics_listen=127.0.0.1:0", f"--driver={driver}"]

    sock = os.path.join(work, "d.sock")
    plain = Daemon(common + ["--listen=", f"--unix_socket={sock}"], work, "plain")
    try:
        # A session that runs a kernel and reads its result: the series made
        # on first use (per tenant, per call and status) appear.
        run = subprocess.run(
            [cli, f"--target=unix:{sock}", "--timeout=30s", "run",
             os.path.join(kernels, "gx_kernels.cubin"), "gx_fill_u32", "--grid=2", "--block=128",
             f"out:4K:{os.path.join(work, 'fill.bin')}", "u32:0xdeadbeef", "u64:1000"],
            capture_output=True, text=True, timeout=120)
        if run.returncode != 0:
            sys.exit(f"FAIL: gpuexec run on the plain daemon: {run.stdout}{run.stderr}\n"
                     f"{open(plain.log).read()}")
        plain_families = exposition(plain.scrape())
    finally:
        plain.stop()

    key = os.path.join(work, "tls.key")
    cert = os.path.join(work, "tls.crt")
    out = subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", key, "-out", cert, "-days", "30", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"FAIL: openssl could not make a test certificate: {out.stderr}")
    tls = Daemon(common + ["--listen=127.0.0.1:0", f"--tls_cert={cert}", f"--tls_key={key}"],
                 work, "tls")
    try:
        # Its certificates' figures are there from the start; no call is needed.
        tls_families = exposition(tls.scrape())
    finally:
        tls.stop()
    return plain_families, tls_families


def check_names(exprs, plain, tls):
    both = merge(plain, tls)
    all_labels = set().union(*(labels for _, labels in both.values())) | TARGET_LABELS | {"le"}
    missing = {}
    for w, expr in exprs:
        try:
            selectors, grouping = parse(expr)
        except PromQLError:
            continue  # said already
        for metric, matchers in selectors:
            if metric in PROMETHEUS_OWN:
                continue
            if metric in TLS_ONLY:
                family = family_of(metric, tls)
                if family is None:
                    missing.setdefault(metric, []).append(f"{w} (not on the TLS daemon either)")
                    continue
            else:
                family = family_of(metric, plain)
                if family is None:
                    missing.setdefault(metric, []).append(w)
                    continue
            labels = both[family][1]
            if not labels and matchers.keys() - TARGET_LABELS:
                print(f"note: {family} had no series with labels; its matchers in {w} "
                      "are not checked")
                continue
            for label in sorted(matchers.keys() - TARGET_LABELS - labels):
                problem(w, f"{metric} has no label {label} (it has {sorted(labels)})")
        for label in sorted(grouping - all_labels):
            problem(w, f"groups by {label}, a label no series of the daemon has")
    for metric, where in sorted(missing.items()):
        problem(metric, "is not a metric family gpuexecd exports; used in " + "; ".join(where))
    for metric in sorted(TLS_ONLY & plain.keys()):
        print(f"note: {metric} is exported without TLS too; TLS_ONLY need not list it")


def main():
    if len(sys.argv) != 8:
        sys.exit(__doc__)
    mdir, kdir, gpuexecd, driver, cli, kernels, cache = map(os.path.abspath, sys.argv[1:])
    self_test()
    with tempfile.TemporaryDirectory(prefix="gpuexec-monitoring-") as work:
        dash_exprs = check_dashboard(os.path.join(mdir, "dashboard.json"))
        rules_exprs, plain_rules = check_rules(os.path.join(mdir, "rules.yaml"), work)
        check_objects(mdir, kdir, rules_exprs)
        if plain_rules:
            tool = promtool(cache)
            out = subprocess.run([tool, "check", "rules", plain_rules],
                                 capture_output=True, text=True)
            if out.returncode != 0:
                problem("rules.yaml", f"promtool check rules:\n{out.stdout}{out.stderr}")
            else:
                print(f"promtool check rules: {out.stdout.strip().splitlines()[-1]}")
        plain, tls = scrape_daemons((gpuexecd, driver, cli, kernels), work)
        exprs = dash_exprs + rules_exprs
        check_names(exprs, plain, tls)
        used = set()
        for _, e in exprs:
            try:
                used |= {s[0] for s in parse(e)[0]}
            except PromQLError:
                pass
    if problems:
        print(f"{len(problems)} problem(s) in deploy/monitoring:")
        for p in problems:
            print(f"  {p}")
        sys.exit(1)
    print(f"deploy/monitoring: ok ({len(dash_exprs)} dashboard and {len(rules_exprs)} rule "
          f"expressions, {len(used)} metric names, each exported by gpuexecd)")


if __name__ == "__main__":
    main()
