"""End-to-end tests of `winnow serve` over gRPC on loopback, with the real model.

Kept small for a 2-core machine: short generations, a handful of daemon start-ups.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import math
import pathlib
import signal
import tempfile
import threading
import time

import grpc
import pytest

from daemon_harness import TIME_SCALE, Daemon, WinnowClient, binary_path, model_path, pb2



@pytest.fixture(autouse=True, scope="module")
def _binary_and_model():
    # Like conftest.py's fixtures: a missing build or model is a failure, not a skip.
    if not binary_path().exists():
        pytest.fail(f"winnow binary not found at {binary_path()}; run `make build` "
                    "(or set WINNOW_BIN)")
    if not model_path().exists():
        pytest.fail(f"model not found at {model_path()}; run `make model` (or set WINNOW_MODEL)")

WORDS = ("the quick brown fox jumps over the lazy dog while a paged cache keeps every layer of "
         "keys and values in small blocks so that many requests can share one pool ").split()


def make_prompt(n_words: int, salt: int) -> str:
    words = [WORDS[(i * 7 + salt) % len(WORDS)] for i in range(n_words)]
    return f"Story {salt}: " + " ".join(words)


# Mixed lengths: short ones decode while long ones are still being prefilled in chunks.
PROMPT_WORDS = [2, 5, 9, 14, 20, 28, 36, 48, 60, 75, 90, 110, 130, 150, 4, 170]


def greedy(client: WinnowClient, prompt: str, max_tokens: int, **kwargs):
    text, ids, final = client.generate_text(prompt, max_tokens=max_tokens, temperature=0.0,
                                            ignore_eos=True, timeout=120, **kwargs)
    return text, ids, final


@pytest.fixture(scope="module")
def daemon():
    # A small token budget splits the long prompts into several prefill chunks.
    with Daemon("--max-batched-tokens", "64", "--max-prompt-tokens", "512") as d:
        yield d


# ------------------------------------------------------------------------------------------
# Batching correctness


def test_concurrent_streams_match_solo(daemon):
    prompts = [make_prompt(n, i) for i, n in enumerate(PROMPT_WORDS)]
    max_tokens = 6
    solo = [greedy(daemon.client, p, max_tokens)[1] for p in prompts]

    barrier = threading.Barrier(len(prompts))

    def run(p):
        client = WinnowClient(daemon.target)
        try:
            barrier.wait()
            return greedy(client, p, max_tokens)
        finally:
            client.close()

    with cf.ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(run, prompts))
    for i, (text, ids, final) in enumerate(results):
        assert ids == solo[i], f"prompt {i} ({PROMPT_WORDS[i]} words) diverged under batching"
        assert final.finish_reason == pb2.FINISH_REASON_LENGTH
        assert final.usage.completion_tokens == max_tokens
        assert final.usage.prompt_tokens > 0
        assert final.usage.kv_blocks_peak > 0
        assert len(final.usage.kv_tokens_per_layer) == daemon.client.model_info().num_layers
        # Text deltas concatenate to the detokenized ids (no stop strings here).
        assert text == daemon.client.detokenize(ids)
    daemon.wait_pool_free()
    assert daemon.metric("winnow_iteration_sequences_count") > 0


# ------------------------------------------------------------------------------------------
# Cancellation and deadlines free the pool


def test_cancel_mid_stream_frees_pool(daemon):
    before = daemon.metric("winnow_requests_finished_total", {"reason": "cancelled"})
    call = daemon.client.generate(make_prompt(30, 99), max_tokens=400, ignore_eos=True,
                                  timeout=120)
    got = 0
    for msg in call:
        got += len(msg.token_ids)
        if got >= 3:
            break
    call.cancel()
    daemon.wait_pool_free()
    assert daemon.metric("winnow_kv_blocks_used") == 0
    assert daemon.metric("winnow_requests_running") == 0
    assert daemon.metric("winnow_requests_finished_total", {"reason": "cancelled"}) == before + 1


def test_expired_deadline_frees_pool(daemon):
    before = (daemon.metric("winnow_requests_finished_total", {"reason": "cancelled"}) +
              daemon.metric("winnow_requests_finished_total", {"reason": "deadline"}))
    with pytest.raises(grpc.RpcError) as err:
        for _ in daemon.client.generate(make_prompt(30, 98), max_tokens=400, ignore_eos=True,
                                        timeout=0.5):
            pass
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    daemon.wait_pool_free()
    assert daemon.metric("winnow_kv_blocks_used") == 0
    after = (daemon.metric("winnow_requests_finished_total", {"reason": "cancelled"}) +
             daemon.metric("winnow_requests_finished_total", {"reason": "deadline"}))
    assert after == before + 1


# ------------------------------------------------------------------------------------------
# Validation


def _request(**kwargs):
    return WinnowClient.build_request(**kwargs)


def _bad_requests(info):
    hidden = info.hidden_size
    vocab = info.vocab_size
    wrong_width = pb2.GenerateRequest()
    seg = wrong_width.segments.segments.add()
    seg.embedding.modality = "image"
    seg.embedding.rows = 2
    seg.embedding.values.extend([0.0] * (2 * hidden - 3))
    wrong_width.segments.segments.add().text.text = "Describe the image."
    nan_temp = _request(prompt="hello", max_tokens=4)
    nan_temp.sampling.temperature = math.nan
    bad_policy = _request(prompt="hello", max_tokens=4)
    bad_policy.compression.policy = "snapkv-typo"
    bad_budget = _request(prompt="hello", max_tokens=4)
    bad_budget.compression.budget = -1.0
    zero_max = _request(prompt="hello")
    zero_max.stopping.max_tokens = 0
    return [
        ("empty prompt", _request(prompt=""), grpc.StatusCode.INVALID_ARGUMENT, "prompt"),
        ("no input", pb2.GenerateRequest(), grpc.StatusCode.INVALID_ARGUMENT, "input"),
        ("unknown token id", _request(token_ids=[1, vocab + 5], max_tokens=4),
         grpc.StatusCode.INVALID_ARGUMENT, "token_ids.ids[1]"),
        ("negative token id", _request(token_ids=[-3], max_tokens=4),
         grpc.StatusCode.INVALID_ARGUMENT, "token_ids.ids[0]"),
        ("oversize prompt", _request(prompt=make_prompt(700, 1), max_tokens=4),
         grpc.StatusCode.INVALID_ARGUMENT, "--max-prompt-tokens"),
        ("wrong embedding width", wrong_width, grpc.StatusCode.INVALID_ARGUMENT,
         "segments[0].embedding.values"),
        ("max_tokens 0", zero_max, grpc.StatusCode.INVALID_ARGUMENT, "stopping.max_tokens"),
        ("max_tokens over limit", _request(prompt="hello", max_tokens=10**6),
         grpc.StatusCode.INVALID_ARGUMENT, "--max-tokens-limit"),
        ("NaN temperature", nan_temp, grpc.StatusCode.INVALID_ARGUMENT, "sampling.temperature"),
        ("unknown policy", bad_policy, grpc.StatusCode.INVALID_ARGUMENT, "compression.policy"),
        ("negative budget", bad_budget, grpc.StatusCode.INVALID_ARGUMENT, "compression.budget"),
        ("bad stop token", _request(prompt="hello", max_tokens=4, stop_token_ids=[vocab]),
         grpc.StatusCode.INVALID_ARGUMENT, "stopping.stop_token_ids[0]"),
        ("empty stop string", _request(prompt="hello", max_tokens=4, stop=[""]),
         grpc.StatusCode.INVALID_ARGUMENT, "stopping.stop[0]"),
        ("too many top_logprobs", _request(prompt="hello", max_tokens=4, top_logprobs=50),
         grpc.StatusCode.INVALID_ARGUMENT, "top_logprobs"),
        ("n over 16", _request(prompt="hello", max_tokens=4, n=17),
         grpc.StatusCode.INVALID_ARGUMENT, "n: must be in [0, 16], got 17"),
        ("negative n", _request(prompt="hello", max_tokens=4, n=-1),
         grpc.StatusCode.INVALID_ARGUMENT, "n: must be in [0, 16], got -1"),
    ]


def test_bad_inputs_are_rejected_and_daemon_keeps_serving(daemon):
    info = daemon.client.model_info()
    for name, req, code, needle in _bad_requests(info):
        with pytest.raises(grpc.RpcError) as err:
            list(daemon.client.generate(request=req, timeout=30))
        assert err.value.code() == code, f"{name}: {err.value.code()} {err.value.details()}"
        assert needle in err.value.details(), f"{name}: {err.value.details()!r}"
    _, ids, final = greedy(daemon.client, "Still alive?", 3)
    assert len(ids) == 3 and final.finish_reason == pb2.FINISH_REASON_LENGTH
    assert daemon.metric("winnow_requests_rejected_total", {"code": "INVALID_ARGUMENT"}) >= 10
    daemon.wait_pool_free()


def test_detokenize_rejects_unknown_ids(daemon):
    with pytest.raises(grpc.RpcError) as err:
        daemon.client.detokenize([1, 10**7])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "token_ids[1]" in err.value.details()


# ------------------------------------------------------------------------------------------
# Introspection, health, reflection, metrics


def test_tokenize_model_info_status(daemon):
    info = daemon.client.model_info()
    assert info.architecture in ("llama", "qwen2")
    assert info.num_layers > 0 and info.num_kv_heads > 0 and info.vocab_size > 0
    assert info.block_size == 16
    # The default KV cache dtype is f16: 2 bytes a value.
    assert info.kv_cache_dtype == "f16"
    # K and V at f16, and the CPU pool's logit bias (a float per layer and KV head).
    assert info.kv_bytes_per_token == (info.num_layers * 2 * info.num_kv_heads * info.head_dim * 2
                                       + info.num_layers * info.num_kv_heads * 4)
    ids = daemon.client.tokenize("Hello world", add_special_tokens=False)
    assert ids and daemon.client.detokenize(ids) == "Hello world"
    st = daemon.client.server_status()
    assert st.serving and not st.draining
    assert st.kv_cache_dtype == "f16"
    assert st.kv_blocks_total > 0 and st.limits.max_batched_tokens == 64
    assert st.limits.max_prompt_tokens == 512


def test_chat_and_segments_and_logprobs(daemon):
    text, ids, final = daemon.client.generate_text(
        chat=[("user", "Say hi")], max_tokens=4, timeout=60)
    assert final.usage.prompt_tokens > 5 and len(ids) <= 4
    req = pb2.GenerateRequest(logprobs=True, top_logprobs=3)
    req.segments.segments.add().context.text = "Document: caches hold keys and values."
    req.segments.segments.add().text.text = " Question: what do caches hold?"
    req.stopping.max_tokens = 3
    req.stopping.ignore_eos = True
    msgs = list(daemon.client.generate(request=req, timeout=60))
    lps = [lp for m in msgs for lp in m.logprobs]
    toks = [t for m in msgs for t in m.token_ids]
    assert len(lps) == len(toks) == 3
    assert all(len(lp.top) == 3 and lp.logprob <= 0 for lp in lps)
    # Greedy picks the most likely token.
    assert all(lp.token_id == lp.top[0].token_id for lp in lps)


def test_stop_string_trims_and_stops(daemon):
    prompt = "List the days of the week: Monday, Tuesday,"
    text, ids, _ = greedy(daemon.client, prompt, 12)
    words = text.split()
    assert len(words) >= 3, text
    stop = words[2]
    cut = text.index(stop)
    text2, _, final = greedy(daemon.client, prompt, 12, stop=[stop])
    assert final.finish_reason == pb2.FINISH_REASON_STOP
    assert text2 == text[:cut]
    daemon.wait_pool_free()


def test_health_and_reflection(daemon):
    assert daemon.client.health() == "SERVING"
    assert daemon.client.health("winnow.v1.Inference") == "SERVING"
    # ServerReflectionRequest{list_services: ""} encoded by hand (field 7, length 0).
    call = daemon.client.channel.stream_stream(
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
    responses = list(call(iter([b"\x3a\x00"]), timeout=10))
    assert any(b"winnow.v1.Inference" in r for r in responses)


REQUIRED_METRICS = [
    "winnow_requests_running", "winnow_requests_waiting", "winnow_kv_blocks_capacity",
    "winnow_kv_blocks_used", "winnow_kv_cache_usage_ratio", "winnow_prompt_tokens_total",
    "winnow_generation_tokens_total", "winnow_preemptions_total",
    "winnow_requests_finished_total",
]
REQUIRED_HISTOGRAMS = [
    "winnow_time_to_first_token_seconds", "winnow_inter_token_latency_seconds",
    "winnow_e2e_request_latency_seconds", "winnow_request_queue_time_seconds",
    "winnow_request_prompt_tokens", "winnow_request_generation_tokens",
    "winnow_iteration_tokens", "winnow_iteration_sequences",
]


def test_metrics_parse_and_hold_every_metric(daemon):
    from prometheus_client.parser import text_string_to_metric_families

    greedy(daemon.client, "Count to three:", 3)
    families = list(text_string_to_metric_families(daemon.metrics_text()))
    samples = {s.name: s for f in families for s in f.samples}
    types = {f.name: f.type for f in families}
    for name in REQUIRED_METRICS:
        assert name in samples, name
    for name in REQUIRED_HISTOGRAMS:
        assert types.get(name) == "histogram", name
        for suffix in ("_bucket", "_sum", "_count"):
            assert name + suffix in samples, name + suffix
        assert samples[name + "_count"].value > 0, name
    reasons = {s.labels.get("reason") for f in families for s in f.samples
               if s.name == "winnow_requests_finished_total"}
    assert {"stop", "length", "cancelled", "error"} <= reasons
    assert samples["winnow_kv_blocks_capacity"].value > 0
    assert 0.0 <= samples["winnow_kv_cache_usage_ratio"].value <= 1.0
    assert samples["winnow_prompt_tokens_total"].value > 0
    assert samples["winnow_generation_tokens_total"].value >= 3


# ------------------------------------------------------------------------------------------
# A pool too small for everyone: preemption by recompute


def test_tiny_pool_preempts_and_outputs_match():
    # SmolLM2-135M: 30 layers. Each request below needs ~4 blocks per layer (120 blocks) at its
    # peak; 300 blocks hold two of them, so six at once must preempt.
    with Daemon("--kv-blocks", "300", "--max-batched-tokens", "128") as d:
        prompts = [make_prompt(28 + 2 * i, 50 + i) for i in range(6)]
        max_tokens = 24
        solo = [greedy(d.client, p, max_tokens)[1] for p in prompts]
        assert d.metric("winnow_preemptions_total") == 0

        def run(p):
            client = WinnowClient(d.target)
            try:
                return greedy(client, p, max_tokens)
            finally:
                client.close()

        with cf.ThreadPoolExecutor(len(prompts)) as pool:
            results = list(pool.map(run, prompts))
        for i, (_, ids, final) in enumerate(results):
            assert ids == solo[i], f"prompt {i} diverged after preemption"
            assert final.finish_reason == pb2.FINISH_REASON_LENGTH
        assert d.metric("winnow_preemptions_total") > 0
        assert d.client.server_status().preemptions_total > 0
        assert sum(f.usage.preemptions for _, _, f in results) > 0
        d.wait_pool_free()

        # A request that can never fit the pool fails at once, with the numbers.
        with pytest.raises(grpc.RpcError) as err:
            list(d.client.generate(make_prompt(20, 3), max_tokens=1000, timeout=30))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "KV blocks" in err.value.details()
        # So does one beyond the model's context, and the daemon keeps serving.
        context = d.client.model_info().context_length
        with pytest.raises(grpc.RpcError) as err:
            list(d.client.generate(token_ids=[200] * (context - 4), max_tokens=8, timeout=30))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "context" in err.value.details()
        assert len(greedy(d.client, "Still serving?", 3)[1]) == 3
        d.wait_pool_free()


# ------------------------------------------------------------------------------------------
# Start-up and drain


def test_not_serving_while_loading():
    d = Daemon(wait=False)
    try:
        # The gRPC server is up well before the model has loaded: the first answer the health
        # service gives must be NOT_SERVING, and Generate must be UNAVAILABLE meanwhile.
        first = None
        deadline = time.monotonic() + 30
        while first is None and time.monotonic() < deadline:
            # A fresh channel per try: a channel that saw "connection refused" backs off for
            # about a second, longer than the load takes.
            probe = WinnowClient(d.target)
            try:
                first = probe.health(timeout=0.5)
            except grpc.RpcError:
                time.sleep(0.005)
            finally:
                probe.close()
        assert first == "NOT_SERVING"
        try:
            probe = WinnowClient(d.target)
            list(probe.generate("too early", max_tokens=2, timeout=5))
            early = None
        except grpc.RpcError as e:
            early = e
        finally:
            probe.close()
        if early is not None:  # the load may have finished in between
            assert early.code() == grpc.StatusCode.UNAVAILABLE
            assert "loading" in early.details()
        d.wait_serving()
        assert d.metric("winnow_serving") == 1
    finally:
        d.stop()


def _stream_in_thread(target, prompt, max_tokens, results, idx, first_token):
    client = WinnowClient(target)
    try:
        msgs = []
        try:
            for m in client.generate(prompt, max_tokens=max_tokens, ignore_eos=True,
                                     timeout=120):
                msgs.append(m)
                if m.token_ids:
                    first_token[idx].set()
            results[idx] = ("ok", msgs)
        except grpc.RpcError as e:
            results[idx] = (e.code(), msgs)
    finally:
        first_token[idx].set()
        client.close()


def _wait_for(predicate, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not reached in {timeout}s"
        time.sleep(0.02)


def test_full_queue_is_refused_and_sigterm_finishes_every_accepted_request():
    # Two run and three wait: the queue is full. SIGTERM then must finish all five, the three
    # that never started included, within the drain timeout.
    drain = 60 * TIME_SCALE
    d = Daemon("--drain-timeout", str(int(drain)), "--max-seqs", "2", "--max-queue", "3")
    try:
        # Requests not yet admitted count against the queue, so the two long ones go first.
        lengths = [128, 128, 24, 24, 24]
        n = len(lengths)
        results = [None] * n
        first = [threading.Event() for _ in range(n)]
        threads = [threading.Thread(target=_stream_in_thread,
                                    args=(d.target, make_prompt(10 + i, i), lengths[i], results,
                                          i, first))
                   for i in range(n)]

        def status_is(running, waiting):
            st = d.client.server_status()
            return st.running == running and st.waiting == waiting

        for t in threads[:2]:
            t.start()
        _wait_for(lambda: status_is(2, 0), what="2 running")
        for t in threads[2:]:
            t.start()
        _wait_for(lambda: status_is(2, 3), what="2 running, 3 waiting")

        refused = d.metric("winnow_requests_rejected_total", {"code": "RESOURCE_EXHAUSTED"})
        with pytest.raises(grpc.RpcError) as err:
            list(d.client.generate("one too many", max_tokens=2, timeout=10))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "queue is full" in err.value.details()
        assert d.metric("winnow_requests_rejected_total",
                        {"code": "RESOURCE_EXHAUSTED"}) == refused + 1

        d.signal(signal.SIGTERM)
        # Health flips first; new work is refused while the accepted requests finish.
        _wait_for(lambda: d.client.health() == "NOT_SERVING", timeout=5, what="NOT_SERVING")
        with pytest.raises(grpc.RpcError) as err:
            list(d.client.generate("late request", max_tokens=2, timeout=10))
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        st = d.client.server_status()
        assert st.draining and st.waiting > 0, "nothing was left waiting when the drain began"
        for t in threads:
            t.join(2 * drain)
        for (status, msgs), max_tokens in zip(results, lengths):
            assert status == "ok"
            assert msgs[-1].finish_reason == pb2.FINISH_REASON_LENGTH
            assert sum(len(m.token_ids) for m in msgs) == max_tokens
        assert d.wait_exit(drain) == 0
        assert "stopped drained=true" in d.logs()
    finally:
        d.stop()


def test_drain_timeout_cancels_and_exits_zero():
    d = Daemon("--drain-timeout", "300ms")
    try:
        results = [None]
        first = [threading.Event()]
        t = threading.Thread(target=_stream_in_thread,
                             args=(d.target, make_prompt(10, 7), 3000, results, 0, first))
        t.start()
        assert first[0].wait(60)
        start = time.monotonic()
        d.signal(signal.SIGTERM)
        assert d.wait_exit(30) == 0
        assert time.monotonic() - start < 15
        t.join(30)
        status, msgs = results[0]
        assert status == grpc.StatusCode.UNAVAILABLE
        assert msgs and msgs[-1].finish_reason == pb2.FINISH_REASON_CANCELLED
        assert "drained=false" in d.logs()
    finally:
        d.stop()


def test_lost_device_ends_requests_turns_health_off_and_exits_three():
    # --inject-fatal-error-at: the third forward reports a lost device, as a sticky CUDA error
    # would. The stream in flight ends with an error and the process exits 3 (server/daemon.h,
    # kExitDeviceLost) for its supervisor to restart it.
    d = Daemon("--inject-fatal-error-at", "3")
    try:
        results = [None]
        t = threading.Thread(target=_stream_in_thread,
                             args=(d.target, make_prompt(10, 7), 200, results, 0,
                                   [threading.Event()]))
        t.start()
        assert d.wait_exit(30) == 3
        t.join(30)
        status, msgs = results[0]
        assert status != grpc.StatusCode.OK
        assert msgs and msgs[-1].finish_reason == pb2.FINISH_REASON_ERROR
        logs = d.logs()
        assert "device lost; exiting for a restart" in logs
        assert "injected fault: the device was lost" in logs
    finally:
        d.stop()


# ------------------------------------------------------------------------------------------
# Configuration precedence and JSON logs


def test_config_env_flag_precedence_and_json_logs():
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write("max_seqs: 3\nmax-queue: 7\nmax-batched-tokens: 100\nlog-format: text\n")
        config = f.name
    env = {"WINNOW_MAX_QUEUE": "9", "WINNOW_MAX_BATCHED_TOKENS": "200",
           "WINNOW_LOG_FORMAT": "json", "WINNOW_CONFIG": config}
    with Daemon("--max-batched-tokens", "300", env=env) as d:
        limits = d.client.server_status().limits
        assert limits.max_seqs == 3  # config
        assert limits.max_queue == 9  # env over config
        assert limits.max_batched_tokens == 300  # flag over env
        greedy(d.client, "JSON please", 2, request_id="json-test-1")
        time.sleep(0.2)
        lines = [json.loads(line) for line in d.logs().splitlines() if line.startswith("{")]
        assert lines and all("ts" in x and "level" in x and "msg" in x for x in lines)
        finished = [x for x in lines if x["msg"] == "request finished"]
        assert any(x["request_id"] == "json-test-1" and x["completion_tokens"] == 2
                   for x in finished)
    pathlib.Path(config).unlink()


def test_bad_flags_fail_fast():
    import subprocess

    for args, needle in [(["--max-seqs", "zero"], "--max-seqs"),
                         (["--no-such-flag", "1"], "unknown flag"),
                         (["--log-format", "xml"], "--log-format")]:
        p = subprocess.run([str(binary_path()), "serve", *args], capture_output=True, text=True,
                           timeout=30)
        assert p.returncode == 2 and needle in p.stderr, p.stderr


# ------------------------------------------------------------------------------------------
# Prefix caching


def test_prefix_cache_reuses_a_shared_prefix_and_salts_isolate(daemon):
    system = make_prompt(120, 77)  # well over a few 16-token blocks

    def run(question: str, salt: str = ""):
        req = daemon.client.build_request(system + " " + question, max_tokens=4,
                                          temperature=0.0, ignore_eos=True)
        req.cache_salt = salt
        return daemon.client.generate_text(request=req, timeout=120)

    text_a, ids_a, first = run("Who jumps?", salt="x")
    assert first.usage.cached_prompt_tokens == 0
    _, _, same_salt = run("Who sleeps?", salt="x")
    assert same_salt.usage.cached_prompt_tokens >= 96
    assert same_salt.usage.cached_prompt_tokens % 16 == 0
    _, _, other_salt = run("Who sleeps?", salt="y")
    assert other_salt.usage.cached_prompt_tokens == 0
    # A hit changes nothing the client sees but the usage.
    _, ids_again, again = run("Who jumps?", salt="x")
    assert again.usage.cached_prompt_tokens > 0
    assert ids_again == ids_a


# ------------------------------------------------------------------------------------------
# Samples (GenerateRequest.n)


def _samples(client, request):
    """Token ids and the final message of each sample of one Generate call, by index."""
    tokens, finals = {}, {}
    for msg in client.generate(request=request, timeout=120):
        assert msg.index not in finals, "a message after its sample's final one"
        tokens.setdefault(msg.index, []).extend(msg.token_ids)
        if msg.finish_reason != pb2.FINISH_REASON_UNSPECIFIED:
            finals[msg.index] = msg
    return tokens, finals


def test_n_samples_share_the_prompt_and_each_is_its_seeds_request(daemon):
    prompt = make_prompt(100, 55)
    kwargs = dict(max_tokens=6, temperature=1.0, ignore_eos=True)
    req = daemon.client.build_request(prompt, seed=1234, n=4, cache_salt="samples", **kwargs)
    tokens, finals = _samples(daemon.client, req)
    assert sorted(finals) == [0, 1, 2, 3]
    assert all(len(tokens[i]) == 6 for i in range(4))
    assert len({tuple(t) for t in tokens.values()}) == 4, tokens
    # The prompt is computed once: the other samples attach its blocks.
    assert finals[0].usage.cached_prompt_tokens == 0
    assert all(finals[i].usage.cached_prompt_tokens >= 96 for i in (1, 2, 3))
    # Sample i is the request with seed + i, alone.
    for i in range(4):
        _, ids, _ = daemon.client.generate_text(prompt, seed=1234 + i, timeout=120, **kwargs)
        assert ids == tokens[i], i
    daemon.wait_pool_free()
    assert daemon.metric("winnow_kv_blocks_used") == 0


def test_cancelling_n_samples_frees_every_one(daemon):
    req = daemon.client.build_request(make_prompt(40, 56), max_tokens=400, ignore_eos=True,
                                      temperature=1.0, n=3)
    call = daemon.client.generate(request=req, timeout=120)
    seen = set()
    for msg in call:
        seen.add(msg.index)
        if len(seen) == 3:
            break
    call.cancel()
    daemon.wait_pool_free()
    assert daemon.metric("winnow_kv_blocks_used") == 0
    assert daemon.metric("winnow_requests_running") == 0
