"""winnow's forward pass on tiny random GGUF models against transformers loading the same file.

No qwen2 GGUF is available offline, so the models are built at test time with gguf-py: random
weights, tokenizer metadata copied from the default model's GGUF and truncated to its first 2048
tokens (see tokenizer_fields). Variants:
  * qwen2 F32, untied output (QKV biases, neox RoPE, freq_base 1e6)
  * qwen2 F16 weights (norms and biases F32, as llama.cpp writes them), tied output
  * llama F32 with linear rope scaling, factor 2
  * qwen3 F32 (QK-norm, no biases; head_dim 128, what transformers' GGUF loader assumes for
    qwen3 as it does not read attention.key_length).

transformers' GGUF loader does not read `llama.rope.scaling.*` (it only reconstructs rope scaling
for gpt-oss), so for the scaled llama variant the reference is given the same scaling explicitly
through the config (`rope_parameters={"rope_type": "linear", "factor": 2.0, ...}`); the test first
checks that the GGUF-only load differs, i.e. that the scaling really matters at these positions.

Checks per model and sequence (random ids, length 40 and 300): argmax identical at every
position, max |Δ logprob| ≤ 1e-3, last logits close.
"""
import json
import os

import numpy as np
import pytest
import torch

from conftest import run_winnow_json

LOGPROB_TOLERANCE = 1e-3
LAST_LOGITS_TOLERANCE = 1e-3

HIDDEN, HEADS, KV_HEADS, FFN, LAYERS = 64, 4, 2, 128, 2
HEAD_DIM = HIDDEN // HEADS
EPS = 1e-6
VOCAB = 2048

VARIANTS = {
    # name: (arch, weight dtype, tied output, rope freq_base, linear rope scaling factor)
    "qwen2-f32": ("qwen2", np.float32, False, 1e6, None),
    "qwen2-f16-tied": ("qwen2", np.float16, True, 1e6, None),
    "llama-linear2": ("llama", np.float32, False, 1e4, 2.0),
    "qwen3-f32": ("qwen3", np.float32, False, 1e6, None),
}
QWEN3_HEAD_DIM = 128


def tokenizer_fields(model_path):
    """The default model's tokenizer.* keys, cut down to its first VOCAB tokens.

    Parsing 49152 token strings and 48900 merges costs transformers' GGUF loader ~10 s per read
    (it reads the file twice per load), so the vocabulary is truncated: the first VOCAB tokens
    (bytes, specials and the earliest merge results) and only the merges whose two parts and
    result all stay in the vocabulary, which keeps the BPE tokenizer self-consistent.
    """
    from gguf import GGUFReader

    reader = GGUFReader(str(model_path))
    fields = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            sub = field.types[1] if len(field.types) > 1 else None
            fields[key] = [key, field.contents(), field.types[0], sub]
    tokens = fields["tokenizer.ggml.tokens"][1][:VOCAB]
    fields["tokenizer.ggml.tokens"][1] = tokens
    fields["tokenizer.ggml.token_type"][1] = fields["tokenizer.ggml.token_type"][1][:VOCAB]
    keep = set(tokens)
    merges = []
    for merge in fields["tokenizer.ggml.merges"][1]:
        left, right = merge.split(" ", 1)
        if left in keep and right in keep and left + right in keep:
            merges.append(merge)
    assert len(merges) > VOCAB // 2
    fields["tokenizer.ggml.merges"][1] = merges
    return [tuple(f) for f in fields.values()]


