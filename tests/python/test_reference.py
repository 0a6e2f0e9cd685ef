"""winnow's forward pass against transformers loading the same GGUF in float32.

Checks, with float32 activations (`--cpu-activations f32`, the exact path): argmax identical at
every position and next-token log-probabilities within 3e-2 on 8 prompts (one over 1000
tokens); greedy 64-token continuations identical; chunked prefill (7, 64, 512) equal to one-shot
prefill; the same checks (2 prompts, 32 tokens) on Q4_K_M and Q5_K_M requantisations of the
model (Q5_0/Q5_1, Q8_0, Q4_K/Q5_K and Q6_K weights). All of these run at the default KV cache
dtype (f16). The logits check is repeated per KV dtype (test_kv_dtype_logits_match_reference)
with the tolerances of KV_DTYPE_TOLERANCE.

With 8-bit activations (`--cpu-activations q8`) the same prompts and files are compared with the
tolerances of Q8_TOLERANCE, against transformers and against llama.cpp (which quantises its
activations to 8 bits as well); greedy continuations may leave the reference only at near ties,
which the test shows with the reference's own logits.
"""
import json

import numpy as np
import pytest
import torch

from conftest import run_winnow_json

# The tests below run at the default KV cache dtype, f16 (see KV_DTYPE_TOLERANCE).
LOGPROB_TOLERANCE = 3e-2

PROMPTS = {
    "fact": "The capital of France is",
    "code": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:",
    "chat": "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nWhat is the boiling point of water?<|im_end|>\n"
            "<|im_start|>assistant\n",
    "numbers": "1, 2, 3, 5, 8, 13, 21, 34, 55,",
    "multilingual": "Bonjour! Wie geht's? ¿Qué tal? 日本語のテキストも少し。 Ελληνικά και русский.",
    "list": "Shopping list:\n- eggs\n- milk\n- flour\n-",
    "story": "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "long": None,  # built below: over 1000 tokens
}


def long_document() -> str:
    topics = ["astronomy", "baking bread", "the history of Rome", "sailing", "chess openings",
              "volcanoes", "machine learning", "gardening", "jazz music", "mountain climbing"]
    paragraphs = []
    for i in range(40):
        topic = topics[i % len(topics)]
        paragraphs.append(
            f"Section {i + 1}. This part of the report covers {topic}. Experts in {topic} note "
            f"that careful practice over {i + 3} years makes a difference, and that beginners "
            f"often underestimate how much patience {topic} requires.")
    return "\n\n".join(paragraphs) + "\n\nIn summary, the report covered"


PROMPTS["long"] = long_document()


def reference_logits(hf_model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0].float()


def score(winnow_bin, model_path, tmp_path, ids, chunk=None, activations="f32", kv_dtype=None):
    tokens_file = tmp_path / "tokens.json"
    tokens_file.write_text(json.dumps(ids))
    args = ["score", "--model", str(model_path), "--tokens-file", str(tokens_file),
            "--cpu-activations", activations]
    if kv_dtype is not None:
        args += ["--kv-cache-dtype", kv_dtype]
    if chunk is not None:
        args += ["--chunk-size", str(chunk)]
    return run_winnow_json(winnow_bin, *args)


@pytest.fixture(scope="module")
def prompt_ids(hf_tokenizer):
    ids = {name: hf_tokenizer(text, add_special_tokens=False).input_ids
           for name, text in PROMPTS.items()}
    assert len(ids["long"]) > 1000
    return ids


@pytest.mark.parametrize("name", list(PROMPTS))
def test_logits_match_reference(name, prompt_ids, hf_model, winnow_bin, model_path, tmp_path):
    ids = prompt_ids[name]
    ours = score(winnow_bin, model_path, tmp_path, ids)
    logits = reference_logits(hf_model, ids)
    logprobs = torch.log_softmax(logits.double(), dim=-1)

    ref_argmax = logits.argmax(dim=-1).tolist()
    mismatches = [i for i, (a, b) in enumerate(zip(ours["argmax"], ref_argmax)) if a != b]
    assert not mismatches, f"argmax differs at positions {mismatches[:10]}"

    ref_next = logprobs[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].numpy()
    delta = np.abs(np.array(ours["logprob_next"]) - ref_next)
    assert delta.max() <= LOGPROB_TOLERANCE, f"max |Δ logprob| = {delta.max():.3g}"

    last = np.array(ours["last_logits"])
    ref_last = logits[-1].numpy()
    assert np.abs(last - ref_last).max() <= 5e-2


