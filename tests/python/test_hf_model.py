"""Hugging Face model directories: winnow against transformers loading the same directory.

* The default model, converted by transformers: its GGUF dequantised and written as a bf16
  safetensors directory with tokenizer.json, tokenizer_config.json, chat_template.jinja and
  generation_config.json. Teacher-forced, winnow's argmax equals transformers' at every position
  of a real prompt (|Δ logprob| ≤ 1e-3); greedy continuations are equal; the tokenizer equals
  transformers'; the daemon serves a chat from the directory and stops on its EOS.
* The same directory under --cpu-weight-type: q8_0 and q4_0 score like transformers running the
  weights gguf-py quantises; q8_0 stays close to the weights as stored.
* Tiny random checkpoints that transformers writes (llama with Llama-3 rope scaling, mistral
  with and without its sliding window, qwen2 with QKV biases, one with YaRN, qwen3 with
  QK-norm, gemma3_text with a sliding and a global layer; f32, f16 and bf16; tied and untied;
  one sharded),
  compared logit for logit on random ids as test_reference_tiny does for GGUF files.
* Errors name the file and the field or tensor: a missing tensor, a wrong shape, an
  unsupported model_type.
"""
from __future__ import annotations

import json
import os
import shutil
import urllib.request

import numpy as np
import pytest
import torch

from conftest import run_winnow, run_winnow_json
from daemon_harness import Daemon, pb2

LOGPROB_TOLERANCE = 1e-3
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea, there lived",
]


def convert_default_model(model_path, out):
    """The default GGUF as a bf16 Hugging Face directory at `out`, written by transformers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(os.cpu_count() or 1)
    gguf = AutoModelForCausalLM.from_pretrained(str(model_path.parent), gguf_file=model_path.name,
                                                dtype=torch.float32)
    config = gguf.config
    del config.quantization_config  # a GGUF-loaded model refuses save_pretrained
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict({k: v.to(torch.bfloat16) for k, v in gguf.state_dict().items()},
                          strict=False)
    model.save_pretrained(str(out))
    AutoTokenizer.from_pretrained(str(model_path.parent),
                                  gguf_file=model_path.name).save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def hf_dir(model_path, tmp_path_factory):
    return convert_default_model(model_path,
                                 tmp_path_factory.mktemp("hf") / "SmolLM2-135M-Instruct")


@pytest.fixture(scope="module")
def hf_reference(hf_dir):
    """transformers loading the directory, computing in float32."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    model.eval()
    return model, AutoTokenizer.from_pretrained(str(hf_dir))


def score(winnow_bin, path, tmp_path, ids):
    tokens_file = tmp_path / "tokens.json"
    tokens_file.write_text(json.dumps(ids))
    return run_winnow_json(winnow_bin, "score", "--model", str(path), "--tokens-file",
                           str(tokens_file), "--kv-cache-dtype", "f32", "--cpu-activations", "f32")


def reference_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def check_logits(ours, logits, ids):
    ref_argmax = logits.argmax(dim=-1).tolist()
    mismatches = [i for i, (a, b) in enumerate(zip(ours["argmax"], ref_argmax)) if a != b]
    assert len(ours["argmax"]) == len(ids)
    assert not mismatches, f"argmax differs at positions {mismatches[:10]}"
    logprobs = torch.log_softmax(logits.double(), dim=-1)
    ref_next = logprobs[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].numpy()
    delta = np.abs(np.array(ours["logprob_next"]) - ref_next)
    assert delta.max() <= LOGPROB_TOLERANCE, f"max |Δ logprob| = {delta.max():.3g}"


def test_real_model_scores_like_transformers(hf_dir, hf_reference, winnow_bin, tmp_path):
    model, tokenizer = hf_reference
    ids = tokenizer(" ".join(PROMPTS))["input_ids"]
    assert len(ids) > 30
    check_logits(score(winnow_bin, hf_dir, tmp_path, ids), reference_logits(model, ids), ids)


def test_real_model_greedy_tokens_equal_transformers(hf_dir, hf_reference, winnow_bin):
    model, tokenizer = hf_reference
    for prompt in PROMPTS[:2]:
        ids = tokenizer(prompt)["input_ids"]
        ref = []
        for _ in range(20):  # argmax after argmax, EOS included, as --ignore-eos decodes
            ref.append(int(reference_logits(model, ids + ref)[-1].argmax()))
        ours = run_winnow_json(winnow_bin, "generate", "--model", str(hf_dir), "--prompt", prompt,
                               "--max-tokens", "20", "--ignore-eos", "--json",
                               "--kv-cache-dtype", "f32", "--cpu-activations", "f32")
        assert ours["prompt_token_ids"] == ids
        assert ours["token_ids"] == ref, prompt