def write_tiny_gguf(path, arch, wtype, tied, freq_base, linear_factor, tok_fields, seed):
    import gguf

    rng = np.random.default_rng(seed)
    vocab = next(len(v) for k, v, _, _ in tok_fields if k == "tokenizer.ggml.tokens")

    def mat(rows, cols, scale=None):
        scale = scale if scale is not None else 1.0 / np.sqrt(cols)
        return (rng.standard_normal((rows, cols)) * scale).astype(wtype)

    def vec(n, center=0.0, scale=0.1):
        return (center + rng.standard_normal(n) * scale).astype(np.float32)

    head_dim = QWEN3_HEAD_DIM if arch == "qwen3" else HEAD_DIM
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}")
    if arch == "qwen3":
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_block_count(LAYERS)
    w.add_context_length(2048)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(freq_base)
    w.add_layer_norm_rms_eps(EPS)
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if wtype == np.float16
                    else gguf.LlamaFileType.ALL_F32)
    if linear_factor is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(linear_factor)
    for key, value, vtype, sub in tok_fields:
        w.add_key_value(key, value, vtype, sub)

    w.add_tensor("token_embd.weight", mat(vocab, HIDDEN, 1.0))
    for i in range(LAYERS):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", vec(HIDDEN, 1.0))
        w.add_tensor(b + "attn_q.weight", mat(HEADS * head_dim, HIDDEN, 2.0 / np.sqrt(HIDDEN)))
        w.add_tensor(b + "attn_k.weight", mat(KV_HEADS * head_dim, HIDDEN, 2.0 / np.sqrt(HIDDEN)))
        w.add_tensor(b + "attn_v.weight", mat(KV_HEADS * head_dim, HIDDEN))
        if arch == "qwen2":
            w.add_tensor(b + "attn_q.bias", vec(HEADS * head_dim, 0.0, 0.5))
            w.add_tensor(b + "attn_k.bias", vec(KV_HEADS * head_dim, 0.0, 0.5))
            w.add_tensor(b + "attn_v.bias", vec(KV_HEADS * head_dim, 0.0, 0.5))
        if arch == "qwen3":
            # Scaled away from 1 so that a forward without QK-norm would not pass.
            w.add_tensor(b + "attn_q_norm.weight", vec(head_dim, 2.0, 0.5))
            w.add_tensor(b + "attn_k_norm.weight", vec(head_dim, 2.0, 0.5))
        w.add_tensor(b + "attn_output.weight", mat(HIDDEN, HEADS * head_dim))
        w.add_tensor(b + "ffn_norm.weight", vec(HIDDEN, 1.0))
        w.add_tensor(b + "ffn_gate.weight", mat(FFN, HIDDEN))
        w.add_tensor(b + "ffn_up.weight", mat(FFN, HIDDEN))
        w.add_tensor(b + "ffn_down.weight", mat(HIDDEN, FFN))
    w.add_tensor("output_norm.weight", vec(HIDDEN, 1.0))
    if not tied:
        w.add_tensor("output.weight", mat(vocab, HIDDEN, 2.0 / np.sqrt(HIDDEN)))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def load_reference(path, rope_parameters=None):
    from transformers import AutoModelForCausalLM

    kwargs = {}
    if rope_parameters is not None:
        kwargs["rope_parameters"] = rope_parameters
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 dtype=torch.float32, **kwargs)
    model.eval()
    return model


@pytest.fixture(scope="module")
def tiny_models(model_path, tmp_path_factory):
    torch.set_num_threads(os.cpu_count() or 1)
    tok = tokenizer_fields(model_path)
    folder = tmp_path_factory.mktemp("tiny")
    out = {}
    for seed, (name, (arch, wtype, tied, base, factor)) in enumerate(VARIANTS.items()):
        path = folder / f"{name}.gguf"
        write_tiny_gguf(path, arch, wtype, tied, base, factor, tok, seed)
        rope = None
        if factor is not None:
            rope = {"rope_type": "linear", "factor": factor, "rope_theta": base}
        model = load_reference(path, rope)
        cfg = model.config
        assert cfg.model_type == arch
        assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads,
                cfg.num_key_value_heads, cfg.intermediate_size) == (LAYERS, HIDDEN, HEADS,
                                                                    KV_HEADS, FFN)
        assert cfg.tie_word_embeddings == tied
        if arch == "qwen2":
            assert model.model.layers[0].self_attn.q_proj.bias is not None
        if arch == "qwen3":
            assert cfg.head_dim == QWEN3_HEAD_DIM
            assert model.model.layers[0].self_attn.q_norm.weight.mean().item() > 1.5
        out[name] = (path, model)
    return out


