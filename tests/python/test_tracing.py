"""Tracing end to end: a live daemon exports spans over OTLP/HTTP to a receiver this test runs.

The receiver decodes each export with OTLP's own message definitions (opentelemetry-proto's
ExportTraceServiceRequest, strict: an unknown or misspelled field fails), after turning the
hex ids OTLP/JSON uses into the bytes the protobuf JSON mapping expects. The test sends
requests with a W3C traceparent over HTTP and gRPC and checks the spans: the request's span
continues the caller's, and queue, prefill (with cached tokens), compression (with the KV it
removed) and decode hang under it with the request's token counts. A collector that is down
costs spans (counted in /metrics), never requests.
"""

from __future__ import annotations

import base64
import http.server
import json
import threading
import time
import urllib.request

import grpc
import pytest

from daemon_harness import Daemon, free_port, pb2

pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2",
                    reason="opentelemetry-proto (tests/python/requirements.txt)")
from google.protobuf import json_format  # noqa: E402
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2  # noqa: E402

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
LONG_PROMPT = "Notes: " + " ".join(f"item {i} is blue." for i in range(60)) + " Summary:"


def _ids_to_base64(node):
    """OTLP/JSON writes trace and span ids as hex; protobuf's JSON mapping reads bytes as
    base64 (the one place where OTLP/JSON departs from it)."""
    if isinstance(node, list):
        return [_ids_to_base64(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key in ("traceId", "spanId", "parentSpanId") and isinstance(value, str):
            value = base64.b64encode(bytes.fromhex(value)).decode()
        out[key] = _ids_to_base64(value)
    return out


class Receiver:
    """An OTLP/HTTP receiver on loopback: POST /v1/traces, JSON only."""

    def __init__(self):
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.errors: list[str] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                try:
                    assert self.path == "/v1/traces", self.path
                    assert self.headers["Content-Type"] == "application/json"
                    message = json_format.Parse(json.dumps(_ids_to_base64(json.loads(body))),
                                                trace_service_pb2.ExportTraceServiceRequest())
                    with receiver.lock:
                        receiver.requests.append(message)
                    self.send_response(200)
                except Exception as e:  # noqa: BLE001 - reported by the test
                    with receiver.lock:
                        receiver.errors.append(f"{type(e).__name__}: {e}")
                    self.send_response(400)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def spans(self, trace_id: str) -> list:
        """(resource attributes, span) of every span received in this trace."""
        with self.lock:
            assert not self.errors, self.errors
            out = []
            for request in self.requests:
                for rs in request.resource_spans:
                    resource = {a.key: a.value.string_value for a in rs.resource.attributes}
                    for ss in rs.scope_spans:
                        out.extend((resource, s) for s in ss.spans
                                   if s.trace_id.hex() == trace_id)
            return out

    def wait_spans(self, trace_id: str, count: int, timeout: float = 15.0) -> list:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            spans = self.spans(trace_id)
            if len(spans) >= count:
                time.sleep(0.3)  # nothing more may arrive for it
                return self.spans(trace_id)
            time.sleep(0.05)
        raise AssertionError(f"{len(self.spans(trace_id))} of {count} spans of {trace_id}")


def attributes(span) -> dict:
    out = {}
    for a in span.attributes:
        kind = a.value.WhichOneof("value")
        out[a.key] = getattr(a.value, kind)
    return out


@pytest.fixture(scope="module")
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture(scope="module")
def daemon(receiver):
    with Daemon("--otlp-endpoint", receiver.url, "--otlp-service-name", "winnow-test") as d:
        yield d


def post_chat(daemon, body: dict, headers: dict) -> dict:
    req = urllib.request.Request(f"{daemon.http_url}/v1/chat/completions",
                                 data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **headers})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def by_name(spans) -> dict:
    out = {}
    for _, s in spans:
        out.setdefault(s.name, []).append(s)
    return out


def test_chat_request_spans_continue_the_callers_trace(daemon, receiver):
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    body = {"messages": [{"role": "user", "content": LONG_PROMPT}], "max_tokens": 6,
            "temperature": 0, "ignore_eos": True,
            "kv_compression": {"policy": "snapkv", "budget": 0.5, "params": {"window": 8}}}
    reply = post_chat(daemon, body, {"traceparent": f"00-{trace_id}-{PARENT_ID}-01",
                                     "tracestate": "vendor=opaque"})
    usage = reply["usage"]
    spans = receiver.wait_spans(trace_id, 5)
    names = by_name(spans)
    assert sorted(names) == ["POST /v1/chat/completions", "compression", "decode", "prefill",
                             "queue"], sorted(names)
    assert all(len(v) == 1 for v in names.values()), names
    resource = spans[0][0]
    assert resource["service.name"] == "winnow-test" and resource["service.version"]
    (request,) = names["POST /v1/chat/completions"]
    assert request.parent_span_id.hex() == PARENT_ID  # the caller's span
    assert request.kind == request.SPAN_KIND_SERVER
    assert request.trace_state == "vendor=opaque"
    a = attributes(request)
    assert a["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert a["gen_ai.usage.output_tokens"] == usage["completion_tokens"] == 6
    assert a["winnow.finish_reason"] == "length"
    assert a["winnow.compression.policy"] == "snapkv"
    assert a["gen_ai.request.model"] == reply["model"]

    for name in ("queue", "prefill", "compression", "decode"):
        (child,) = names[name]
        assert child.parent_span_id == request.span_id, name
        assert child.span_id != request.span_id
        assert request.start_time_unix_nano <= child.start_time_unix_nano, name
        assert child.start_time_unix_nano <= child.end_time_unix_nano, name
        assert child.end_time_unix_nano <= request.end_time_unix_nano, name
    queue, prefill = names["queue"][0], names["prefill"][0]
    compression, decode = names["compression"][0], names["decode"][0]
    assert queue.end_time_unix_nano <= prefill.start_time_unix_nano
    assert prefill.end_time_unix_nano <= decode.start_time_unix_nano
    # The prompt's compaction runs after its prefill's forward, before the first token.
    assert prefill.start_time_unix_nano <= compression.start_time_unix_nano
    assert compression.end_time_unix_nano <= prefill.end_time_unix_nano
    p = attributes(prefill)
    assert p["winnow.prompt.tokens"] == usage["prompt_tokens"]
    assert p["winnow.prompt.cached_tokens"] + p["winnow.prompt.computed_tokens"] == \
        usage["prompt_tokens"]
    c = attributes(compression)
    assert c["winnow.compression.policy"] == "snapkv"
    assert 0 < c["winnow.kv.slots_after"] < c["winnow.kv.slots_before"]
    assert p["winnow.kv.slots_evicted"] == c["winnow.kv.slots_before"] - c["winnow.kv.slots_after"]
    assert attributes(decode)["winnow.completion.tokens"] == 6
    # The request log line names the trace and the request's span.
    assert f'trace_id={trace_id}' in daemon.logs()
    assert f'span_id={request.span_id.hex()}' in daemon.logs()


def test_prefill_span_counts_cached_tokens(daemon, receiver):
    prompt = "Prefix cached: " + " ".join(f"line {i} says hello." for i in range(40))
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 2,
            "temperature": 0}
    ids = ["1" * 32, "2" * 32]
    for trace_id in ids:
        post_chat(daemon, body, {"traceparent": f"00-{trace_id}-{PARENT_ID}-01"})
    cached = []
    for trace_id in ids:
        (prefill,) = by_name(receiver.wait_spans(trace_id, 4))["prefill"]
        cached.append(attributes(prefill)["winnow.prompt.cached_tokens"])
    assert cached[0] == 0 and cached[1] > 0, cached


def test_grpc_samples_are_sibling_spans(daemon, receiver):
    trace_id = "5b8efff798038103d269b633813fc60c"
    request = daemon.client.build_request("Once upon a time", max_tokens=3, temperature=0.8,
                                          seed=7, n=2)
    responses = list(daemon.client.stub.Generate(
        request, metadata=[("traceparent", f"00-{trace_id}-{PARENT_ID}-01")], timeout=60))
    assert sum(1 for r in responses if r.finish_reason) == 2
    spans = by_name(receiver.wait_spans(trace_id, 8))
    samples = spans["winnow.v1.Inference/Generate"]
    assert len(samples) == 2
    assert {s.parent_span_id.hex() for s in samples} == {PARENT_ID}
    assert samples[0].span_id != samples[1].span_id
    # Each sample's queue, prefill and decode hang under its own request span.
    assert sorted(s.parent_span_id for s in spans["decode"]) == \
        sorted(s.span_id for s in samples)


def test_sampling_follows_the_callers_flag_and_roots_get_traces(daemon, receiver):
    unsampled = "6" * 32
    post_chat(daemon, {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
              {"traceparent": f"00-{unsampled}-{PARENT_ID}-00"})
    # No traceparent: the daemon starts a trace of its own (--trace-sample-ratio 1).
    post_chat(daemon, {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2,
                       "request_id": "root-trace"}, {})
    deadline = time.monotonic() + 15
    root = None
    while root is None and time.monotonic() < deadline:
        with receiver.lock:
            for request in receiver.requests:
                for rs in request.resource_spans:
                    for s in rs.scope_spans[0].spans:
                        if attributes(s).get("winnow.request_id") == "root-trace":
                            root = s
        time.sleep(0.05)
    assert root is not None
    assert root.parent_span_id == b""  # a root span
    assert receiver.spans(unsampled) == []
    assert daemon.metric("winnow_trace_spans_exported_total") > 0
    assert daemon.metric("winnow_trace_spans_dropped_total", {"reason": "export_failed"}) == 0


def test_a_collector_that_is_down_costs_spans_not_requests():
    with Daemon("--otlp-endpoint", f"http://127.0.0.1:{free_port()}") as d:
        for i in range(3):
            text, _, final = d.client.generate_text(f"Count {i}:", max_tokens=3)
            assert final.usage.completion_tokens == 3
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if d.metric("winnow_trace_spans_dropped_total", {"reason": "export_failed"}) >= 12:
                break
            time.sleep(0.2)
        assert d.metric("winnow_trace_spans_dropped_total", {"reason": "export_failed"}) >= 12
        assert d.metric("winnow_trace_spans_exported_total") == 0
        assert "took no spans" in d.logs()


def test_bad_endpoint_stops_the_start():
    d = Daemon("--otlp-endpoint", "collector:4318", wait=False)
    try:
        assert d.wait_exit(timeout=30) == 2
        assert "--otlp-endpoint" in d.logs()
    finally:
        d.stop()