def new_worst():
    return {"logprob": 0.0, "mean_logprob": 0.0, "last_logits": 0.0, "flipped_gap": 0.0}


def check_against(name, ours, ref_logits, ids, tol, worst):
    """Asserts `ours` (winnow score output) is within `tol` of the reference logits: argmax
    differs only where the reference's top-2 gap is below tol["argmax_gap"]; max (and, when
    given, mean) |Δ next-token logprob| and max |Δ last logits| within bounds. Records the
    worst values seen in `worst` (see new_worst)."""
    top2 = torch.topk(ref_logits, 2, dim=-1).values
    gaps = (top2[:, 0] - top2[:, 1]).tolist()
    for i, (a, b) in enumerate(zip(ours["argmax"], ref_logits.argmax(dim=-1).tolist())):
        if a != b:
            worst["flipped_gap"] = max(worst["flipped_gap"], gaps[i])
            assert gaps[i] < tol["argmax_gap"], \
                f"{name}: argmax differs at {i} where the reference's top-2 gap is {gaps[i]:.3g}"
    logprobs = torch.log_softmax(ref_logits.double(), dim=-1)
    ref_next = logprobs[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].numpy()
    deltas = np.abs(np.array(ours["logprob_next"]) - ref_next)
    delta, mean = float(deltas.max()), float(deltas.mean())
    last = float(np.abs(np.array(ours["last_logits"]) - ref_logits[-1].numpy()).max())
    worst["logprob"] = max(worst["logprob"], delta)
    worst["mean_logprob"] = max(worst["mean_logprob"], mean)
    worst["last_logits"] = max(worst["last_logits"], last)
    assert delta <= tol["logprob"], f"{name}: max |Δ logprob| = {delta:.3g}"
    assert mean <= tol.get("mean_logprob", np.inf), f"{name}: mean |Δ logprob| = {mean:.3g}"
    assert last <= tol["last_logits"], f"{name}: max |Δ last logits| = {last:.3g}"


# Per KV cache dtype (`winnow score --kv-cache-dtype`): the largest |Δ next-token logprob| and
# |Δ last logits| allowed against transformers' float32, and the reference's top-2 logit gap
# below which an argmax may differ (a near tie that the KV rounding can flip; 0 = never).
# Worst cases measured over the 8 prompts (2026-11-24), which the bounds cover by ~1.5x:
#   f32  logprob 1.3e-4, last logits 9.6e-5, no argmax flips (the pre-dtype tolerances stay)
#   f16  logprob 2.0e-2, last logits 1.2e-2, no argmax flips
#   bf16 logprob 0.11,   last logits 0.11,   one flip where the top-2 gap was 0.016
#   q8_0 logprob 0.38,   last logits 0.80,   flips where the top-2 gap was up to 0.40
KV_DTYPE_TOLERANCE = {
    "f32": {"logprob": 1e-2, "last_logits": 5e-2, "argmax_gap": 0.0},
    "f16": {"logprob": 3e-2, "last_logits": 5e-2, "argmax_gap": 0.0},
    "bf16": {"logprob": 0.2, "last_logits": 0.2, "argmax_gap": 0.05},
    "q8_0": {"logprob": 0.6, "last_logits": 1.2, "argmax_gap": 0.6},
}


@pytest.mark.parametrize("dtype", list(KV_DTYPE_TOLERANCE))
def test_kv_dtype_logits_match_reference(dtype, prompt_ids, hf_model, winnow_bin, model_path,
                                         tmp_path):
    worst = new_worst()
    for name, ids in prompt_ids.items():
        ours = score(winnow_bin, model_path, tmp_path, ids, kv_dtype=dtype)
        check_against(name, ours, reference_logits(hf_model, ids), ids,
                      KV_DTYPE_TOLERANCE[dtype], worst)
    print(f"kv dtype {dtype}: worst {worst}")


def reference_greedy(hf_model, ids: list[int], steps: int) -> list[int]:
    """Greedy decoding with the reference's own KV cache; never stops early."""
    out = []
    with torch.no_grad():
        result = hf_model(torch.tensor([ids]), use_cache=True)
        for _ in range(steps):
            token = int(result.logits[0, -1].argmax())
            out.append(token)
            result = hf_model(torch.tensor([[token]]), past_key_values=result.past_key_values,
                              use_cache=True)
    return out


