"""The daemon on the CUDA worker (`winnow serve --device cuda`), against the same daemon on the
CPU worker: the same greedy tokens up to near ties, batching that does not change them (up to
near ties), the KV pool sized by --gpu-memory-utilization, compression on the GPU (streaming_llm
like the CPU worker, the scoring policies freeing blocks, TokenSelect's sparse decode attention
like the CPU worker's, a published compressed context attached with the tokens of compressing it),
prompt log-probabilities like the CPU's, a tiny qwen3 (QK-norm) like the CPU worker, every block
back at the end.

Skipped, saying why, when this build has no CUDA or no GPU is visible (CI machines have
neither). docs/gpu.md says how these ran on a GPU machine.
"""

from __future__ import annotations

import concurrent.futures as cf
import re
import shutil
import subprocess

import pytest

from daemon_harness import Daemon, binary_path, model_path

PROMPTS = [
    "The capital of France is",
    "Write a short poem about the sea.",
    "def fibonacci(n):",
    "List three primary colors:",
]
MAX_TOKENS = 24


def _gpu_visible() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    return subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0


pytestmark = pytest.mark.skipif(
    not binary_path().exists() or not model_path().exists() or not _gpu_visible(),
    reason="no CUDA device visible (or no winnow build / model): CUDA daemon tests skipped")


# Where two runs' greedy tokens part, the reference's top two candidates must have been this
# close (in log-probability): the GPU computes in bf16 (docs/gpu.md: logits within 0.3% RMS of
# the CPU's), so it may pick the other one of a near tie, after which the texts diverge.
NEAR_TIE = 0.1
# The reference is the CPU worker at its most exact: float32 activations (its default, q8, moves
# log-probabilities by a few hundredths more) and the GPU's KV dtype.
CPU_REFERENCE = ("--cpu-activations", "f32", "--kv-cache-dtype", "bf16")


def _greedy(daemon: Daemon, prompt: str) -> tuple[list[int], list]:
    """Greedy tokens and, per token, its top-2 log-probabilities."""
    ids, logprobs = [], []
    for msg in daemon.client.generate(prompt, max_tokens=MAX_TOKENS, ignore_eos=True,
                                      logprobs=True, top_logprobs=2, timeout=120):
        ids.extend(msg.token_ids)
        logprobs.extend(msg.logprobs)
    assert len(ids) == MAX_TOKENS
    return ids, logprobs


def _assert_same_or_near_tie(got: tuple[list[int], list], want: tuple[list[int], list],
                             prompt: str) -> None:
    got_ids, want_ids = got[0], want[0]
    parted = next((i for i, (a, b) in enumerate(zip(got_ids, want_ids)) if a != b), None)
    if parted is None:
        return
    top = want[1][parted].top
    margin = top[0].logprob - top[1].logprob
    assert got_ids[parted] == top[1].token_id and margin < NEAR_TIE, (
        f"{prompt!r}: token {parted} is {got_ids[parted]}, the reference's top two were "
        f"{[(t.token_id, round(t.logprob, 4)) for t in top]}: not a near tie")


@pytest.fixture(scope="module")
def cpu_tokens() -> dict[str, tuple[list[int], list]]:
    with Daemon("--device", "cpu", *CPU_REFERENCE) as cpu:
        return {p: _greedy(cpu, p) for p in PROMPTS}


@pytest.fixture(scope="module")
def gpu() -> Daemon:
    daemon = Daemon("--device", "cuda:0", "--gpu-memory-utilization", "0.5")
    yield daemon
    daemon.stop()


def test_reports_the_gpu_and_sizes_the_pool_from_the_memory_fraction(gpu):
    info = gpu.client.model_info()
    assert info.device.startswith("cuda:0 ("), info.device
    status = gpu.client.server_status()
    assert status.device == info.device
    assert status.kv_blocks_total > 0
    line = re.search(r"gpu memory: 0\.50 of ([\d.]+) GiB on cuda:0: .* ([\d.]+) GiB for the KV "
                     r"cache", gpu.logs())
    assert line, gpu.logs()
    assert 0 < float(line.group(2)) < 0.5 * float(line.group(1))


def test_greedy_tokens_equal_the_cpu_workers_up_to_near_ties(gpu, cpu_tokens):
    for prompt in PROMPTS:
        _assert_same_or_near_tie(_greedy(gpu, prompt), cpu_tokens[prompt], prompt)
    gpu.wait_pool_free()


def test_concurrent_requests_get_the_tokens_they_get_alone(gpu):
    # Continuous batching mixes these prompts' prefills and decodes in shared iterations; a
    # batch changes the GEMMs' shapes (and cuBLAS's kernels), so only near ties may flip.
    alone = {p: _greedy(gpu, p) for p in PROMPTS}
    with cf.ThreadPoolExecutor(len(PROMPTS) * 2) as pool:
        futures = {pool.submit(_greedy, gpu, p): p for p in PROMPTS * 2}
        for future, prompt in futures.items():
            _assert_same_or_near_tie(future.result(), alone[prompt], prompt)
    gpu.wait_pool_free()


