"""winnow's GGUF tokenizers against llama.cpp (llama-cpp-python, vocab_only), the reference.

* Byte-level BPE on the default model (SmolLM2, pre-tokenizer "smollm"): a deterministic corpus
  of several hundred strings, with and without special-token parsing, must give llama.cpp's ids
  exactly and decode back to the input byte for byte. Invalid UTF-8 goes through --text-file.
* transformers loading the same GGUF is compared too; it is not the reference, so differences
  are only reported (see docs/tokenizer.md).
* SentencePiece: a tiny SPM vocabulary is trained at test time, written as a vocab-only GGUF
  (with and without add_space_prefix) and compared with llama.cpp in the same way.
* Chat templates: the prompt `winnow tokenize --chat` renders equals jinja2 rendering of the
  model's own template.
"""
import json
import random
import subprocess
from pathlib import Path

import pytest

from conftest import run_winnow

llama_cpp = pytest.importorskip("llama_cpp")

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>", "<file_sep>",
            "<filename>", "<issue_start>", "<jupyter_code>", "<empty_output>"]


def fixed_strings() -> list[str]:
    s = [
        # empty-ish and whitespace
        "", " ", "  ", "   ", "\n", "\n\n", "\n\n\n", "\t", "\t\t", " \t ", "\r\n", "\r\n\r\n",
        " \n", "\n ", "  \n  ", "a\n", "\na", "a  b", "a   b", "a\tb", "a\t\tb", "a \n b",
        "trailing   ", "   leading", "  both  ", "\u00a0", "\u3000", "\u200b", "\u2028",
        "a\u00a0b", "a\u2009b", "a\u0085b", "a\u3000b", "a \u00a0 b", "x\u200dy", "\u000b\u000c",
        "line1\nline2\n\nline3", "indent:\n    four\n\ttab\n        eight",
        # ASCII prose and contractions
        "Hello world", "Hello, world!", "hello", "HELLO",
        "The quick brown fox jumps over the lazy dog.",
        "I'm", "don't", "they'll", "we've", "she'd", "it's", "you're", "DON'T", "I'M", "It'S",
        "'s", "'t", "'re 've 'm 'll 'd", "rock'n'roll", "O'Neil's", "''", "'", "\"quoted\"",
        "What's up?", "Isn't it?!", "Well... maybe.", "e.g. i.e. etc.", "a-b_c.d/e\\f",
        # digits
        "1", "12", "123", "1234", "12345", "1234567890", "3.14159", "1,000,000", "-42", "+7",
        "0x1F", "1e-10", "2024-01-15", "12:30:45", "$1,234.56", "50%", "v1.2.3", "100km/h",
        "\uff12\uff10\uff12\uff14", "\u0661\u0662\u0663", "\u00bd \u00b2 \u2460", "\u0967\u0968",
        # accents and combining marks
        "caf\u00e9", "na\u00efve", "\u00dcn\u00efc\u00f6d\u00e9", "fa\u00e7ade", "Se\u00f1or",
        "e\u0301", "n\u0303o", "Zo\u00eb \u00c5ngstr\u00f6m", "\u0141\u00f3d\u017a", "stra\u00dfe",
        "\u0130stanbul", "\u1e9e", "\u00ff\u0178",
        # emoji (incl. ZWJ, modifiers, flags, keycaps)
        "\U0001F600", "\U0001F44D\U0001F3FD",
        "\U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466",
        "\U0001F3F3\ufe0f\u200d\U0001F308", "\U0001F1FA\U0001F1F8", "1\ufe0f\u20e3",
        "I \u2764\ufe0f NY", "\U0001F9D1\U0001F3FF\u200d\U0001F4BB",
        "\U0001F600\U0001F601\U0001F602",
        "emoji\U0001F680rocket", "\u2603 \u2615 \u26a1",
        # CJK, Arabic, Hindi and others
        "\u4e2d\u6587\u6d4b\u8bd5", "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8",
        "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8", "\u4f60\u597d\uff0c\u4e16\u754c\uff01",
        "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
        "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
        "\u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440", "\u0393\u03b5\u03b9\u03ac",
        "\u05e9\u05dc\u05d5\u05dd", "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35",
        "Mixed \u4e2d\u6587 and English",
        "\u00bfQu\u00e9 tal? \u00a1Bien!", "\u2018curly\u2019 \u201cquotes\u201d \u2014 dash\u2026",
        # code
        "def f(x):\n    return x * 2\n", "int main() { return 0; }",
        "for (int i = 0; i < n; ++i) {}",
        "{\"key\": [1, 2, {\"a\": null}]}", "<div class=\"x\">Hi</div>",
        "SELECT * FROM t WHERE id=1;",
        "x += 1  # comment", "a->b->c", "std::vector<int> v{1,2,3};", "if (a && b || !c) {}",
        "#include <stdio.h>", "$ ls -la | grep foo > out.txt", "https://example.com/a?b=c&d=e",
        "    \n\t\tcode\n", "```python\nprint('hi')\n```",
        # special tokens inside text
        "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>user\nHi<|im_end|>\n",
        "a<|im_start|>b", "<|im_start|><|im_end|>", "<|im_start", "im_start|>", "<|im_end|>x",
        " <|im_start|> ", "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n",
        "<repo_name>x<file_sep>y", "<reponame><filename>", "<|endoftext|><|endoftext|>",
        "text<|endoftext|>more text", "<|IM_START|>", "< |im_start| >", "<<|im_end|>>",
    ]
    return s