@pytest.mark.parametrize("prompt,chat", [
    ("The capital of France is", False),
    ("Write a haiku about the sea.", True),
    ("def quicksort(items):", False),
    ("List three primary colours.", True),
])
def test_greedy_continuation_matches_reference(prompt, chat, hf_model, winnow_bin, model_path):
    args = ["generate", "--model", str(model_path), "--prompt", prompt, "--max-tokens", "64",
            "--ignore-eos", "--json", "--quiet", "--cpu-activations", "f32"]
    if chat:
        args.append("--chat")
    ours = run_winnow_json(winnow_bin, *args)
    assert len(ours["token_ids"]) == 64
    assert ours["token_ids"] == reference_greedy(hf_model, ours["prompt_token_ids"], 64)


# Chunks of 7 take the decode matmul kernels, 64 and 512 the prefill ones; with q8 activations
# both give the same bits per row (docs/cpu.md), so the results match as with f32.
@pytest.mark.parametrize("activations", ["f32", "q8"])
@pytest.mark.parametrize("chunk", [7, 64, 512])
def test_chunked_prefill_equals_one_shot(chunk, activations, prompt_ids, winnow_bin, model_path,
                                         tmp_path):
    ids = prompt_ids["long"]
    whole = score(winnow_bin, model_path, tmp_path, ids, activations=activations)
    chunked = score(winnow_bin, model_path, tmp_path, ids, chunk=chunk, activations=activations)
    assert chunked["argmax"] == whole["argmax"]
    np.testing.assert_allclose(chunked["logprob_next"], whole["logprob_next"], atol=1e-4)
    np.testing.assert_allclose(chunked["last_logits"], whole["last_logits"], atol=1e-4)


# Most GGUFs users bring are Q4_K_M or Q5_K_M. llama.cpp's requantisations of the default model
# give mixes of Q5_0/Q5_1, Q8_0, Q4_K/Q5_K and Q6_K weights, each with its own matmul kernel.
KQUANT_TYPES = {"Q4_K_M": {"Q4_K", "Q6_K", "Q5_0"}, "Q5_K_M": {"Q5_K", "Q6_K", "Q5_1"}}


@pytest.fixture(scope="module", params=list(KQUANT_TYPES))
def kquant_model_path(request, model_path, tmp_path_factory):
    import ctypes
    import os

    llama_cpp = pytest.importorskip("llama_cpp")
    out = tmp_path_factory.mktemp("kquant") / f"smollm2-{request.param}.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{request.param}")
    params.allow_requantize = True
    params.nthread = os.cpu_count() or 1
    assert llama_cpp.llama_model_quantize(str(model_path).encode(), str(out).encode(),
                                          ctypes.byref(params)) == 0
    return out


@pytest.fixture(scope="module")
def kquant_hf_model(kquant_model_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(kquant_model_path.parent),
                                                 gguf_file=kquant_model_path.name,
                                                 dtype=torch.float32)
    model.eval()
    return model


def test_kquant_file_matches_reference(kquant_model_path, kquant_hf_model, prompt_ids,
                                       winnow_bin, tmp_path):
    tensors = run_winnow_json(winnow_bin, "inspect", "--model", str(kquant_model_path),
                              "--tensors")
    types = {t["type"] for t in tensors}
    expected = KQUANT_TYPES[kquant_model_path.stem.split("-")[-1]]
    assert expected <= types, types
    for name in ("chat", "story"):
        ids = prompt_ids[name]
        ours = score(winnow_bin, kquant_model_path, tmp_path, ids)
        logits = reference_logits(kquant_hf_model, ids)
        assert ours["argmax"] == logits.argmax(dim=-1).tolist(), name
        logprobs = torch.log_softmax(logits.double(), dim=-1)
        ref_next = logprobs[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].numpy()
        delta = np.abs(np.array(ours["logprob_next"]) - ref_next)
        assert delta.max() <= LOGPROB_TOLERANCE, f"{name}: max |Δ logprob| = {delta.max():.3g}"
    ours = run_winnow_json(winnow_bin, "generate", "--model", str(kquant_model_path), "--prompt",
                           "The capital of France is", "--max-tokens", "32", "--ignore-eos",
                           "--json", "--quiet", "--cpu-activations", "f32")
    assert ours["token_ids"] == reference_greedy(kquant_hf_model, ours["prompt_token_ids"], 32)