def test_tokenizer_and_inspect_from_the_directory(hf_dir, hf_reference, winnow_bin, tmp_path):
    _, tokenizer = hf_reference
    for text in ["Hello, world!", "  spaces\tand\nnewlines  ", "数字 12345 and émojis 🙂",
                 "<|im_start|>user\nhi<|im_end|>"]:
        ours = run_winnow_json(winnow_bin, "tokenize", "--model", str(hf_dir), "--text", text)
        assert ours == tokenizer(text)["input_ids"], text
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    chat_file = tmp_path / "chat.json"
    chat_file.write_text(json.dumps(chat))
    rendered = run_winnow_json(winnow_bin, "tokenize", "--model", str(hf_dir), "--chat",
                               str(chat_file))
    assert rendered["prompt"] == tokenizer.apply_chat_template(chat, add_generation_prompt=True,
                                                               tokenize=False)
    info = run_winnow_json(winnow_bin, "inspect", "--model", str(hf_dir))
    assert info["format"] == "huggingface"
    assert info["config.json"]["model_type"] == "llama"
    assert info["tensor_count"] == 272
    tensors = run_winnow_json(winnow_bin, "inspect", "--model", str(hf_dir), "--tensors")
    norm = next(t for t in tensors if t["name"] == "model.norm.weight")
    assert norm["dtype"] == "BF16" and norm["shape"] == [576]
    values = run_winnow_json(winnow_bin, "inspect", "--model", str(hf_dir), "--dump-tensor",
                             "model.norm.weight")
    ref = hf_reference[0].model.norm.weight.detach().numpy()
    assert np.allclose(np.array(values).ravel(), ref)


def test_daemon_serves_a_chat_from_the_directory(hf_dir, hf_reference, monkeypatch):
    monkeypatch.setenv("WINNOW_MODEL", str(hf_dir))
    _, tokenizer = hf_reference
    with Daemon() as d:
        info = d.client.model_info()
        assert info.architecture == "llama"
        text, ids, final = d.client.generate_text(chat=[("user", "Say hello.")], max_tokens=64)
        assert final.usage.completion_tokens >= 1
        # The template is the directory's (chat_template.jinja), as transformers renders it.
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": "Say hello."}],
                                                 add_generation_prompt=True, tokenize=False)
        assert final.usage.prompt_tokens == len(tokenizer(rendered)["input_ids"])
        if final.finish_reason == pb2.FINISH_REASON_STOP:
            assert ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")


def with_generation_config(hf_dir, folder, generation):
    """The directory's files (linked) with another generation_config.json."""
    folder.mkdir()
    for f in hf_dir.iterdir():
        if f.name != "generation_config.json":
            (folder / f.name).symlink_to(f)
    (folder / "generation_config.json").write_text(json.dumps(generation))
    return folder


