"""A real Prometheus scrapes a live daemon on loopback; its query API must show what happened.

Starts `winnow serve` (daemon_harness) and Debian's `prometheus` with a temporary config that
scrapes the daemon's /metrics every second, sends a handful of requests with the Python client,
and checks through /api/v1/query: finished-request counters by reason, token counters, KV pool
size against GetServerStatus, KV usage above 0 while a request runs and back to 0 after, and
that every Grafana dashboard query evaluates. `promtool check metrics` lints the exposition.
Both servers are stopped by the test. Everything stays on 127.0.0.1.
"""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import grpc
import pytest

from daemon_harness import Daemon, binary_path, free_port, model_path, pb2

REPO = pathlib.Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "winnow-dashboard.json"

N_REQUESTS = 5
MAX_TOKENS = 4

# promtool findings on the exposition that are known and accepted, with the reason. Anything
# else fails the test.
KNOWN_PROMTOOL_FINDINGS: set[tuple[str, str]] = set()


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found; it comes with the Debian package `prometheus` "
                    "(scripts/install-deps.sh)")
    return path


class Prometheus:
    """A throwaway Prometheus on a free loopback port, scraping `target` every second."""

    def __init__(self, target: str):
        self.dir = tempfile.TemporaryDirectory(prefix="winnow-prometheus-")
        root = pathlib.Path(self.dir.name)
        config = root / "prometheus.yml"
        config.write_text(
            "global:\n"
            "  scrape_interval: 1s\n"
            "  scrape_timeout: 1s\n"
            "  evaluation_interval: 1s\n"
            "scrape_configs:\n"
            "  - job_name: winnow\n"
            "    static_configs:\n"
            f"      - targets: ['{target}']\n")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(root / "prometheus.log", "w+")
        self.proc = subprocess.Popen(
            [_binary("prometheus"), f"--config.file={config}",
             f"--storage.tsdb.path={root / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}",
             "--storage.tsdb.retention.time=1h", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}:\n{self.logs()}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"prometheus not ready:\n{self.logs()}")
            time.sleep(0.1)

    def logs(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def query(self, promql: str) -> list[dict]:
        """Instant query; returns the result vector (raises on a PromQL error)."""
        url = self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:
            raise AssertionError(f"{promql}: HTTP {e.code}: {e.read().decode()}") from e
        assert body["status"] == "success", body
        return body["data"]["result"]

    def value(self, promql: str) -> float | None:
        """The single sample of a query that yields one series, None when it yields none."""
        result = self.query(promql)
        if not result:
            return None
        assert len(result) == 1, f"{promql}: {result}"
        return float(result[0]["value"][1])

    def wait_for(self, promql: str, predicate, timeout: float = 20.0) -> float | None:
        deadline = time.monotonic() + timeout
        value = None
        while time.monotonic() < deadline:
            value = self.value(promql)
            if value is not None and predicate(value):
                return value
            time.sleep(0.25)
        raise AssertionError(f"{promql} = {value} after {timeout}s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        self.dir.cleanup()


@pytest.fixture(scope="module")
def stack():
    if not binary_path().exists() or not model_path().exists():
        pytest.fail(f"need {binary_path()} and {model_path()} (make build model)")
    _binary("prometheus")
    with Daemon() as daemon:
        prom = Prometheus(f"127.0.0.1:{daemon.metrics_port}")
        try:
            prom.wait_for('up{job="winnow"}', lambda v: v == 1)
            yield daemon, prom
        finally:
            prom.stop()


def test_pool_size_is_scraped_before_any_request(stack):
    daemon, prom = stack
    status = daemon.client.server_status()
    assert prom.wait_for("winnow_kv_blocks_capacity", lambda v: v > 0, timeout=3) == \
        status.kv_blocks_total
    # Labelled counters have their series before the first event, so rate() works from the
    # first burst and panels read 0, not "No data".
    rejected = prom.query("winnow_requests_rejected_total")
    assert {r["metric"]["code"] for r in rejected} >= {"INVALID_ARGUMENT", "RESOURCE_EXHAUSTED",
                                                       "UNAVAILABLE", "NOT_FOUND"}
    assert all(float(r["value"][1]) == 0 for r in rejected)
    # The endpoint picker's block size, and vLLM's model_name label.
    (info,) = prom.query("winnow_cache_config_info")
    assert info["metric"]["block_size"] == str(status.block_size)
    (running,) = prom.query("winnow_requests_running")
    assert running["metric"]["model_name"] == daemon.client.model_info().name


def test_every_winnow_series_carries_model_name(stack):
    """docs/metrics.md's promise (cache_config_info excepted, as vLLM's)."""
    from prometheus_client.parser import text_string_to_metric_families
    daemon, _ = stack
    missing = {s.name for family in text_string_to_metric_families(daemon.metrics_text())
               for s in family.samples
               if s.name.startswith("winnow_") and "model_name" not in s.labels
               and not s.name.startswith("winnow_cache_config_info")}
    assert not missing, sorted(missing)


def test_promtool_accepts_the_exposition(stack):
    daemon, _ = stack
    proc = subprocess.run([_binary("promtool"), "check", "metrics"], input=daemon.metrics_text(),
                          capture_output=True, text=True, timeout=30)
    # Exit 1 is a parse error; 3 means lint findings, listed one per line as "name message".
    assert proc.returncode in (0, 3), proc.stdout + proc.stderr
    findings = set()
    for line in (proc.stdout + proc.stderr).splitlines():
        if line.strip():
            name, _, message = line.strip().partition(" ")
            findings.add((name, message))
    unexpected = findings - KNOWN_PROMTOOL_FINDINGS
    assert not unexpected, sorted(unexpected)
    assert (proc.returncode == 0) == (not findings)


def test_prometheus_sees_requests_tokens_and_kv(stack):
    daemon, prom = stack
    client = daemon.client
    status = client.server_status()

    assert prom.value("winnow_serving") == 1
    before = prom.value("sum(winnow_requests_finished_total)")
    assert before == 0

    prompt_tokens = 0
    for i in range(N_REQUESTS):
        _, ids, final = client.generate_text(f"Request {i}: say something.", max_tokens=MAX_TOKENS,
                                             temperature=0.0, ignore_eos=True, timeout=60)
        assert len(ids) == MAX_TOKENS and final.finish_reason == pb2.FINISH_REASON_LENGTH
        prompt_tokens += final.usage.prompt_tokens
    with pytest.raises(grpc.RpcError):  # one rejection
        list(client.generate("", max_tokens=2, timeout=10))

    total = prom.wait_for("sum(winnow_requests_finished_total)", lambda v: v >= N_REQUESTS)
    assert total == N_REQUESTS
    # Pool size: the scraped gauge is GetServerStatus' number.
    assert prom.wait_for("winnow_kv_blocks_capacity", lambda v: v > 0) == status.kv_blocks_total
    assert prom.value('winnow_requests_finished_total{reason="length"}') == N_REQUESTS
    assert prom.value('sum(winnow_requests_finished_total{reason!="length"})') == 0
    assert prom.wait_for("winnow_generation_tokens_total",
                         lambda v: v >= N_REQUESTS * MAX_TOKENS) == N_REQUESTS * MAX_TOKENS
    assert prom.value("winnow_prompt_tokens_total") == prompt_tokens
    assert prom.value('winnow_requests_rejected_total{code="INVALID_ARGUMENT"}') == 1
    assert prom.value("winnow_time_to_first_token_seconds_count") == N_REQUESTS
    assert prom.value("winnow_inter_token_latency_seconds_count") == N_REQUESTS * (MAX_TOKENS - 1)
    assert prom.value("winnow_e2e_request_latency_seconds_count") == N_REQUESTS
    p50 = prom.value("histogram_quantile(0.5, sum by (le) "
                     "(rate(winnow_time_to_first_token_seconds_bucket[1m])))")
    assert p50 is not None and 0 < p50 < 60

    # A long request: Prometheus sees it running with KV blocks in use, then everything free.
    stop = threading.Event()
    outcome = {}

    def stream():
        call = client.generate("Tell a long story about a lighthouse.", max_tokens=2000,
                               ignore_eos=True, timeout=120)
        try:
            for _ in call:
                if stop.is_set():
                    call.cancel()
                    break
            outcome["done"] = True
        except grpc.RpcError as e:
            outcome["code"] = e.code()

    thread = threading.Thread(target=stream)
    thread.start()
    try:
        prom.wait_for("winnow_requests_running", lambda v: v == 1)
        used = prom.wait_for("winnow_kv_cache_usage_ratio", lambda v: v > 0)
        assert 0 < used <= 1
        assert prom.value("winnow_kv_blocks_used") > 0
        assert prom.value("winnow_requests_waiting") == 0
    finally:
        stop.set()
        thread.join(60)
    assert outcome.get("done") or outcome.get("code") == grpc.StatusCode.CANCELLED, outcome
    daemon.wait_pool_free()
    assert prom.wait_for("winnow_kv_cache_usage_ratio", lambda v: v == 0) == 0
    assert prom.value("winnow_kv_blocks_used") == 0
    assert prom.value("winnow_requests_running") == 0
    assert prom.wait_for('winnow_requests_finished_total{reason="cancelled"}',
                         lambda v: v == 1) == 1
    assert prom.value("max_over_time(winnow_kv_cache_usage_ratio[1m])") > 0


def test_every_dashboard_query_evaluates(stack):
    """Each panel's PromQL runs on the real Prometheus and returns series for this daemon."""
    daemon, prom = stack
    # Traffic inside the rate window, so rate() and histogram_quantile() have something to show.
    for i in range(2):
        daemon.client.generate_text(f"Dashboard {i}", max_tokens=3, temperature=0.0,
                                    ignore_eos=True, timeout=60)
    with pytest.raises(grpc.RpcError):
        list(daemon.client.generate("", max_tokens=2, timeout=10))
    prom.wait_for("sum(winnow_requests_finished_total)", lambda v: v >= 2)
    time.sleep(2.5)  # a couple more scrapes after the last request

    live = {line.split("{")[0].split(" ")[0] for line in daemon.metrics_text().splitlines()
            if line and not line.startswith("#")}
    dash = json.loads(DASHBOARD.read_text())
    queries = []

    def walk(panels):
        for p in panels:
            queries.extend((p["title"], t["expr"]) for t in p.get("targets", []))
            walk(p.get("panels", []))

    walk(dash["panels"])
    assert len(queries) >= 20
    substitutions = {"$__rate_interval": "30s", "$job": ".*", "$instance": ".*"}
    for title, expr in queries:
        names = set(re.findall(r"\b(winnow_[a-z0-9_]+)\b", expr))
        assert names <= live, f"{title}: {sorted(names - live)} not in the live /metrics"
        promql = expr
        for var, value in substitutions.items():
            promql = promql.replace(var, value)
        assert "$" not in promql, f"{title}: unsubstituted variable in {expr}"
        result = prom.query(promql)
        assert result, f"panel {title!r}: no series for {promql}"
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            q = var["query"]["query"].replace("$job", ".*")
            # label_values(metric, label) is Grafana's; the series behind it must exist.
            metric = re.search(r"label_values\((.*),\s*(\w+)\)$", q)
            assert metric, q
            assert prom.query(metric.group(1)), q


def test_separate_metrics_port_serves_the_registry():
    """--metrics-port: a plaintext port with /metrics alone, the same registry as the HTTP port's.
    (It once could not start in the CUDA build: civetweb's thread stacks were too small.)"""
    port = free_port()
    with Daemon("--metrics-port", str(port)) as d:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
            text = r.read().decode()
        assert "winnow_serving" in text and "winnow_kv_blocks_capacity" in text
        assert f'listening grpc=127.0.0.1:{d.port}' in d.logs() and f"metrics=127.0.0.1:{port}" \
            in d.logs()
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5)
        assert err.value.code == 404


def test_the_charts_keda_query_evaluates_on_the_daemons_own_labels():
    """deploy/k8s's ScaledObject query selects on winnow_release, which the daemon exports
    itself (--metrics-labels, set by the chart's ConfigMap): it finds the daemon's series under
    a scrape configuration that adds no namespace or service label (this one adds none)."""
    import yaml
    docs = list(yaml.safe_load_all((REPO / "deploy" / "k8s" / "scaledobject.yaml").read_text()))
    (so,) = [d for d in docs if d and d["kind"] == "ScaledObject"]
    query = so["spec"]["triggers"][0]["metadata"]["query"]
    config = yaml.safe_load(yaml.safe_load((REPO / "deploy" / "k8s" / "configmap.yaml")
                                           .read_text())["data"]["winnow.yaml"])
    _binary("prometheus")
    with Daemon("--metrics-labels", config["metrics-labels"]) as daemon:
        prom = Prometheus(f"127.0.0.1:{daemon.metrics_port}")
        try:
            prom.wait_for('up{job="winnow"}', lambda v: v == 1)
            assert prom.wait_for(query, lambda v: v == 0, timeout=10) == 0
            # And only this release's series: another release's label finds nothing.
            assert prom.query(query.replace("winnow/", "other/")) == []
        finally:
            prom.stop()
