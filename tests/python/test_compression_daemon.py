"""KV compression through a live daemon: validation errors name the field, a compressed
request frees blocks that a waiting request then uses, usage and metrics report it."""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time

import grpc
import pytest

from daemon_harness import Daemon, WinnowClient, binary_path, model_path, pb2

LAYERS = 30  # SmolLM2-135M


@pytest.fixture(autouse=True, scope="module")
def _binary_and_model():
    if not binary_path().exists():
        pytest.fail(f"winnow binary not found at {binary_path()}; run `make build`")
    if not model_path().exists():
        pytest.fail(f"model not found at {model_path()}; run `make model`")


def token_prompt(n: int, seed: int) -> list[int]:
    return [200 + (seed * 7919 + i * 104729) % 20000 for i in range(n)]


def request(ids, max_tokens, policy="", budget=0.0, params=None, options=None):
    req = WinnowClient.build_request(token_ids=ids, max_tokens=max_tokens, ignore_eos=True)
    req.compression.policy = policy
    req.compression.budget = budget
    for k, v in (params or {}).items():
        req.compression.params[k] = v
    for k, v in (options or {}).items():
        req.compression.options[k] = v
    return req


def run(target, req, done_at, key, first_at=None):
    client = WinnowClient(target)
    try:
        ids, final = [], None
        for msg in client.generate(request=req, timeout=300):
            if first_at is not None and msg.token_ids and key not in first_at:
                first_at[key] = time.monotonic()
            ids.extend(msg.token_ids)
            if msg.finish_reason:
                final = msg
        done_at[key] = time.monotonic()
        return ids, final
    finally:
        client.close()


@pytest.fixture(scope="module")
def daemon():
    # 20 blocks of 16 tokens per layer: one 240-token prompt fills 15 of them.
    with Daemon("--kv-blocks", str(20 * LAYERS), "--block-size", "16") as d:
        yield d


@pytest.mark.parametrize("policy,budget,params,field", [
    ("lz77", 0.5, {}, "compression.policy"),
    ("snapkv", 0.0, {}, "compression.budget"),
    ("snapkv", 1.5, {}, "compression.budget"),
    ("h2o", -0.5, {}, "compression.budget"),
    ("snapkv", 0.5, {"windw": 8}, "compression.params.windw"),
    ("none", 0.5, {}, "compression.budget"),
])
def test_bad_compression_is_invalid_argument(daemon, policy, budget, params, field):
    with pytest.raises(grpc.RpcError) as err:
        list(daemon.client.generate(request=request(token_prompt(20, 1), 4, policy, budget,
                                                    params), timeout=30))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in err.value.details()


def test_string_options_reach_the_policy(daemon):
    with pytest.raises(grpc.RpcError) as err:
        list(daemon.client.generate(request=request(token_prompt(20, 1), 4, "snapkv", 0.5,
                                                    options={"pooling": "median"}), timeout=30))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "compression.options.pooling" in err.value.details()
    _, ids, final = daemon.client.generate_text(
        request=request(token_prompt(64, 2), 4, "snapkv", 0.5, {"window": 8},
                        {"pooling": "max"}), timeout=60)
    assert len(ids) == 4
    assert list(final.usage.kv_tokens_kept_per_layer) == [32] * LAYERS


def test_compression_time_is_a_histogram_of_compressing_iterations(daemon):
    # winnow_iteration_compression_seconds observes only iterations whose hooks ran: a plain
    # request adds nothing, a compressed one adds at least its prefill compression.
    def count():
        return daemon.metric("winnow_iteration_compression_seconds_count") or 0.0

    before = count()
    daemon.client.generate_text(request=request(token_prompt(64, 3), 2), timeout=60)
    assert count() == before
    _, _, final = daemon.client.generate_text(
        request=request(token_prompt(64, 4), 2, "snapkv", 0.5), timeout=60)
    assert final.usage.kv_blocks_freed_by_compression > 0
    assert count() > before
    assert daemon.metric("winnow_iteration_compression_seconds_sum") > 0
    daemon.wait_pool_free()


def xkv_kept(daemon, seed, category):
    """kv_tokens_kept_per_layer of an xkv request in profile mode (warmup 1, then reuse)."""
    req = request(token_prompt(96, seed), 4, "xkv", 0.5,
                  {"category": category, "profile_warmup": 1, "profile_rate": 0},
                  {"mode": "profile"})
    _, ids, final = daemon.client.generate_text(request=req, timeout=60)
    assert len(ids) == 4
    assert final.usage.kv_blocks_freed_by_compression > 0
    return list(final.usage.kv_tokens_kept_per_layer)