# A prompt long enough for compression to free whole blocks; its continuation depends on its end.
LONG_PROMPT = "Count with me:" + "".join(f" {i}," for i in range(1, 121))
COMPRESSION = {"policy": "streaming_llm", "budget": 0.25}
TOKENSELECT = {"policy": "tokenselect", "budget": 0.25}


def _compressed(daemon: Daemon, compression: dict = COMPRESSION
                ) -> tuple[tuple[list[int], list], object]:
    ids, logprobs, final = [], [], None
    for msg in daemon.client.generate(LONG_PROMPT, max_tokens=MAX_TOKENS, ignore_eos=True,
                                      logprobs=True, top_logprobs=2, compression=compression,
                                      timeout=120):
        ids.extend(msg.token_ids)
        logprobs.extend(msg.logprobs)
        if msg.finish_reason:
            final = msg
    assert len(ids) == MAX_TOKENS
    return (ids, logprobs), final.usage


@pytest.fixture(scope="module")
def cpu_compressed() -> dict[str, tuple[tuple[list[int], list], object]]:
    with Daemon("--device", "cpu", *CPU_REFERENCE) as cpu:
        return {c["policy"]: _compressed(cpu, c) for c in (COMPRESSION, TOKENSELECT)}


def test_compression_runs_on_the_gpu_like_on_the_cpu(gpu, cpu_compressed):
    # streaming_llm keeps positions, not scores: the same slots per layer as the CPU worker,
    # the same blocks freed, and the same greedy tokens from the compacted cache (up to near
    # ties). Compaction frees device blocks at once: every block is back at the end.
    got, usage = _compressed(gpu)
    want, want_usage = cpu_compressed["streaming_llm"]
    assert usage.kv_blocks_freed_by_compression > 0
    assert usage.kv_blocks_freed_by_compression == want_usage.kv_blocks_freed_by_compression
    assert list(usage.kv_tokens_kept_per_layer) == list(want_usage.kv_tokens_kept_per_layer)
    _assert_same_or_near_tie(got, want, LONG_PROMPT)
    gpu.wait_pool_free()


@pytest.mark.parametrize("policy", ["snapkv", "h2o", "elastic_cache", "winnowkv_docs"])
def test_scoring_policies_run_on_the_gpu_and_free_blocks(gpu, policy):
    ids, final = [], None
    for msg in gpu.client.generate(LONG_PROMPT, max_tokens=MAX_TOKENS, ignore_eos=True,
                                   compression={"policy": policy, "budget": 0.25}, timeout=120):
        ids.extend(msg.token_ids)
        if msg.finish_reason:
            final = msg
    assert len(ids) == MAX_TOKENS
    assert final.usage.kv_blocks_freed_by_compression > 0, final.usage
    gpu.wait_pool_free()


def test_lookahead_decodes_on_the_whole_prompt_then_frees_blocks(gpu):
    # The first lookahead + 1 tokens come from the uncompressed cache, so they are the GPU's own
    # uncompressed greedy tokens; the plan after them (scored with their attention, computed
    # on the GPU) frees blocks and keeps the lookahead's tokens.
    lookahead = 8
    full = [t for msg in gpu.client.generate(LONG_PROMPT, max_tokens=MAX_TOKENS, ignore_eos=True,
                                             timeout=120) for t in msg.token_ids]
    ids, final = [], None
    compression = {"policy": "winnowkv_docs", "budget": 0.25, "params": {"lookahead": lookahead}}
    for msg in gpu.client.generate(LONG_PROMPT, max_tokens=MAX_TOKENS, ignore_eos=True,
                                   compression=compression, timeout=120):
        ids.extend(msg.token_ids)
        if msg.finish_reason:
            final = msg
    assert ids[:lookahead + 1] == full[:lookahead + 1]
    assert final.usage.kv_blocks_freed_by_compression > 0, final.usage
    prompt_tokens = final.usage.prompt_tokens
    for kept in final.usage.kv_tokens_kept_per_layer:
        assert lookahead < kept < prompt_tokens + lookahead
    gpu.wait_pool_free()


@pytest.mark.parametrize("policy,probe",
                         [("snapkv", "none"), ("snapkv", "repeat"), ("kvzip", "repeat")])