def test_generation_config_gives_the_sampling_defaults(hf_dir, winnow_bin, tmp_path, monkeypatch):
    """Fields a request leaves unset take generation_config.json's values (as vLLM does); set
    ones win. OpenAI's unset temperature is the model's default too (else 1)."""
    generation = {"eos_token_id": 2, "repetition_penalty": 1.5, "temperature": 0.0}
    monkeypatch.setenv("WINNOW_MODEL", str(with_generation_config(hf_dir, tmp_path / "m",
                                                                  generation)))
    prompt = "one two one two one two one two one two one two"
    with Daemon() as d:
        def tokens(**kwargs):
            return d.client.generate_text(prompt, max_tokens=16, ignore_eos=True, **kwargs)[1]

        unset = tokens()
        assert unset == tokens(repetition_penalty=1.5)
        assert unset != tokens(repetition_penalty=1.0)  # the default really acts here
        body = {"prompt": prompt, "max_tokens": 16, "ignore_eos": True}
        texts = set()
        for seed in (1, 2, 3):
            req = urllib.request.Request(f"{d.http_url}/v1/completions", method="POST",
                                         data=json.dumps({**body, "seed": seed}).encode(),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                texts.add(json.loads(r.read())["choices"][0]["text"])
        assert len(texts) == 1  # temperature 0 from generation_config: greedy, whatever seed

    bad = with_generation_config(hf_dir, tmp_path / "bad", {"temperature": -1.0})
    with pytest.raises(AssertionError) as err:
        run_winnow(winnow_bin, "generate", "--model", str(bad), "--prompt", "x",
                   "--max-tokens", "1")
    assert "generation_config.json: sampling.temperature = -1" in str(err.value)


# --- --cpu-weight-type: the directory's matrices quantised at load ------------------------------

# Measured on PROMPTS joined (38 tokens) with the default q8 activations against the weights as
# stored: q8_0 mean |Δ logprob| 0.10, max 0.38 (f32 activations: 0.038, 0.17); q4_0 0.99, 3.1.
# README, "Serving your own model", has every type over more text.
Q8_0_MEAN_DELTA, Q8_0_MAX_DELTA = 0.2, 0.8


def score_weights(winnow_bin, path, tmp_path, ids, weight_type, activations):
    tokens_file = tmp_path / "tokens.json"
    tokens_file.write_text(json.dumps(ids))
    return run_winnow_json(winnow_bin, "score", "--model", str(path), "--tokens-file",
                           str(tokens_file), "--kv-cache-dtype", "f32", "--cpu-activations",
                           activations, "--cpu-weight-type", weight_type)


def gguf_py_quantized(hf_dir, qtype):
    """transformers on the directory with every 2-D weight quantised and dequantised by gguf-py:
    the model --cpu-weight-type runs."""
    from gguf.quants import dequantize, quantize
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():  # the tied embeddings and head are one parameter
            if p.dim() == 2:
                w = p.numpy()
                p.copy_(torch.from_numpy(dequantize(quantize(w, qtype), qtype).reshape(w.shape)))
    return model.eval()


@pytest.mark.parametrize("weight_type", ["q8_0", "q4_0"])
def test_quantized_weights_score_like_transformers_on_gguf_py_weights(
        weight_type, hf_dir, hf_reference, winnow_bin, tmp_path):
    """Whatever the type loses, winnow computes the same model as the reference quantiser's."""
    from gguf import GGMLQuantizationType

    _, tokenizer = hf_reference
    ids = tokenizer(" ".join(PROMPTS))["input_ids"]
    model = gguf_py_quantized(hf_dir, GGMLQuantizationType[weight_type.upper()])
    ours = score_weights(winnow_bin, hf_dir, tmp_path, ids, weight_type, "f32")
    check_logits(ours, reference_logits(model, ids), ids)


def test_q8_0_weights_stay_close_to_the_stored_ones(hf_dir, hf_reference, winnow_bin, tmp_path):
    """With the default activations: small |Δ logprob|, the same greedy tokens on the first
    prompt. q4_0 moves further (a 4-bit step), which the same bounds catch."""
    _, tokenizer = hf_reference
    ids = tokenizer(" ".join(PROMPTS))["input_ids"]
    plain = score_weights(winnow_bin, hf_dir, tmp_path, ids, "none", "q8")

    def delta(weight_type):
        ours = score_weights(winnow_bin, hf_dir, tmp_path, ids, weight_type, "q8")
        return np.abs(np.array(ours["logprob_next"]) - np.array(plain["logprob_next"]))

    q8 = delta("q8_0")
    assert q8.mean() < Q8_0_MEAN_DELTA and q8.max() < Q8_0_MAX_DELTA, (q8.mean(), q8.max())
    q4 = delta("q4_0")
    assert q4.mean() > Q8_0_MEAN_DELTA, q4.mean()  # the bounds can fail

    def greedy(weight_type):
        return run_winnow_json(winnow_bin, "generate", "--model", str(hf_dir), "--prompt",
                               PROMPTS[0], "--max-tokens", "20", "--ignore-eos", "--json",
                               "--kv-cache-dtype", "f32", "--cpu-weight-type",
                               weight_type)["token_ids"]

    assert greedy("q8_0") == greedy("none")


# --- Tiny random checkpoints ------------------------------------------------------------------

HIDDEN, HEADS, KV_HEADS, FFN, LAYERS = 64, 4, 2, 128, 2
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
YARN_ROPE = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
             "original_max_position_embeddings": 256}
VARIANTS = {
    # name: (model_type, dtype, tied, config overrides, shard)
    "llama-llama3-f32": ("llama", torch.float32, False, {"rope_parameters": LLAMA3_ROPE}, False),
    "mistral-bf16-tied": ("mistral", torch.bfloat16, True, {"sliding_window": None}, False),
    "qwen2-f16-sharded": ("qwen2", torch.float16, False, {}, True),
    "qwen3-bf16": ("qwen3", torch.bfloat16, False, {"head_dim": 32}, False),
    # max_position_embeddings (1024) = factor x original: transformers then derives the same
    # attention factor from either.
    "qwen2-yarn-f32": ("qwen2", torch.float32, False, {"rope_parameters": YARN_ROPE}, False),
    # A window of 24 positions on every layer, crossed by the 300-token prompt.
    "mistral-window-f32": ("mistral", torch.float32, False, {"sliding_window": 24}, False),
    # Gemma 3: a sliding layer (window 24, rope base 10^4) then a global one (10^6), GeGLU,
    # post norms, QK-norm, query_pre_attn_scalar 256 (not head_dim 16), scaled embeddings.
    "gemma3-bf16": ("gemma3_text", torch.bfloat16, True,
                    {"sliding_window": 24, "head_dim": 16, "query_pre_attn_scalar": 256,
                     "layer_types": ["sliding_attention", "full_attention"]}, False),
}