def test_params_are_numbers_end_to_end(daemon):
    # Params used to reach the policy as text with six significant digits: 1048576 became
    # "1.04858e+06" and was refused as "not an integer".
    big = 1048576
    first = xkv_kept(daemon, 11, big)  # profiled: the category's allocation is recorded
    # Another prompt of the same category reuses the recorded per-layer allocation...
    assert xkv_kept(daemon, 12, big) == first
    # ...and the next category, the same number to six digits, is a different one: that prompt
    # gets its own allocation.
    own = xkv_kept(daemon, 12, big + 1)
    assert own != first
    with pytest.raises(grpc.RpcError) as err:
        list(daemon.client.generate(request=request(token_prompt(20, 1), 4, "xkv", 0.5,
                                                    {"category": 2.5}), timeout=30))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "compression.params.category: 2.5 is not an integer" in err.value.details()
    daemon.wait_pool_free()


@pytest.mark.parametrize("compress", [True, False])
def test_freed_blocks_admit_a_waiting_request(daemon, compress):
    before = daemon.metric("winnow_kv_blocks_reclaimed_total", {"policy": "snapkv"}) \
        if compress else 0.0
    a = request(token_prompt(240, 1), 60, "snapkv" if compress else "", 0.2 if compress else 0)
    b = request(token_prompt(240, 2), 4)
    done_at, first_at = {}, {}
    with cf.ThreadPoolExecutor(2) as pool:
        fa = pool.submit(run, daemon.target, a, done_at, "a")
        time.sleep(0.2)  # A is admitted first
        fb = pool.submit(run, daemon.target, b, done_at, "b", first_at)
        (_, final_a), (_, final_b) = fa.result(), fb.result()
    assert final_a.usage.completion_tokens == 60
    assert final_b.usage.completion_tokens == 4
    if compress:
        # B (prefill 15 blocks per layer) only fits once A's compaction freed its blocks, and
        # then runs while A is still decoding: its first token comes well before A's last (its
        # last one too on a quiet machine; on a loaded one the two can end close together).
        assert first_at["b"] < done_at["a"]
        assert final_a.usage.kv_blocks_freed_by_compression >= LAYERS * 12
        assert list(final_a.usage.kv_tokens_kept_per_layer) == [48] * LAYERS
        assert final_a.usage.kv_tokens_evicted == LAYERS * (240 - 48)
        after = daemon.metric("winnow_kv_blocks_reclaimed_total", {"policy": "snapkv"})
        assert after - before >= LAYERS * 12
        assert daemon.metric("winnow_kv_kept_ratio_count", {"policy": "snapkv"}) >= 1
        assert daemon.metric("winnow_kv_tokens_evicted_total", {"policy": "snapkv"}) > 0
    else:
        assert done_at["b"] > done_at["a"]
        assert final_a.usage.kv_blocks_freed_by_compression == 0
    daemon.wait_pool_free()