def test_an_attached_compressed_context_gives_the_tokens_of_compressing_it(gpu, policy, probe):
    # The context compressed alone on the GPU (scored by its own last rows, or by the repeat
    # probe's forwards: summed for snapkv, their maximum for kvzip) and published; a second
    # question attaches it and computes only itself, token for token what it gets compressing the
    # context itself (under a salt of its own, so nothing is shared). Blocks shared and copied on
    # the device.
    compression = {"policy": policy, "budget": 0.25, "scope": "context",
                   "context_tokens": 240, "probe": probe}

    def ask(question: str, salt: str) -> tuple[list[int], object]:
        ids, final = [], None
        for msg in gpu.client.generate(LONG_PROMPT + question, max_tokens=MAX_TOKENS,
                                       ignore_eos=True, compression=compression,
                                       cache_salt=salt, timeout=120):
            ids.extend(msg.token_ids)
            final = msg if msg.finish_reason else final
        return ids, final.usage

    _, first = ask(" What comes next?", "shared")
    attached, usage = ask(" And after that?", "shared")
    alone, alone_usage = ask(" And after that?", "alone")
    assert first.cached_prompt_tokens == 0 and alone_usage.cached_prompt_tokens == 0
    assert usage.cached_prompt_tokens == 240
    assert attached == alone
    assert list(usage.kv_tokens_kept_per_layer) == list(first.kv_tokens_kept_per_layer)
    gpu.wait_pool_free()


def test_tokenselect_attends_its_selection_like_the_cpu(gpu, cpu_compressed):
    # Each decode step attends to the selected quarter of the cache (the vote on the GPU, the
    # attention over the slot list with the CUDA worker's own kernel): the CPU worker's tokens
    # up to near ties, and no block freed (TokenSelect evicts nothing).
    got, usage = _compressed(gpu, TOKENSELECT)
    want, want_usage = cpu_compressed["tokenselect"]
    assert usage.kv_blocks_freed_by_compression == 0
    assert want_usage.kv_blocks_freed_by_compression == 0
    _assert_same_or_near_tie(got, want, LONG_PROMPT)
    gpu.wait_pool_free()


def _prompt_logprobs(daemon: Daemon, prompt: str) -> list[float]:
    req = daemon.client.build_request(prompt, max_tokens=1)
    req.prompt_logprobs = 1
    scored = [lp.logprob for msg in daemon.client.generate(request=req, timeout=120)
              for lp in msg.prompt_logprobs]
    return scored


def test_prompt_logprobs_come_from_the_gpu_like_the_cpus(gpu):
    # Over 256 tokens, two at once: the scored rows come in several iterations' chunks.
    prompts = [" ".join(f"{p} {i}." for i in range(40)) for p in PROMPTS[:2]]
    with Daemon("--device", "cpu", *CPU_REFERENCE) as cpu:
        want = [_prompt_logprobs(cpu, p) for p in prompts]
    with cf.ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda p: _prompt_logprobs(gpu, p), prompts))
    for g, w in zip(got, want):
        assert len(w) > 256 and len(g) == len(w)
        worst = max(abs(a - b) for a, b in zip(g, w))
        print(f"[ measured ] prompt logprobs: worst |gpu - cpu| {worst:.4f} over {len(w)} tokens")
        assert worst < 0.5  # bf16 against f32; a row taken for another would be nats off
    gpu.wait_pool_free()


def test_qwen3_qk_norm_runs_on_the_gpu_like_the_cpu(tmp_path, monkeypatch):
    # A tiny random qwen3 (test_reference_tiny.py's, whose CPU logits match transformers).
    for module in ("numpy", "gguf", "torch"):  # test_reference_tiny's imports
        pytest.importorskip(module, reason=f"writing the tiny qwen3 needs {module}")
    import numpy as np
    from test_reference_tiny import tokenizer_fields, write_tiny_gguf

    path = tmp_path / "tiny-qwen3.gguf"
    write_tiny_gguf(path, "qwen3", np.float32, False, 1e6, None, tokenizer_fields(model_path()),
                    seed=3)
    monkeypatch.setenv("WINNOW_MODEL", str(path))
    with Daemon("--device", "cpu", *CPU_REFERENCE) as cpu:
        want = {p: _greedy(cpu, p) for p in PROMPTS}
    with Daemon("--device", "cuda:0", "--gpu-memory-utilization", "0.2") as qwen3:
        for prompt in PROMPTS:
            _assert_same_or_near_tie(_greedy(qwen3, prompt), want[prompt], prompt)


def test_a_hugging_face_directory_runs_on_the_gpu_like_the_cpu(tmp_path, monkeypatch):
    # The default model as a bf16 directory (test_hf_model.py's, whose CPU logits match
    # transformers): its BF16 weights are copied to the device as they are.
    for module in ("torch", "transformers"):
        pytest.importorskip(module, reason=f"converting the model needs {module}")
    from test_hf_model import convert_default_model

    monkeypatch.setenv("WINNOW_MODEL", str(convert_default_model(model_path(), tmp_path / "m")))
    with Daemon("--device", "cpu", *CPU_REFERENCE) as cpu:
        want = {p: _greedy(cpu, p) for p in PROMPTS}
    with Daemon("--device", "cuda:0", "--gpu-memory-utilization", "0.2") as hf:
        for prompt in PROMPTS:
            _assert_same_or_near_tie(_greedy(hf, prompt), want[prompt], prompt)