def random_strings(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    pieces = ["the", "The", " cat", " sat", "on", " a", "mat", "I'm", "we'll", "'s", " ", "  ",
              "\n", "\t", "\r\n", ".", ",", "!", "?", "...", "-", "_", "(", ")", "[", "]", "{", "}",
              "\"", "'", "0", "7", "42", "123", "98765", "3.5", "caf\u00e9", "\u00fc", "\u00f1",
              "\u4e2d", "\u6587", "\u3002", "\u3042", "\u30ab", "\ud55c", "\u0645", "\u0928\u092e",
              "\u0416", "\u03a9", "\U0001F600", "\u200d", "\U0001F468", "\ufe0f", "\u00a0",
              "\u3000",
              "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<", ">", "|", "=", "+", "*", "/",
              "\\", "#", "@", "$", "%", "&", "^", "~", "`", "def ", "return", " x", "==",
              "\u2028", "\u0301", "\U0001F1EF\U0001F1F5", "1\ufe0f\u20e3", "\u00bd", "\uff11"]
    out = []
    for _ in range(count):
        n = rng.randint(1, 24)
        out.append("".join(rng.choice(pieces) for _ in range(n)))
    return out


def corpus() -> list[str]:
    strings = fixed_strings() + random_strings(260, seed=20240601)
    strings.append(" ".join(random_strings(120, seed=7)))  # one long mixed document
    return strings


def write_jsonl(path: Path, strings: list[str]) -> Path:
    path.write_text("".join(json.dumps(s) + "\n" for s in strings), encoding="utf-8")
    return path


def winnow_batch(winnow_bin, model, strings, tmp_path, *flags) -> list[dict]:
    jsonl = write_jsonl(tmp_path / "in.jsonl", strings)
    out = run_winnow(winnow_bin, "tokenize", "--model", str(model), "--jsonl", str(jsonl),
                     "--round-trip", *flags)
    rows = [json.loads(line) for line in out.split("\n") if line]
    assert len(rows) == len(strings)
    return rows


def compare_with_llama(llama, rows, strings, add_special, parse_special):
    mismatches = []
    for s, row in zip(strings, rows):
        ref = llama.tokenize(s.encode("utf-8"), add_bos=add_special, special=parse_special)
        if row["ids"] != ref:
            mismatches.append((s, row["ids"], ref))
    assert not mismatches, (f"{len(mismatches)} of {len(strings)} strings differ from llama.cpp; "
                            f"first: {mismatches[:3]!r}")


@pytest.fixture(scope="module")
def bpe_llama(model_path):
    return llama_cpp.Llama(model_path=str(model_path), vocab_only=True, verbose=False)


def test_corpus_size():
    assert len(corpus()) >= 300


@pytest.mark.parametrize("parse_special", [True, False])
def test_bpe_matches_llama_cpp(winnow_bin, model_path, bpe_llama, tmp_path, parse_special):
    strings = corpus()
    flags = [] if parse_special else ["--no-parse-special"]
    rows = winnow_batch(winnow_bin, model_path, strings, tmp_path, *flags)
    compare_with_llama(bpe_llama, rows, strings, add_special=True, parse_special=parse_special)
    # Exact round trip: special tokens render as their text when decoding with render_special.
    bad = [(s, r["text"]) for s, r in zip(strings, rows) if r["text"] != s]
    assert not bad, f"{len(bad)} strings do not round-trip; first: {bad[:3]!r}"
    for s, r in zip(strings[:150], rows[:150]):
        assert r["text"].encode() == bpe_llama.detokenize(r["ids"], special=True), s


def test_bpe_no_special_matches_llama_cpp(winnow_bin, model_path, bpe_llama, tmp_path):
    strings = corpus()[:120]
    rows = winnow_batch(winnow_bin, model_path, strings, tmp_path, "--no-special")
    compare_with_llama(bpe_llama, rows, strings, add_special=False, parse_special=True)


@pytest.mark.parametrize("raw", [b"\xff\xfe abc", b"caf\xc3", b"\xed\xa0\x80 surrogate",
                                 b"\xc0\xaf overlong", b"ok \xf0\x9f\x98 cut", b"\x80\x80\x80",
                                 b"nul\x00byte", b"\xe2\x82 cut3", b"a\xc3\xa9\xff"])
def test_bpe_invalid_utf8_matches_llama_cpp(winnow_bin, model_path, bpe_llama, tmp_path, raw):
    f = tmp_path / "raw.txt"
    f.write_bytes(raw)
    ids = json.loads(run_winnow(winnow_bin, "tokenize", "--model", str(model_path),
                                "--text-file", str(f)))
    assert ids == bpe_llama.tokenize(raw, add_bos=True, special=True)


def test_text_flag_and_decode(winnow_bin, model_path, bpe_llama):
    text = "Hello <|im_start|>world \U0001F600"
    ids = json.loads(run_winnow(winnow_bin, "tokenize", "--model", str(model_path), "--text", text))
    assert ids == bpe_llama.tokenize(text.encode(), add_bos=True, special=True)
    decoded = run_winnow(winnow_bin, "tokenize", "--model", str(model_path), "--decode-ids",
                         json.dumps(ids), "--render-special")
    assert decoded == text
    # Control tokens are not rendered unless asked for, as llama_token_to_piece.
    plain = run_winnow(winnow_bin, "tokenize", "--model", str(model_path), "--decode-ids",
                       json.dumps(ids))
    assert plain == "Hello world \U0001F600"


def test_cli_errors(winnow_bin, model_path):
    proc = subprocess.run([str(winnow_bin), "tokenize", "--model", str(model_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "exactly one of" in proc.stderr
    proc = subprocess.run([str(winnow_bin), "tokenize", "--model", "/nonexistent.gguf",
                           "--text", "x"], capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stderr


def test_transformers_differences_are_reported(winnow_bin, model_path, tmp_path, hf_tokenizer):
    """Not an equality check: llama.cpp is the reference. Prints where transformers differs."""
    strings = corpus()
    rows = winnow_batch(winnow_bin, model_path, strings, tmp_path)
    diffs = []
    for s, row in zip(strings, rows):
        hf = hf_tokenizer(s, add_special_tokens=True)["input_ids"]
        if hf != row["ids"]:
            diffs.append({"text": s, "winnow_llama_cpp": row["ids"], "transformers": hf})
    print(f"\ntransformers differs from llama.cpp/winnow on {len(diffs)} of {len(strings)} strings")
    for d in diffs[:5]:
        print(repr(d["text"][:60]), d["winnow_llama_cpp"][:16], d["transformers"][:16])
    (tmp_path / "transformers_diffs.json").write_text(json.dumps(diffs, ensure_ascii=False))


# --- other pre-tokenizers ---------------------------------------------------------------------

def read_gguf_metadata(path: Path, keys: set[str]) -> dict:
    """The wanted key/values of a GGUF header (gguf.GGUFReader maps every tensor and takes
    seconds on the model; the tokenizer arrays sit at the start of the file)."""
    import struct

    scalar = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
              11: "<q", 12: "<d"}
    with open(path, "rb") as f:
        data = f.read(64 << 20)
    pos = 24  # magic, version, tensor count
    (n_kv,) = struct.unpack_from("<Q", data, 16)

    def read_string():
        nonlocal pos
        (n,) = struct.unpack_from("<Q", data, pos)
        pos += 8 + n
        return data[pos - n:pos].decode("utf-8")

    def read_value(t):
        nonlocal pos
        if t == 8:
            return read_string()
        if t == 9:
            (et, n) = struct.unpack_from("<IQ", data, pos)
            pos += 12
            return [read_value(et) for _ in range(n)]
        fmt = scalar[t]
        (v,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v

    out = {}
    for _ in range(n_kv):
        key = read_string()
        (t,) = struct.unpack_from("<I", data, pos)
        pos += 4
        value = read_value(t)
        if key in keys:
            out[key] = value
    return out


@pytest.fixture(scope="module")
def smollm_vocab(model_path):
    meta = read_gguf_metadata(model_path, {"tokenizer.ggml.tokens", "tokenizer.ggml.merges",
                                           "tokenizer.ggml.token_type"})
    return {"tokens": meta["tokenizer.ggml.tokens"], "merges": meta["tokenizer.ggml.merges"],
            "types": meta["tokenizer.ggml.token_type"]}


def build_bpe_gguf(tmp_path: Path, vocab: dict, pre: str) -> Path:
    """SmolLM2's vocabulary and merges under another tokenizer.ggml.pre: llama.cpp then applies
    that pre-tokenizer's regex list, so this checks winnow's splitting for each of them."""
    gguf = pytest.importorskip("gguf")
    path = tmp_path / f"bpe_{pre}.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(128)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_rope_dimension_count(16)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(vocab["tokens"])
    w.add_token_types(vocab["types"])
    w.add_token_merges(vocab["merges"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("pre", ["default", "gpt-2", "llama-bpe", "qwen2", "starcoder", "falcon",
                                 "deepseek-llm", "deepseek-coder", "deepseek-v3", "dbrx",
                                 "command-r"])
def test_pre_tokenizers_match_llama_cpp(winnow_bin, tmp_path, smollm_vocab, pre):
    path = build_bpe_gguf(tmp_path, smollm_vocab, pre)
    llama = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    strings = corpus()
    rows = winnow_batch(winnow_bin, path, strings, tmp_path)
    compare_with_llama(llama, rows, strings, add_special=True, parse_special=True)


# --- SentencePiece -------------------------------------------------------------------------

SPM_WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world",
             "token", "izer", "piece", "sentence", "caf\u00e9", "na\u00efve", "stra\u00dfe",
             "running", "runner", "ran", "12", "345", "6789", "a", "an", "and", "of", "to"]


def spm_corpus_lines(n: int) -> list[str]:
    rng = random.Random(99)
    lines = []
    for _ in range(n):
        words = [rng.choice(SPM_WORDS) for _ in range(rng.randint(3, 12))]
        lines.append(" ".join(words).capitalize() + rng.choice([".", "!", "?", ","]))
    return lines


def build_spm_gguf(tmp_path: Path, add_space_prefix: bool | None,
                   chat_template: str | None = None, name: str | None = None) -> Path:
    sentencepiece = pytest.importorskip("sentencepiece")
    gguf = pytest.importorskip("gguf")
    text = tmp_path / "spm_corpus.txt"
    text.write_text("\n".join(spm_corpus_lines(400)) + "\n", encoding="utf-8")
    prefix = tmp_path / "tiny_spm"
    if not prefix.with_suffix(".model").exists():
        sentencepiece.SentencePieceTrainer.train(
            input=str(text), model_prefix=str(prefix), vocab_size=400, model_type="bpe",
            byte_fallback=True, character_coverage=1.0, user_defined_symbols=["<|user|>"],
            control_symbols=["<|ctl|>"], num_threads=1, minloglevel=2)
    sp = sentencepiece.SentencePieceProcessor(model_file=str(prefix.with_suffix(".model")))
    tokens, scores, types = [], [], []
    user_defined = {"<|user|>"}
    for i in range(sp.get_piece_size()):
        piece = sp.id_to_piece(i)
        tokens.append(piece)
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            types.append(gguf.TokenType.UNKNOWN)
        elif sp.is_control(i):
            types.append(gguf.TokenType.CONTROL)
        elif sp.is_byte(i):
            types.append(gguf.TokenType.BYTE)
        elif piece in user_defined:
            types.append(gguf.TokenType.USER_DEFINED)
        elif sp.is_unused(i):
            types.append(gguf.TokenType.UNUSED)
        else:
            types.append(gguf.TokenType.NORMAL)
    name = name or {None: "default", True: "prefix", False: "noprefix"}[add_space_prefix]
    path = tmp_path / f"tiny_spm_{name}.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    # Minimal llama hyper-parameters: llama.cpp reads them even for vocab_only.
    w.add_context_length(128)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_rope_dimension_count(16)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(sp.unk_id())
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    if add_space_prefix is not None:
        w.add_add_space_prefix(add_space_prefix)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def spm_strings() -> list[str]:
    rng = random.Random(5)
    s = ["", " ", "  ", "hello", "Hello world", " leading", "trailing ", "a  b",
         "the quick brown fox",
         "caf\u00e9 na\u00efve stra\u00dfe", "unknown z\u00fcrich \u00e6\u00f8\u00e5", "\U0001F600",
         "\u4e2d\u6587", "12345 6789", "tab\there", "new\nline", "<s>", "</s>", "<unk>",
         "a<s>b", "<s> hello </s>", "<|user|>hi", "x <|user|> y", "<|ctl|>", "<|ctl|> ctl",
         "\u2581already", "Running runner ran.", "!?,.", "  \n  ", "\u00a0"]
    s += [" ".join(rng.choice(SPM_WORDS + ["<s>", "\U0001F44D", "\u00e9", "zz", "<|user|>"])
                   for _ in range(rng.randint(1, 10))) for _ in range(90)]
    return s


@pytest.mark.parametrize("add_space_prefix", [None, False])
def test_spm_matches_llama_cpp(winnow_bin, tmp_path, add_space_prefix):
    path = build_spm_gguf(tmp_path, add_space_prefix)
    llama = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    strings = spm_strings()
    for parse_special in (True, False):
        flags = [] if parse_special else ["--no-parse-special"]
        rows = winnow_batch(winnow_bin, path, strings, tmp_path, *flags)
        compare_with_llama(llama, rows, strings, add_special=True, parse_special=parse_special)
    rows = winnow_batch(winnow_bin, path, strings, tmp_path, "--no-special")
    compare_with_llama(llama, rows, strings, add_special=False, parse_special=True)
    # Pieces as llama_token_to_piece gives them; without special tokens in the text, the input
    # comes back behind BOS and (with add_space_prefix) one space.
    rows = winnow_batch(winnow_bin, path, strings, tmp_path)
    for s, row in zip(strings, rows):
        assert row["text"].encode() == llama.detokenize(row["ids"], special=True), s
        if s and "<" not in s and "\u2581" not in s:
            prefix = "" if add_space_prefix is False else " "
            assert row["text"] == "<s>" + prefix + s, s


# --- chat templates --------------------------------------------------------------------------

CONVERSATIONS = [
    [{"role": "user", "content": "Hi there!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi! How can I help?"},
     {"role": "user", "content": "Tell me a joke.\nA short one."}],
    [{"role": "system", "content": "  spaced  "}, {"role": "user", "content": "\u4e2d\u6587 \U0001F600"}],
    [],
]


@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_jinja(winnow_bin, model_path, tmp_path, bpe_llama, conversation,
                                     add_generation_prompt):
    jinja2 = pytest.importorskip("jinja2")
    template = bpe_llama.metadata["tokenizer.chat_template"]
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)  # as transformers renders
    expected = env.from_string(template).render(messages=conversation,
                                                add_generation_prompt=add_generation_prompt,
                                                bos_token="", eos_token="<|im_end|>")
    f = tmp_path / "chat.json"
    f.write_text(json.dumps({"messages": conversation,
                             "add_generation_prompt": add_generation_prompt}))
    out = json.loads(run_winnow(winnow_bin, "tokenize", "--model", str(model_path), "--chat",
                                str(f)))
    assert out["prompt"] == expected
    assert out["ids"] == bpe_llama.tokenize(expected.encode(), add_bos=True, special=True)


def test_chat_template_matches_transformers(winnow_bin, model_path, tmp_path, hf_tokenizer):
    for conversation in CONVERSATIONS[:4]:
        expected = hf_tokenizer.apply_chat_template(conversation, tokenize=False,
                                                    add_generation_prompt=True)
        f = tmp_path / "chat.json"
        f.write_text(json.dumps(conversation))
        out = json.loads(run_winnow(winnow_bin, "tokenize", "--model", str(model_path),
                                    "--chat", str(f)))
        assert out["prompt"] == expected


# Templates of other families, rendered through a tiny GGUF (its BOS text is "<s>").
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")

LLAMA31_TEMPLATE = """{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

QWEN25_TEMPLATE = """{%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- else %}
    {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant") %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""


@pytest.mark.parametrize("name,template", [("llama3", LLAMA3_TEMPLATE),
                                           ("llama31", LLAMA31_TEMPLATE),
                                           ("qwen25", QWEN25_TEMPLATE)])
def test_other_chat_templates_match_jinja(winnow_bin, tmp_path, name, template):
    jinja2 = pytest.importorskip("jinja2")
    path = build_spm_gguf(tmp_path, None, chat_template=template, name=name)
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    for conversation in CONVERSATIONS[:4]:
        for add_generation_prompt in (True, False):
            expected = env.from_string(template).render(
                messages=conversation, add_generation_prompt=add_generation_prompt,
                bos_token="<s>")
            f = tmp_path / "chat.json"
            f.write_text(json.dumps({"messages": conversation,
                                     "add_generation_prompt": add_generation_prompt}))
            out = json.loads(run_winnow(winnow_bin, "tokenize", "--model", str(path), "--chat",
                                        str(f)))
            assert out["prompt"] == expected, (name, conversation)


# Qwen2.5's template with its tool sections (Hermes format): what winnow renders for every
# ChatML model when a request carries tools, tool calls or tool results.
QWEN25_TOOLS_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city, \u00e0 la carte",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"enum": ["c", "f"]}, "days": {"type": "integer"}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object",
                                                                    "properties": {}}}}]

TOOL_CONVERSATIONS = [
    [{"role": "user", "content": "Weather in Oslo?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Oslo?"},
     {"role": "assistant", "content": "", "tool_calls": [
         {"id": "call_1", "type": "function",
          "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "days": 2}'}},
         {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": "{}"}}]},
     {"role": "tool", "tool_call_id": "call_1", "content": '{"celsius": 4}'},
     {"role": "tool", "tool_call_id": "call_2", "content": "12:00"},
     {"role": "assistant", "content": "4 \u00b0C at noon."},
     {"role": "user", "content": "Thanks"}],
    [{"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Let me check.", "tool_calls": [
         {"id": "c", "type": "function",
          "function": {"name": "get_weather", "arguments": '{"city":"Lima","unit":"c"}'}}]},
     {"role": "tool", "tool_call_id": "c", "content": "sunny"}],
]


@pytest.mark.parametrize("with_tools", [True, False])
def test_tool_rendering_matches_qwen25_template(winnow_bin, tmp_path, with_tools):
    """Tools, tool calls and tool results render as Qwen2.5's template does under transformers
    (its tojson: json.dumps with ensure_ascii=False; arguments given as JSON text are parsed
    first, as vLLM does before rendering)."""
    jinja2 = pytest.importorskip("jinja2")
    path = build_spm_gguf(tmp_path, None, chat_template=QWEN25_TOOLS_TEMPLATE, name="qwen25")
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x: json.dumps(x, ensure_ascii=False)
    for conversation in TOOL_CONVERSATIONS:
        parsed = json.loads(json.dumps(conversation))
        for m in parsed:
            for call in m.get("tool_calls", []):
                call["function"]["arguments"] = json.loads(call["function"]["arguments"])
        tools = TOOLS if with_tools else None
        expected = env.from_string(QWEN25_TOOLS_TEMPLATE).render(
            messages=parsed, tools=tools, add_generation_prompt=True, bos_token="<s>")
        f = tmp_path / "chat.json"
        f.write_text(json.dumps({"messages": conversation, "tools": tools or []}))
        out = json.loads(run_winnow(winnow_bin, "tokenize", "--model", str(path), "--chat",
                                    str(f)))
        assert out["prompt"] == expected, conversation
