#!/usr/bin/env python3
"""Writes the generated seed inputs of fuzz/corpus (the hand-written ones, YAML and JSON, are
committed as they are): small GGUF files, serialized GenerateRequests (through `protoc --encode`)
and NUL-separated chat-template and tokenizer inputs. Deterministic; run from anywhere:

    python3 fuzz/make_seeds.py
"""
import json
import pathlib
import struct
import subprocess

FUZZ = pathlib.Path(__file__).resolve().parent
CORPUS = FUZZ / "corpus"
ROOT = FUZZ.parent

# GGUF metadata value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
          BOOL: "<B", U64: "<Q", I64: "<q", F64: "<d"}


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def value(vtype, v):
    if vtype == STR:
        return gstr(v)
    if vtype == ARR:
        elem_type, items = v
        return struct.pack("<IQ", elem_type, len(items)) + b"".join(
            value(elem_type, i) for i in items)
    return struct.pack(SCALAR[vtype], v)


def gguf(kvs, tensors=(), version=3, alignment=32):
    """kvs: [(key, type, value)]; tensors: [(name, dims, ggml_type, data bytes)]."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for key, vtype, v in kvs:
        out += gstr(key) + struct.pack("<I", vtype) + value(vtype, v)
    offset, blobs = 0, b""
    for name, dims, ttype, data in tensors:
        out += gstr(name) + struct.pack("<I", len(dims))
        out += b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", ttype, offset)
        pad = (-len(data)) % alignment
        blobs += data + b"\0" * pad
        offset += len(data) + pad
    out += b"\0" * ((-len(out)) % alignment)
    return out + blobs


def every_type_kvs():
    return [
        ("general.architecture", STR, "llama"),
        ("general.name", STR, "fuzz-seed"),
        ("general.alignment", U32, 32),
        ("t.u8", U8, 200), ("t.i8", I8, -100), ("t.u16", U16, 60000), ("t.i16", I16, -30000),
        ("t.u32", U32, 4000000000), ("t.i32", I32, -2000000000), ("t.f32", F32, 1.5),
        ("t.bool", BOOL, 1), ("t.u64", U64, 2**63 + 5), ("t.i64", I64, -(2**62)),
        ("t.f64", F64, -2.25), ("t.str", STR, "h\u00e9llo"),
        ("t.arr_i32", ARR, (I32, [1, -2, 3])), ("t.arr_f32", ARR, (F32, [0.5, -1.0])),
        ("t.arr_str", ARR, (STR, ["a", "", "\u2581b"])), ("t.arr_empty", ARR, (U8, [])),
        ("t.nested", ARR, (ARR, [(U16, [1, 2]), (BOOL, [0, 1])])),
    ]


def llama_kvs(vocab):
    return [
        ("llama.context_length", U32, 256), ("llama.embedding_length", U32, 64),
        ("llama.block_count", U32, 1), ("llama.feed_forward_length", U32, 128),
        ("llama.attention.head_count", U32, 4), ("llama.attention.head_count_kv", U32, 2),
        ("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
        ("llama.rope.freq_base", F32, 10000.0), ("llama.rope.dimension_count", U32, 16),
        ("llama.rope.scaling.type", STR, "linear"), ("llama.rope.scaling.factor", F32, 2.0),
        ("llama.vocab_size", U32, vocab),
    ]


def spm_kvs():
    tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(4)] + [
        "\u2581", "a", "b", "ab", "\u2581ab", "<|user|>"]
    types = [2, 3, 3] + [6] * 4 + [1] * 5 + [4]
    return tokens, [
        ("tokenizer.ggml.model", STR, "llama"),
        ("tokenizer.ggml.tokens", ARR, (STR, tokens)),
        ("tokenizer.ggml.scores", ARR, (F32, [float(-i) for i in range(len(tokens))])),
        ("tokenizer.ggml.token_type", ARR, (I32, types)),
        ("tokenizer.ggml.unknown_token_id", U32, 0), ("tokenizer.ggml.bos_token_id", U32, 1),
        ("tokenizer.ggml.eos_token_id", U32, 2), ("tokenizer.ggml.add_bos_token", BOOL, 1),
        ("tokenizer.ggml.add_space_prefix", BOOL, 1),
        ("tokenizer.chat_template", STR,
         "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
         "message['content'] + '<|im_end|>\\n'}}{% endfor %}"),
    ]


def bpe_kvs():
    # GPT-2 byte stand-ins: "Ġ" is the space.
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "H", "e", "l", "o", "\u0120",
              "w", "r", "d", "He", "ll", "Hell", "Hello", "\u0120w", "or", "\u0120wor",
              "\u0120world"]
    merges = ["H e", "l l", "He ll", "Hell o", "\u0120 w", "o r", "\u0120w or", "\u0120wor ld"]
    return tokens, [
        ("tokenizer.ggml.model", STR, "gpt2"), ("tokenizer.ggml.pre", STR, "smollm"),
        ("tokenizer.ggml.tokens", ARR, (STR, tokens)),
        ("tokenizer.ggml.token_type", ARR, (I32, [3, 3, 3] + [1] * (len(tokens) - 3))),
        ("tokenizer.ggml.merges", ARR, (STR, merges)),
        ("tokenizer.ggml.bos_token_id", U32, 1), ("tokenizer.ggml.eos_token_id", U32, 2),
        ("tokenizer.chat_template", STR,
         "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}"
         "<|end_header_id|>\n\n{{ message['content'] | trim }}<|eot_id|>{% endfor %}"),
    ]


def tensors():
    f32 = struct.pack("<8f", *range(8))
    f16 = struct.pack("<32e", *[i / 8 for i in range(32)])
    q8_0 = struct.pack("<e", 0.5) + bytes(range(32))           # one block: 32 elements
    q4_1 = struct.pack("<ee", 0.25, -1.0) + bytes(range(16))   # one block: 32 elements
    return [("norm.weight", [8], 0, f32), ("cube", [2, 2, 2], 0, f32),
            ("half", [32], 1, f16), ("q8", [32, 1], 8, q8_0), ("q41", [32], 3, q4_1)]


def write(target, name, data):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)


def gguf_seeds():
    rich = gguf(every_type_kvs(), tensors())
    write("gguf_fuzz", "every_type_v3.gguf", rich)
    write("gguf_fuzz", "every_type_v2.gguf", gguf(every_type_kvs()[:8], tensors()[:2], 2))
    write("gguf_fuzz", "truncated_in_tensor_table.gguf", rich[: len(rich) - 200])
    tokens, kvs = spm_kvs()
    write("gguf_fuzz", "spm_vocab.gguf", gguf(llama_kvs(len(tokens)) + kvs))
    tokens, kvs = bpe_kvs()
    write("gguf_fuzz", "bpe_vocab.gguf", gguf(llama_kvs(len(tokens)) + kvs))
    write("gguf_fuzz", "align_64.gguf",
          gguf([("general.alignment", U32, 64)], tensors()[:1], alignment=64))


def request_seeds():
    texts = {
        "prompt": 'prompt: "The capital of France is" stopping { max_tokens: 8 }',
        "sampling": 'prompt: "Hi" sampling { temperature: 0.7 top_p: 0.9 top_k: 40 min_p: 0.05 '
                    'repetition_penalty: 1.1 frequency_penalty: 0.5 presence_penalty: -0.5 '
                    'seed: 7 } stopping { max_tokens: 4 stop: "\\n" stop: "." '
                    'stop_token_ids: 2 ignore_eos: true } logprobs: true top_logprobs: 3 '
                    'priority: 2 request_id: "r1" cache_salt: "tenant"',
        "chat": 'chat { messages { role: "system" content: "Be brief." } messages { role: "user" '
                'content: "Hello <|im_start|>" } add_generation_prompt: true } '
                'add_special_tokens: false',
        "token_ids": "token_ids { ids: [1, 100, 2000, 49151] } stopping { max_tokens: 2 }",
        "segments": 'segments { segments { text { text: "Look: " } } segments { embedding { '
                    'modality: "image" rows: 1 values: [' + ", ".join(["0.01"] * 576) +
                    '] } } segments { context { text: "a long document" } } }',
        "compression": 'prompt: "Summarise this text please" compression { policy: "xkv" '
                       'budget: 0.5 }',
    }
    proto = ROOT / "proto"
    for name, text in texts.items():
        data = subprocess.run(
            ["protoc", f"-I{proto}", "--encode=winnow.v1.GenerateRequest",
             str(proto / "winnow/v1/inference.proto")],
            input=text.encode(), capture_output=True, check=True).stdout
        write("request_fuzz", name + ".pb", data)


def chat_seeds():
    smollm2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != "
               "'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
               "trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + "
               "message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
               "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
    qwen = ("{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + "
            "messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\n"
            "You are Qwen.<|im_end|>\\n' }}{%- endif %}{%- for message in messages %}{{- "
            "'<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
            "{%- endfor %}")
    llama3 = ("{% for message in messages %}{% set content = '<|start_header_id|>' + "
              "message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
              "'<|eot_id|>' %}{{ content }}{% endfor %}")
    llama31 = ("{%- set date_string = \"26 Jul 2024\" %}<|start_header_id|>system"
               "<|end_header_id|>Cutting Knowledge Date: December 2023")
    convo = ["system", "Be brief.", "user", " Hello <|user|> world\t", "assistant", "Hi!"]
    for name, tmpl in [("smollm2", smollm2), ("qwen25", qwen), ("llama3", llama3),
                       ("llama31", llama31)]:
        write("chat_template_fuzz", name, "\0".join([tmpl, "\1"] + convo).encode())
    write("chat_template_fuzz", "unknown_role",
          "\0".join([smollm2, "\0", "tool", "x"]).encode())


def tokenizer_seeds():
    samples = {
        "ascii": "\7Hello world, the thing is 1234567 and   spaces\n\n",
        "special": "\3<s>hello<|user|> world</s><|im_start|>user\n<|im_end|>",
        "unicode": "\5h\u00e9llo \u4e16\u754c \U0001F600 \u2581 caf\u00e9",
        "bytes": b"\1\xff\xfe\x80 abc \xc3\x28 \xe2\x82".decode("latin-1"),
    }
    for name, text in samples.items():
        write("tokenizer_fuzz", name, text.encode("latin-1" if name == "bytes" else "utf-8"))


def safetensors(tensors):
    """tensors: [(name, dtype, shape, data bytes)] -> a safetensors image."""
    header, data = {"__metadata__": {"format": "pt"}}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def hf_seeds():
    """hf_fuzz: the first byte picks the reader (0 safetensors, 1 config.json, 2 tokenizer.json
    and a NUL-separated text)."""
    image = safetensors([("w", "F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)),
                         ("b", "BF16", [2], b"\x80\x3f\x00\x40"),
                         ("ids", "I64", [1], struct.pack("<q", 7))])
    write("hf_fuzz", "safetensors", b"\0" + image)
    write("hf_fuzz", "safetensors_truncated", b"\0" + image[:-5])
    config = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 1024, "vocab_size": 300,
              "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                  "original_max_position_embeddings": 64}}
    write("hf_fuzz", "config_llama3", b"\1" + json.dumps(config).encode())
    config = dict(config, model_type="qwen2", rope_parameters=None,
                  rope_scaling={"type": "yarn", "factor": 4.0}, sliding_window=512)
    write("hf_fuzz", "config_qwen2_yarn", b"\1" + json.dumps(config).encode())
    byte_level = {
        "version": "1.0",
        "added_tokens": [{"id": 5, "content": "<|im_end|>", "special": True,
                          "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False}],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "\\p{L}+|\\p{N}|\\s+"},
             "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "\u0120": 2, "ab": 3,
                                            "\u0120a": 4},
                  "merges": ["a b", "\u0120 a"], "ignore_merges": False},
    }
    write("hf_fuzz", "tokenizer_byte_level",
          b"\2" + json.dumps(byte_level).encode() + b"\0ab a<|im_end|>b")
    metaspace = {
        "added_tokens": [{"id": 0, "content": "<s>", "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581",
                          "prepend_scheme": "first", "split": False},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [0],
                                                      "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "byte_fallback": True, "fuse_unk": True, "unk_token": "<s>",
                  "vocab": dict({"<s>": 0, "\u2581": 1, "h": 2, "i": 3, "\u2581h": 4},
                                **{f"<0x{b:02X}>": 5 + b for b in range(256)}),
                  "merges": [["\u2581", "h"]]},
    }
    write("hf_fuzz", "tokenizer_metaspace",
          b"\2" + json.dumps(metaspace).encode() + "\0hi h\u00e9 \xff".encode())


if __name__ == "__main__":
    gguf_seeds()
    request_seeds()
    chat_seeds()
    tokenizer_seeds()
    hf_seeds()