def reference_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def winnow_score(winnow_bin, path, tmp_path, ids):
    tokens_file = tmp_path / "tokens.json"
    tokens_file.write_text(json.dumps(ids))
    # An f32 KV cache: these checks hold the forward's math to 1e-3 (the f16 default's own
    # tolerance is checked on the real model in test_reference.py).
    return run_winnow_json(winnow_bin, "score", "--model", str(path), "--tokens-file",
                           str(tokens_file), "--kv-cache-dtype", "f32")


def random_ids(length, seed):
    return np.random.default_rng(100 + seed).integers(3, VOCAB, size=length).tolist()


@pytest.mark.parametrize("length", [40, 300])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_tiny_logits_match_reference(name, length, tiny_models, winnow_bin, tmp_path):
    path, model = tiny_models[name]
    ids = random_ids(length, length)
    ours = winnow_score(winnow_bin, path, tmp_path, ids)
    logits = reference_logits(model, ids)
    logprobs = torch.log_softmax(logits.double(), dim=-1)

    ref_argmax = logits.argmax(dim=-1).tolist()
    mismatches = [i for i, (a, b) in enumerate(zip(ours["argmax"], ref_argmax)) if a != b]
    assert len(ours["argmax"]) == len(ids)
    assert not mismatches, f"argmax differs at positions {mismatches[:10]}"

    ref_next = logprobs[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].numpy()
    delta = np.abs(np.array(ours["logprob_next"]) - ref_next)
    assert delta.max() <= LOGPROB_TOLERANCE, f"max |Δ logprob| = {delta.max():.3g}"

    last = np.array(ours["last_logits"])
    assert np.abs(last - logits[-1].numpy()).max() <= LAST_LOGITS_TOLERANCE


def test_linear_scaling_matters(tiny_models, tmp_path):
    """The scaled llama variant would fail without scaling: the unscaled reference differs."""
    path, scaled = tiny_models["llama-linear2"]
    unscaled = load_reference(path)
    ids = random_ids(300, 300)
    diff = (reference_logits(scaled, ids) - reference_logits(unscaled, ids)).abs().max()
    assert diff > 1e-2


POLICIES = ["streaming_llm", "h2o", "snapkv", "pyramidkv", "kvzip", "vl_cache", "aircache", "xkv",
            "elastic_cache", "tokenselect", "composite", "winnowkv", "winnowkv_docs"]


def test_every_compression_policy_runs_on_qwen3(tiny_models, monkeypatch):
    """The policies score the queries after QK-norm and RoPE: on the tiny qwen3 each one keeps
    no compression's greedy tokens at budget 1 and frees blocks at budget 0.3 (tokenselect, which
    evicts nothing, attends a selection instead)."""
    from daemon_harness import Daemon

    path, _ = tiny_models["qwen3-f32"]
    monkeypatch.setenv("WINNOW_MODEL", str(path))
    prompt = " ".join(f"item {i} is number {i * 7}." for i in range(30))

    def run(daemon, policy="", budget=0.0):
        compression = {"policy": policy, "budget": budget} if policy else None
        _, ids, final = daemon.client.generate_text(prompt, max_tokens=8, temperature=0.0,
                                                    ignore_eos=True, compression=compression,
                                                    timeout=120)
        return ids, final.usage

    with Daemon("--enable-prefix-caching", "false") as daemon:
        want, _ = run(daemon)
        for policy in POLICIES:
            ids, _ = run(daemon, policy, 1.0)
            assert ids == want, policy
            ids, usage = run(daemon, policy, 0.3)
            assert len(ids) == 8, policy
            if policy != "tokenselect":
                assert usage.kv_blocks_freed_by_compression > 0, policy
        daemon.wait_pool_free()