def test_context_segments_are_compressed_and_text_is_kept(daemon):
    tok = daemon.client.tokenize
    req = WinnowClient.build_request(max_tokens=4, ignore_eos=True)
    req.segments.segments.add().text.text = "Read the document, then answer."
    doc = " ".join(f"Item {i} is worth {i * 7}." for i in range(12))
    req.segments.segments.add().context.text = doc
    req.segments.segments.add().text.text = "What is the value of item 3?"
    req.compression.policy = "snapkv"
    req.compression.budget = 0.25
    _, ids, final = daemon.client.generate_text(request=req, timeout=60)
    assert len(ids) == 4
    assert final.usage.kv_blocks_freed_by_compression > 0
    kept = list(final.usage.kv_tokens_kept_per_layer)
    assert len(kept) == LAYERS
    assert all(k <= final.usage.prompt_tokens // 4 for k in kept)
    assert tok(doc, add_special_tokens=False)  # the context really was tokens
    daemon.wait_pool_free()


def test_composite_and_its_presets_compress_through_the_daemon(daemon):
    # 240 tokens at budget 0.25: 60 slots per layer on average, 1,800 in all.
    _, ids, final = daemon.client.generate_text(
        request=request(token_prompt(240, 3), 4, "winnowkv", 0.25), timeout=60)
    assert len(ids) == 4
    kept = list(final.usage.kv_tokens_kept_per_layer)
    assert len(kept) == LAYERS and sum(kept) <= LAYERS * 60, kept
    assert final.usage.kv_blocks_freed_by_compression > 0
    # The document preset: every row's attention and the value norms, read from the live pool.
    _, ids, final = daemon.client.generate_text(
        request=request(token_prompt(240, 5), 4, "winnowkv_docs", 0.25), timeout=60)
    assert len(ids) == 4
    kept = list(final.usage.kv_tokens_kept_per_layer)
    assert len(kept) == LAYERS and sum(kept) <= LAYERS * 60, kept
    assert final.usage.kv_blocks_freed_by_compression > 0
    # Options from both maps reach composite: a uniform split keeps exactly 60 in every layer.
    _, ids, final = daemon.client.generate_text(
        request=request(token_prompt(240, 4), 4, "composite", 0.25, {"window": 16, "sinks": 8},
                        {"allocation": "uniform", "pooling": "none"}), timeout=60)
    assert list(final.usage.kv_tokens_kept_per_layer) == [60] * LAYERS
    with pytest.raises(grpc.RpcError) as err:
        list(daemon.client.generate(request=request(token_prompt(20, 1), 4, "winnowkv", 0.5,
                                                    options={"allocation": "zigzag"}),
                                    timeout=30))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "compression.options.allocation" in err.value.details()


def test_a_mass_merge_keeps_the_same_slots_and_batches_like_one_request(daemon):
    # mass_merge folds evicted tokens into kept ones (values and logit biases): what stays is
    # the plain plan's, and two such requests at once (sharing decode batches once the first
    # has freed its blocks) reply as one alone does.
    prompt = token_prompt(240, 7)
    _, _, plain = daemon.client.generate_text(
        request=request(prompt, 8, "winnowkv_docs", 0.25), timeout=60)
    merge = {"mass_merge": "true"}
    _, alone, merged = daemon.client.generate_text(
        request=request(prompt, 8, "winnowkv_docs", 0.25, options=merge), timeout=60)
    assert len(alone) == 8
    assert (list(merged.usage.kv_tokens_kept_per_layer)
            == list(plain.usage.kv_tokens_kept_per_layer))
    assert merged.usage.kv_blocks_freed_by_compression > 0
    done_at: dict = {}
    with cf.ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(run, daemon.target,
                               request(prompt, 8, "winnowkv_docs", 0.25, options=merge),
                               done_at, k) for k in range(2)]
        assert [f.result()[0] for f in futures] == [alone, alone]
    # With a lookahead the reply's first tokens join the kept slots and absorb nothing.
    _, ids, final = daemon.client.generate_text(
        request=request(prompt, 12, "winnowkv_docs", 0.25, {"lookahead": 4},
                        {"allocation": "uniform", **merge}), timeout=60)
    assert list(final.usage.kv_tokens_kept_per_layer) == [60 + 4] * LAYERS
    with pytest.raises(grpc.RpcError) as err:
        list(daemon.client.generate(request=request(prompt, 4, "winnowkv", 0.25,
                                                    options={"merge": "true", **merge}),
                                    timeout=30))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "compression.params.mass_merge" in err.value.details()


def test_a_lookahead_compresses_after_the_replys_first_tokens(daemon):
    # The first 8 + 1 tokens decode on the whole prompt, so they are the uncompressed reply's;
    # then the plan keeps 60 of the prompt's 240 tokens (uniform split) plus those 8.
    prompt = token_prompt(240, 6)
    _, full, _ = daemon.client.generate_text(request=request(prompt, 12), timeout=60)
    _, ids, final = daemon.client.generate_text(
        request=request(prompt, 12, "winnowkv_docs", 0.25, {"lookahead": 8},
                        {"allocation": "uniform"}), timeout=60)
    assert ids[:9] == full[:9]
    assert list(final.usage.kv_tokens_kept_per_layer) == [60 + 8] * LAYERS
    assert final.usage.kv_blocks_freed_by_compression > 0
    # VL-Cache's sparsity split reads the observed rows one by one: refused, naming the field.
    with pytest.raises(grpc.RpcError) as err:
        list(daemon.client.generate(request=request(prompt, 4, "composite", 0.25,
                                                    {"lookahead": 8}, {"allocation": "sparsity"}),
                                    timeout=30))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "compression.params.lookahead" in err.value.details()