# ---------------------------------------------------------------------------------------------
# 8-bit activations. Bounds against transformers' float32 (f16 KV cache, as above): the largest
# |Δ next-token logprob|, the largest |Δ last logits|, and the reference's top-2 logit gap below
# which an argmax may differ. Measured worst cases are in docs/cpu.md.
Q8_TOLERANCE = {"logprob": 1.5, "mean_logprob": 0.15, "last_logits": 1.4, "argmax_gap": 0.5}
# On llama.cpp's K-quant requantisations the largest deviations sit on a few positions of the chat
# prompt where 8-bit rounding of the activations decides much: there a rounding-level change of
# the float kernels (ca98fc1: two builds within 1e-5 of each other with f32 activations and f32
# KV) moved Q5_K_M's worst |Δ logprob| from 1.17 to 1.93 and its mean from 0.113 to 0.186, and
# llama.cpp itself is at 1.17-1.21 / 0.150-0.161 on the same prompts (docs/cpu.md).
KQUANT_Q8_TOLERANCE = {**Q8_TOLERANCE, "logprob": 2.5, "mean_logprob": 0.25}


def test_q8_activations_match_reference(prompt_ids, hf_model, winnow_bin, model_path, tmp_path):
    worst = new_worst()
    for name, ids in prompt_ids.items():
        ours = score(winnow_bin, model_path, tmp_path, ids, activations="q8")
        check_against(name, ours, reference_logits(hf_model, ids), ids, Q8_TOLERANCE, worst)
    print(f"q8 activations vs transformers: worst {worst}")


def test_q8_kquant_file_matches_reference(kquant_model_path, kquant_hf_model, prompt_ids,
                                          winnow_bin, tmp_path):
    worst = new_worst()
    for name in ("chat", "story", "long"):
        ids = prompt_ids[name]
        ours = score(winnow_bin, kquant_model_path, tmp_path, ids, activations="q8")
        check_against(name, ours, reference_logits(kquant_hf_model, ids), ids,
                      KQUANT_Q8_TOLERANCE, worst)
    print(f"q8 activations vs transformers on {kquant_model_path.stem}: worst {worst}")


def llama_cpp_logits(model_path, ids):
    """llama.cpp's logits at every position of ids (its CPU backend, 8-bit activations)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=str(model_path), n_ctx=2048, n_batch=2048, n_ubatch=2048,
                          logits_all=True, verbose=False)
    llm.eval(ids)
    logits = torch.tensor(np.array(llm.scores[:len(ids)]), dtype=torch.float32)
    llm.close()
    return logits


# winnow q8 and llama.cpp both quantise activations to 8 bits (llama.cpp with fp16 block scales
# and, for Q4_1 weights, Q8_1 blocks), so each is compared with the other as with transformers.
def test_q8_activations_match_llama_cpp(prompt_ids, winnow_bin, model_path, tmp_path):
    worst = new_worst()
    for name in ("fact", "chat", "code", "long"):
        ids = prompt_ids[name]
        ours = score(winnow_bin, model_path, tmp_path, ids, activations="q8")
        check_against(name, ours, llama_cpp_logits(model_path, ids), ids, Q8_TOLERANCE, worst)
    print(f"q8 activations vs llama.cpp: worst {worst}")


@pytest.mark.parametrize("prompt,chat", [
    ("The capital of France is", False),
    ("Write a haiku about the sea.", True),
    ("def quicksort(items):", False),
    ("List three primary colours.", True),
])
def test_q8_greedy_continuation_leaves_reference_only_at_near_ties(prompt, chat, hf_model,
                                                                    winnow_bin, model_path):
    args = ["generate", "--model", str(model_path), "--prompt", prompt, "--max-tokens", "64",
            "--ignore-eos", "--json", "--quiet", "--cpu-activations", "q8"]
    if chat:
        args.append("--chat")
    ours = run_winnow_json(winnow_bin, *args)
    prompt_ids_, tokens = ours["prompt_token_ids"], ours["token_ids"]
    assert len(tokens) == 64
    # The reference's logits along our own continuation: every token we chose must be the
    # reference's argmax or within Q8_TOLERANCE["argmax_gap"] of it.
    logits = reference_logits(hf_model, prompt_ids_ + tokens)[len(prompt_ids_) - 1:-1]
    best = logits.max(dim=-1).values
    chosen = logits[torch.arange(len(tokens)), torch.tensor(tokens)]
    gaps = (best - chosen).tolist()
    ties = [(i, round(g, 4)) for i, g in enumerate(gaps) if g > 0]
    print(f"q8 greedy vs reference: {len(ties)} of 64 steps took a near tie: {ties}")
    assert max(gaps) < Q8_TOLERANCE["argmax_gap"], f"step {gaps.index(max(gaps))}: gap {max(gaps)}"
