#!/usr/bin/env python3
"""Render and lint helm/goodput in both modes with several value sets (Helm's own library,
PyPI helm-python-sdk: no helm binary), then validate every rendered object with
`kubernetes-validate --strict`, and check what the chart promises: goodput's config parses
(`goodput check-config`), vLLM listens on localhost only in sidecar mode, the containers run
as non-root with a read-only root filesystem, the config is mounted as a directory (so it
reloads), the replicas or their autoscaler, rollout strategy, PodDisruptionBudget and spread
constraints are the values' and select the chart's pods, and the PrometheusRule carries files/goodput-rules.yaml.

    python scripts/check-chart.py GOODPUT_BIN OUT_DIR      (scripts/setup-deploy-check.sh
                                                            prints the python to use)

Custom resources (ServiceMonitor, PrometheusRule) have no schema in kubernetes-validate: they
are checked against the Prometheus Operator's required fields here instead.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import helm_python
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHART = os.path.join(ROOT, "helm", "goodput")

VALUE_SETS = {
    "sidecar-default": {},
    "sidecar-scorer-monitoring": {
        "scorer": {"enabled": True, "sampleRate": 0.05},
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "prometheusRule": {"enabled": True},
        "vllm": {"model": "HuggingFaceTB/SmolLM2-1.7B-Instruct", "servedModelName": "smol", "extraArgs": ["--max-model-len", "4096", "--enable-prefix-caching"], "replicaCount": 3, "startupSeconds": 1805},
        # No GPU to spare for a surge pod: one replica down at a time.
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
        "goodput": {"config": {"quality": {"consistency": {"sample_rate": 0.01, "methods": ["unigram"]}}}},
    },
    "sidecar-gpu-scorer-pvc": {
        "scorer": {"enabled": True, "gpu": True, "maxCpu": 2, "model": {"source": "pvc", "pvc": {"claimName": "goodput-models"}}},
        "image": {"tag": "0.1.0-cuda"},
        "podDisruptionBudget": {"enabled": False},
        # Scaled on the queue vLLM reports, as goodput exports it (through a metrics adapter).
        "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 4, "metrics": [
            {"type": "Pods", "pods": {"metric": {"name": "goodput_server_requests_waiting"}, "target": {"type": "AverageValue", "averageValue": "4"}}},
        ]},
        # CUDA's first session takes longer: an odd number rounds up to whole probe periods.
        "goodput": {"startupSeconds": 601},
    },
    "router-default": {"mode": "router"},
    "router-three-backends": {
        "mode": "router",
        "replicaCount": 3,
        "router": {
            "backends": [
                # A pool of replicas behind a headless Service: goodput picks the replica.
                {"name": "h100-70b", "discovery": {"dns": "vllm-70b-headless.llm.svc.cluster.local", "port": 8000, "refresh_secs": 10}, "models": ["llama-70b"], "price": {"input_per_1m": 0.6, "output_per_1m": 1.8}, "max_concurrency": 256, "pool": {"max_waiting": 8}},
                {"name": "l4-8b", "url": "http://vllm-8b.llm:8000", "models": ["llama-8b"], "price": {"input_per_1m": 0.05, "output_per_1m": 0.15}},
                {"name": "a10-8b", "url": "http://vllm-8b-a10.llm:8000", "models": ["llama-8b"], "price": {"input_per_1m": 0.08, "output_per_1m": 0.2}},
            ]
        },
        "goodput": {
            "adminTokenSecret": {"name": "goodput-admin", "key": "token"},
            "shutdownGraceSeconds": 60,
            "logFormat": "json",
            "requestLog": True,
            "config": {
                "classes": {
                    "interactive": {"ttft_p95_ms": 300, "tpot_p95_ms": 40, "objective": "cheapest"},
                    "batch": {"e2e_p95_ms": 60000, "objective": "best-value"},
                },
                "routes": [{"name": "chat", "match": {"headers": {"x-tenant": "app"}}, "class": "interactive", "rewrite_model": True}],
                "routing": {"default_class": "batch", "exploration": 0.03, "stats": {"source": "prometheus", "prometheus_url": "http://prometheus.monitoring:9090"}},
            }
        },
        "serviceMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}],
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"},
            {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"tier": "llm-router"}}},
        ],
        "podDisruptionBudget": {"maxUnavailable": 2},
        "autoscaling": {"enabled": True, "minReplicas": 3, "maxReplicas": 12},
    },
}


def fail(msg):
    print(f"check-chart: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def containers(obj):
    spec = obj["spec"]["template"]["spec"]
    return {c["name"]: c for c in spec.get("containers", []) + spec.get("initContainers", [])}


def check_objects(name, objs, values, goodput_bin, out):
    kinds = {o["kind"] for o in objs}
    for k in ("ConfigMap", "Deployment", "Service"):
        if k not in kinds:
            fail(f"{name}: no {k}")
    cm = next(o for o in objs if o["kind"] == "ConfigMap")
    cfg_path = os.path.join(out, f"{name}.goodput.yaml")
    with open(cfg_path, "w") as f:
        f.write(cm["data"]["goodput.yaml"])
    # The generated config must be one goodput accepts (model paths exist only in the pod).
    cfg = yaml.safe_load(cm["data"]["goodput.yaml"])
    if "quality" in cfg and "perplexity" in cfg["quality"]:
        cfg["quality"].pop("perplexity")
    checkable = os.path.join(out, f"{name}.checkable.yaml")
    with open(checkable, "w") as f:
        yaml.safe_dump(cfg, f)
    dep = next(o for o in objs if o["kind"] == "Deployment")
    cs = containers(dep)
    gp = cs["goodput"]
    # Run with the container's plain environment values (the log format and level among them).
    pod_env = {e["name"]: e["value"] for e in gp.get("env", []) if "value" in e}
    want_format = values.get("goodput", {}).get("logFormat", "text")
    if pod_env.get("GOODPUT_LOG_FORMAT") != want_format:
        fail(f"{name}: GOODPUT_LOG_FORMAT is {pod_env.get('GOODPUT_LOG_FORMAT')!r}, values say {want_format!r}")
    if bool(values.get("goodput", {}).get("requestLog")) != (pod_env.get("GOODPUT_REQUEST_LOG") == "-"):
        fail(f"{name}: GOODPUT_REQUEST_LOG is {pod_env.get('GOODPUT_REQUEST_LOG')!r} with requestLog {values.get('goodput', {}).get('requestLog')!r}")
    r = subprocess.run([goodput_bin, "check-config", checkable], capture_output=True, text=True, env={**os.environ, **pod_env})
    if r.returncode != 0:
        fail(f"{name}: goodput rejects the generated config:\n{r.stdout}{r.stderr}")
    sc = gp["securityContext"]
    if not (sc.get("runAsNonRoot") and sc.get("readOnlyRootFilesystem") and sc.get("allowPrivilegeEscalation") is False):
        fail(f"{name}: goodput's securityContext is not non-root / read-only: {sc}")
    mount = next(m for m in gp["volumeMounts"] if m["name"] == "config")
    if "subPath" in mount:
        fail(f"{name}: the config is mounted with subPath: a ConfigMap change would never reach the pod")
    probes = (gp["livenessProbe"]["httpGet"]["path"], gp["readinessProbe"]["httpGet"]["path"])
    if probes != ("/healthz", "/readyz"):
        fail(f"{name}: probes {probes}")
    # goodput serves nothing while it loads the scorer's model: without a startup probe the
    # liveness probe would restart a slow start over and over.
    sp = gp.get("startupProbe") or fail(f"{name}: goodput has no startupProbe")
    window = sp["periodSeconds"] * sp["failureThreshold"]
    want_window = values.get("goodput", {}).get("startupSeconds", 300)
    if sp["httpGet"]["path"] != "/healthz" or not want_window <= window < want_window + sp["periodSeconds"]:
        fail(f"{name}: startupProbe {sp} does not wait {want_window} s for /healthz")
    for k in ("requests", "limits"):
        if not gp["resources"].get(k):
            fail(f"{name}: goodput has no resource {k}")
    # SIGTERM drains for the grace period; the kubelet must not SIGKILL before it ends.
    grace = int(values.get("goodput", {}).get("shutdownGraceSeconds", 30))
    args = gp["args"]
    if int(args[args.index("--shutdown-grace-secs") + 1]) != grace:
        fail(f"{name}: goodput's --shutdown-grace-secs is not {grace}: {args}")
    if dep["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30) <= grace:
        fail(f"{name}: terminationGracePeriodSeconds does not exceed the drain of {grace} s")
    sleep = int(values.get("goodput", {}).get("preStopSleepSeconds", 5))
    hook = gp.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
    if (hook != ["sleep", str(sleep)]) if sleep else hook:
        fail(f"{name}: goodput's preStop hook {hook}, values say a sleep of {sleep} s")
    if dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] <= sleep + grace:
        fail(f"{name}: terminationGracePeriodSeconds does not exceed the preStop sleep and the drain")
    secret = values.get("goodput", {}).get("adminTokenSecret", {}).get("name")
    env = {e["name"]: e for e in gp.get("env", [])}
    if secret:
        ref = env.get("GOODPUT_ADMIN_TOKEN", {}).get("valueFrom", {}).get("secretKeyRef", {})
        if ref.get("name") != secret:
            fail(f"{name}: the admin token does not come from Secret {secret}: {env}")
    elif "GOODPUT_ADMIN_TOKEN" in env:
        fail(f"{name}: an admin token without adminTokenSecret")
    mode = values.get("mode", "sidecar")
    check_scaling(name, objs, dep, values, mode)
    if mode == "sidecar":
        v = cs.get("vllm") or fail(f"{name}: no vllm container in sidecar mode")
        start = values.get("vllm", {}).get("startupSeconds", 900)
        sp = v["startupProbe"]
        if not start <= sp["periodSeconds"] * sp["failureThreshold"] < start + sp["periodSeconds"]:
            fail(f"{name}: vLLM's startupProbe {sp} does not wait {start} s")
        if dep["spec"].get("progressDeadlineSeconds", 600) <= start:
            fail(f"{name}: progressDeadlineSeconds {dep['spec'].get('progressDeadlineSeconds')} ends before vLLM's start-up window of {start} s")
        host = v["args"][v["args"].index("--host") + 1]
        if host != "127.0.0.1":
            fail(f"{name}: vLLM listens on {host}, not localhost only")
        if cfg["backends"][0]["url"] != "http://127.0.0.1:8000":
            fail(f"{name}: goodput's backend is {cfg['backends'][0]['url']}")
        svc = next(o for o in objs if o["kind"] == "Service" and not o["metadata"]["name"].endswith("-admin"))
        if [p["targetPort"] for p in svc["spec"]["ports"]] != ["http"]:
            fail(f"{name}: the Service must point at goodput's port only")
    else:
        if "vllm" in cs:
            fail(f"{name}: a vllm container in router mode")
        if len(cfg["backends"]) != len(values.get("router", {}).get("backends", [1])):
            fail(f"{name}: backends {cfg['backends']}")
    scorer = values.get("scorer", {})
    if scorer.get("enabled"):
        if "models" not in {m["name"] for m in gp["volumeMounts"]}:
            fail(f"{name}: scorer enabled but no model volume")
        quality = yaml.safe_load(cm["data"]["goodput.yaml"])["quality"]
        dev = quality["perplexity"]["device"]
        if quality.get("max_cpu") != scorer.get("maxCpu", 0.5):
            fail(f"{name}: quality.max_cpu {quality.get('max_cpu')}, values say {scorer.get('maxCpu', 0.5)}")
        want = "cuda:0" if scorer.get("gpu") else "cpu"
        if dev != want or (scorer.get("gpu") and gp["resources"]["limits"].get("nvidia.com/gpu") != 1):
            fail(f"{name}: scorer device {dev}, resources {gp['resources']}")
    for o in objs:
        if o["kind"] == "ServiceMonitor":
            ep = o["spec"]["endpoints"][0]
            if ep["port"] != "admin" or ep["path"] != "/metrics" or not o["spec"]["selector"]["matchLabels"]:
                fail(f"{name}: ServiceMonitor {o['spec']}")
        if o["kind"] == "PrometheusRule":
            with open(os.path.join(CHART, "files", "goodput-rules.yaml")) as f:
                if o["spec"] != yaml.safe_load(f):
                    fail(f"{name}: the PrometheusRule differs from files/goodput-rules.yaml")
            if o["apiVersion"] != "monitoring.coreos.com/v1":
                fail(f"{name}: PrometheusRule apiVersion {o['apiVersion']}")
    return [o for o in objs if o["apiVersion"] != "monitoring.coreos.com/v1"]


def check_scaling(name, objs, dep, values, mode):
    """Replicas from the mode's own value, the strategy as given, a PodDisruptionBudget that
    selects exactly the Deployment's pods, and spread constraints that select them too."""
    auto = {"enabled": False, "minReplicas": 2, "maxReplicas": 10, "targetCPUUtilizationPercentage": 70, "metrics": [], **values.get("autoscaling", {})}
    hpas = [o for o in objs if o["kind"] == "HorizontalPodAutoscaler"]
    if auto["enabled"]:
        # The autoscaler owns the count: a replicas field would reset it at every upgrade.
        if "replicas" in dep["spec"]:
            fail(f"{name}: replicas set although an autoscaler owns them")
        cpu = [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": auto["targetCPUUtilizationPercentage"]}}}]
        want_hpa = {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": dep["metadata"]["name"]},
            "minReplicas": auto["minReplicas"], "maxReplicas": auto["maxReplicas"], "metrics": auto["metrics"] or cpu,
        }
        if len(hpas) != 1 or hpas[0]["spec"] != want_hpa:
            fail(f"{name}: HorizontalPodAutoscaler {[h['spec'] for h in hpas]}, want {want_hpa}")
    else:
        want = values.get("vllm", {}).get("replicaCount", 1) if mode == "sidecar" else values.get("replicaCount", 2)
        if dep["spec"].get("replicas") != want or hpas:
            fail(f"{name}: {dep['spec'].get('replicas')} replicas and {len(hpas)} autoscalers, values say {want} and none")
    if dep["spec"].get("strategy", {}) != values.get("strategy", {}):
        fail(f"{name}: strategy {dep['spec'].get('strategy')}, values say {values.get('strategy')}")
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    pdb_values = {"enabled": True, "maxUnavailable": 1, **values.get("podDisruptionBudget", {})}
    pdbs = [o for o in objs if o["kind"] == "PodDisruptionBudget"]
    if not pdb_values["enabled"]:
        if pdbs:
            fail(f"{name}: a PodDisruptionBudget although disabled")
    elif len(pdbs) != 1 or pdbs[0]["spec"].get("maxUnavailable") != pdb_values["maxUnavailable"] or "minAvailable" in pdbs[0]["spec"]:
        fail(f"{name}: PodDisruptionBudget {[p['spec'] for p in pdbs]}, values say {pdb_values}")
    elif pdbs[0]["spec"]["selector"]["matchLabels"] != dep["spec"]["selector"]["matchLabels"]:
        fail(f"{name}: the PodDisruptionBudget selects {pdbs[0]['spec']['selector']}, not the Deployment's pods")
    spread = dep["spec"]["template"]["spec"].get("topologySpreadConstraints", [])
    given = values.get("topologySpreadConstraints", [])
    if len(spread) != len(given):
        fail(f"{name}: topologySpreadConstraints {spread}")
    for got, want in zip(spread, given):
        sel = got.get("labelSelector", {}).get("matchLabels", {})
        if "labelSelector" in want:
            if got["labelSelector"] != want["labelSelector"]:
                fail(f"{name}: a given labelSelector was replaced: {got}")
        elif not sel or not sel.items() <= pod_labels.items():
            fail(f"{name}: spread constraint {got} does not select the chart's pods {pod_labels}")
        if {k: v for k, v in got.items() if k != "labelSelector"} != {k: v for k, v in want.items() if k != "labelSelector"}:
            fail(f"{name}: spread constraint {got}, values say {want}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_shutdown_order(chart, goodput_bin, out):
    """vLLM stops generating on SIGTERM (by default), so in sidecar mode its preStop hook must
    hold the signal until goodput has drained its streams and exited. Run the rendered hooks as
    the kubelet does (both at once; each container signalled when its hook returns) beside a real
    goodput serving a stream, and check the order."""
    port = free_port()
    values = {"goodput": {"adminPort": port, "preStopSleepSeconds": 1, "shutdownGraceSeconds": 10}}
    rendered = chart.render(values, name="llm", namespace="llm", is_install=True)
    objs = [d for path, text in rendered.items() if not path.endswith("NOTES.txt") for d in yaml.safe_load_all(text) if d]
    dep = next(o for o in objs if o["kind"] == "Deployment")
    cs = containers(dep)
    vllm_hook = cs["vllm"].get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command") or fail("vLLM has no preStop hook")
    gp_hook = cs["goodput"].get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command") or fail("goodput has no preStop hook")
    budget = dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    if budget < 1 + 10 + 10:
        fail(f"terminationGracePeriodSeconds {budget} leaves vLLM no time to exit after goodput's drain")
    cfg = os.path.join(out, "shutdown-order.yaml")
    with open(cfg, "w") as f:
        yaml.safe_dump({
            "listen": "127.0.0.1:0",
            "admin_listen": f"127.0.0.1:{port}",
            "backends": [{"name": "vllm", "sim": {"model": "m", "ttft_ms": 10, "tpot_ms": 50, "output_tokens": 40}}],
        }, f)
    gp = subprocess.Popen([goodput_bin, "serve", "--config", cfg, "--shutdown-grace-secs", "10"],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        proxy = next(w[len("proxy="):] for w in gp.stdout.readline().split() if w.startswith("proxy="))
        got = {}

        def stream():
            body = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}).encode()
            req = urllib.request.Request(f"http://{proxy}/v1/chat/completions", body, {"content-type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=20) as r:
                    got["body"] = r.read().decode()
            except Exception as e:  # reported below, as a stream that did not finish
                got["error"] = repr(e)

        t = threading.Thread(target=stream, daemon=True)
        t.start()
        time.sleep(0.3)
        hook = subprocess.Popen(vllm_hook)
        subprocess.run(gp_hook, check=True)
        if hook.poll() is not None:
            fail("vLLM's preStop hook returned while goodput was still serving")
        gp.send_signal(signal.SIGTERM)
        gp.wait(timeout=15)
        gp_exit = time.monotonic()
        hook.wait(timeout=10)
        hook_exit = time.monotonic()
        t.join(timeout=5)
        if "data: [DONE]" not in got.get("body", ""):
            fail(f"the stream in flight did not finish through goodput's drain: {got}")
        if hook_exit - gp_exit > 2:
            fail(f"vLLM's preStop hook returned {hook_exit - gp_exit:.1f} s after goodput exited")
    finally:
        if gp.poll() is None:
            gp.kill()
    print(f"check-chart: shutdown order: vLLM's preStop hook returned after goodput drained a stream and exited (budget {budget} s)")


def main():
    goodput_bin, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    lint = helm_python.lint(CHART, strict=True)
    problems = [m for m in lint["messages"] if m["severity"] >= 2] + [{"error": e} for e in lint["errors"]]
    if problems:
        fail(f"helm lint --strict: {problems}")
    print(f"check-chart: helm lint --strict: {len(lint['messages'])} messages, none a warning or error")
    chart = helm_python.Chart.load(CHART)
    for name, values in VALUE_SETS.items():
        lint = helm_python.lint(CHART, values, strict=True)
        problems = [m for m in lint["messages"] if m["severity"] >= 2] + [{"error": e} for e in lint["errors"]]
        if problems:
            fail(f"{name}: helm lint --strict: {problems}")
        rendered = chart.render(values, name="llm", namespace="llm", is_install=True)
        objs = []
        for path, text in sorted(rendered.items()):
            if path.endswith("NOTES.txt"):
                if "goodput is deployed" not in text:
                    fail(f"{name}: NOTES.txt: {text!r}")
                continue
            objs += [d for d in yaml.safe_load_all(text) if d]
        core = check_objects(name, objs, values, goodput_bin, out)
        manifest = os.path.join(out, f"{name}.yaml")
        with open(manifest, "w") as f:
            yaml.safe_dump_all(core, f)
        kv = os.path.join(os.path.dirname(sys.executable), "kubernetes-validate")
        r = subprocess.run([kv, "--strict", "-k", "1.33.0", manifest], capture_output=True, text=True)
        if r.returncode != 0 or "ERROR" in r.stdout or "INVALID" in r.stdout:
            fail(f"{name}: kubernetes-validate --strict:\n{r.stdout}{r.stderr}")
        print(f"check-chart: {name}: {len(objs)} objects render, lint, validate ({', '.join(sorted(o['kind'] for o in objs))})")
    check_shutdown_order(chart, goodput_bin, out)
    # A bad mode is refused with a clear message.
    try:
        chart.render({"mode": "both"}, name="llm", namespace="llm")
        fail("mode=both rendered")
    except helm_python.HelmError as e:
        if "mode must be sidecar or router" not in str(e):
            fail(f"mode=both: unexpected error {e}")
    # Autoscaling a vLLM pod on its CPU is refused: it would scale on the wrong signal.
    try:
        chart.render({"autoscaling": {"enabled": True}}, name="llm", namespace="llm")
        fail("sidecar autoscaling without metrics rendered")
    except helm_python.HelmError as e:
        if "autoscaling in sidecar mode needs autoscaling.metrics" not in str(e):
            fail(f"sidecar autoscaling: unexpected error {e}")
    print("check-chart: ok")


if __name__ == "__main__":
    main()