def write_tiny(folder, name, model_type, dtype, tied, overrides, shard, tokenizer_dir, vocab):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        model_type, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=vocab,
        max_position_embeddings=1024, tie_word_embeddings=tied, rms_norm_eps=1e-6, **overrides)
    assert config.model_type == model_type
    torch.manual_seed(len(name))
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # larger than the default init, so that logits spread
        for p in model.parameters():
            p.normal_(0.0, 0.2 if p.dim() > 1 else 0.1).add_(1.0 if p.dim() == 1 else 0.0)
    path = folder / name
    model.to(dtype).save_pretrained(str(path), max_shard_size="2MB" if shard else "10GB")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / f, path / f)
    return path


@pytest.fixture(scope="module")
def tiny_dirs(hf_dir, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("tiny-hf")
    vocab = json.loads((hf_dir / "config.json").read_text())["vocab_size"]
    out = {}
    for name, (model_type, dtype, tied, overrides, shard) in VARIANTS.items():
        path = write_tiny(folder, name, model_type, dtype, tied, overrides, shard, hf_dir, vocab)
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
        model.eval()
        out[name] = (path, model)
    assert (out["qwen2-f16-sharded"][0] / "model.safetensors.index.json").exists()
    assert out["qwen2-f16-sharded"][1].model.layers[0].self_attn.q_proj.bias is not None
    assert out["mistral-bf16-tied"][1].config.tie_word_embeddings
    return out


@pytest.mark.parametrize("length", [40, 300])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_tiny_logits_match_transformers(name, length, tiny_dirs, winnow_bin, tmp_path):
    path, model = tiny_dirs[name]
    ids = np.random.default_rng(length).integers(3, 2000, size=length).tolist()
    check_logits(score(winnow_bin, path, tmp_path, ids), reference_logits(model, ids), ids)


@pytest.mark.parametrize("name", ["mistral-window-f32", "gemma3-bf16"])
def test_the_sliding_window_matters(name, tiny_dirs):
    """Without its window the reference's logits differ on the 300-token prompt."""
    from transformers import AutoModelForCausalLM

    path, windowed = tiny_dirs[name]
    plain = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32,
                                                 sliding_window=4096)
    ids = list(range(3, 303))
    assert (reference_logits(windowed, ids) - reference_logits(plain, ids)).abs().max() > 1e-2


def test_llama3_rope_scaling_matters(tiny_dirs):
    """Without its rope scaling the llama variant's logits differ at these positions."""
    from transformers import AutoModelForCausalLM

    path, scaled = tiny_dirs["llama-llama3-f32"]
    plain = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.float32,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    ids = list(range(3, 303))
    assert (reference_logits(scaled, ids) - reference_logits(plain, ids)).abs().max() > 1e-2


def failure(winnow_bin, path, tmp_path) -> str:
    tokens_file = tmp_path / "tokens.json"
    tokens_file.write_text("[1, 2, 3]")
    with pytest.raises(AssertionError) as err:
        run_winnow(winnow_bin, "score", "--model", str(path), "--tokens-file", str(tokens_file))
    return str(err.value)


def test_errors_name_the_file_and_field(tiny_dirs, winnow_bin, tmp_path):
    from safetensors.torch import load_file, save_file

    source, _ = tiny_dirs["qwen3-bf16"]
    broken = tmp_path / "broken"
    shutil.copytree(source, broken)
    weights = load_file(str(source / "model.safetensors"))

    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, str(broken / "model.safetensors"), metadata={"format": "pt"})
    assert "missing tensor model.layers.1.mlp.up_proj.weight" in failure(winnow_bin, broken,
                                                                         tmp_path)

    weights = load_file(str(source / "model.safetensors"))
    weights["model.norm.weight"] = weights["model.norm.weight"][:10].clone()
    save_file(weights, str(broken / "model.safetensors"), metadata={"format": "pt"})
    message = failure(winnow_bin, broken, tmp_path)
    assert "model.safetensors: tensor model.norm.weight has shape [10], expected [64]" in message

    shutil.copy(source / "model.safetensors", broken / "model.safetensors")
    config = json.loads((source / "config.json").read_text())
    config["model_type"] = "gemma2"
    (broken / "config.json").write_text(json.dumps(config))
    assert "config.json: model_type 'gemma2' is not supported" in failure(winnow_bin, broken,
                                                                          tmp_path)
    config["model_type"] = "qwen3"
    config["rope_parameters"] = {"rope_type": "dynamic", "factor": 2.0}
    (broken / "config.json").write_text(json.dumps(config))
    assert "rope_parameters.rope_type 'dynamic' is not supported" in failure(winnow_bin, broken,
                                                                             tmp_path)
    (broken / "config.json").unlink()
    assert "config.json is missing" in failure(winnow_bin, broken, tmp_path)
