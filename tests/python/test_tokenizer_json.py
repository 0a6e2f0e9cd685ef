"""winnow's tokenizer.json reader against the Hugging Face `tokenizers` library, the reference.

For every supported family (tokenizer_json_families.py builds their files at test time), a
held-out corpus of varied strings must give the ids `Tokenizer.encode` gives, with special tokens
added or not and with special-token text parsed or not (`encode_special_tokens`). Invalid UTF-8
goes through --text-file and must equal encoding the text Python's
bytes.decode("utf-8", errors="replace") makes. Decoding must give the text back.
"""
import json
import random
import subprocess
import unicodedata
from pathlib import Path

import pytest

from conftest import run_winnow

tokenizers = pytest.importorskip("tokenizers")
import tokenizer_json_families as families  # noqa: E402 (needs tokenizers)

FAMILIES = ["smollm2-gguf", "smollm2", "llama3", "qwen2", "kitchen-sink", "llama2",
            "mistral-metaspace", "metaspace-legacy", "gemma3"]
BYTE_LEVEL = {"smollm2-gguf", "smollm2", "llama3", "qwen2"}
ADDED_TEXTS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>",
               "<tool_call>", "</tool_call>", "<think>", "<s>", "</s>", "<unk>", "[INST]",
               "[/INST]", "<extra>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>",
               "<lstrip>", "<rstrip>", "word", "<norm>", "<both>"]


def held_out_strings() -> list[str]:
    s = [
        "", " ", "  ", "\n", "\n\n", "\t", " \t ", "\r\n", "a  b", "a   b", "trailing   ",
        "   leading", "  both  ", "\u00a0", "\u3000", "a\u0085b", "a\u2009b", "x\u200dy",
        "line one\nline two\n\n\tindented", "Hello, world!", "HELLO world", "I'M here",
        "they'll we've she'd it's", "rock'n'roll", "What's up?!", "e.g. i.e. etc...",
        "1", "12", "123", "1234", "12345678901234567890", "3.14159", "1,000,000", "-42",
        "2024-01-15T12:30:45Z", "$1,234.56", "v1.2.3", "\uff12\uff10\uff12\uff14",
        "\u0661\u0662\u0663", "\u00bd \u00b2 \u2460", "caf\u00e9 na\u00efve", "cafe\u0301",
        "e\u0301\u0301", "n\u0303o", "\u1e9b\u0323", "\u0041\u030a\u0323", "\ufb01", "\u212b",
        "\u1100\u1161\u11a8", "\uac00\u11a8", "Zo\u00eb \u00c5ngstr\u00f6m", "stra\u00dfe",
        "\U0001F600", "\U0001F44D\U0001F3FD", "\U0001F468\u200d\U0001F469\u200d\U0001F467",
        "\U0001F1FA\U0001F1F8", "1\ufe0f\u20e3", "I \u2764\ufe0f NY",
        "\u4e2d\u6587\u6d4b\u8bd5", "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8",
        "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8", "\u4f60\u597d\uff0c\u4e16\u754c\uff01",
        "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
        "\u0928\u092e\u0938\u094d\u0924\u0947", "\u041f\u0440\u0438\u0432\u0435\u0442",
        "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35", "\u2581already \u2581spm",
        "def f(x):\n    return x * 2\n", "int main() { return 0; }",
        "{\"key\": [1, 2, {\"a\": null}]}", "<div class=\"x\">Hi</div>", "a->b->c",
        "x += 1  # comment", "https://example.com/a?b=c&d=e", "```python\nprint('hi')\n```",
        "snake_case-and-kebab-case, done.", "a - b -- c", "x#y##z", "..,,;;", "word words sword",
        " word ", "a\t\tb\tc",
    ]
    for t in ADDED_TEXTS:
        s += [t, f"a{t}b", f" {t} ", f"x  {t}  y", f"{t}{t}", f"{t[:-1]}", f"Hi {t}\nthere"]
    s += ["<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
          "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
          "<s>[INST] Hello [/INST] Hi</s>", "<start_of_turn>user\nHi<end_of_turn>\n",
          "<<|im_end|>>", "<|IM_START|>", "a <extra> b<extra>c", "<norm> <norm>x"]
    rng = random.Random(20260131)
    pieces = ["the", " cat", " sat", "I'm", " ", "  ", "\n", "\t", ".", ",", "!", "-", "#", "(",
              "0", "7", "42", "98765", "caf\u00e9", "e\u0301", "\u4e2d", "\u3042", "\ud55c",
              "\U0001F600", "\u200d", "\u00a0", "\u2581", "word", "\u0915\u093c"] + ADDED_TEXTS
    for _ in range(200):
        s.append("".join(rng.choice(pieces) for _ in range(rng.randint(1, 20))))
    s.append(" ".join(s[:120]))  # one long document
    return s


INVALID_UTF8 = [b"\xff\xfe abc", b"caf\xc3", b"\xed\xa0\x80 surrogate", b"\xc0\xaf overlong",
                b"ok \xf0\x9f\x98 cut", b"\x80\x80\x80", b"nul\x00byte", b"\xe2\x82 cut3",
                b"a\xc3\xa9\xff", b"<|im_start|>\xff<|im_end|>", b"\xf4\x90\x80\x80 big"]


@pytest.fixture(scope="module")
def family_files(model_path, tmp_path_factory) -> dict[str, Path]:
    return families.build_all(model_path, tmp_path_factory.mktemp("tokenizer_json"))


def reference(path: Path, parse_special: bool):
    tok = tokenizers.Tokenizer.from_file(str(path))
    tok.encode_special_tokens = not parse_special
    return tok


def winnow_rows(winnow_bin, path: Path, strings, tmp_path: Path, *flags) -> list[dict]:
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text("".join(json.dumps(s) + "\n" for s in strings), encoding="utf-8")
    out = run_winnow(winnow_bin, "tokenize", "--tokenizer-json", str(path), "--jsonl", str(jsonl),
                     "--round-trip", *flags)
    rows = [json.loads(line) for line in out.split("\n") if line]
    assert len(rows) == len(strings)
    return rows


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("add_special,parse_special", [(True, True), (False, True),
                                                       (True, False)])
def test_ids_match_tokenizers(winnow_bin, family_files, tmp_path, family, add_special,
                              parse_special):
    strings = held_out_strings()
    flags = ([] if add_special else ["--no-special"]) + (
        [] if parse_special else ["--no-parse-special"])
    rows = winnow_rows(winnow_bin, family_files[family], strings, tmp_path, *flags)
    ref = reference(family_files[family], parse_special)
    bad = []
    for s, row in zip(strings, rows):
        expected = ref.encode(s, add_special_tokens=add_special).ids
        if row["ids"] != expected:
            bad.append((s, row["ids"][:20], expected[:20]))
    assert not bad, f"{len(bad)} of {len(strings)} differ from tokenizers; first: {bad[:3]!r}"


@pytest.mark.parametrize("family", FAMILIES)
def test_invalid_utf8_is_replaced_as_python_does(winnow_bin, family_files, tmp_path, family):
    ref = reference(family_files[family], parse_special=True)
    for raw in INVALID_UTF8:
        f = tmp_path / "raw.txt"
        f.write_bytes(raw)
        ids = json.loads(run_winnow(winnow_bin, "tokenize", "--tokenizer-json",
                                    str(family_files[family]), "--text-file", str(f)))
        assert ids == ref.encode(raw.decode("utf-8", errors="replace")).ids, raw


def expected_decoding(family: str, text: str) -> str:
    """What decoding the ids of `text` (no BOS/EOS) gives back: the text itself for byte-level
    families (NFC-normalized for Qwen2); SentencePiece-style ones keep the space they prefixed
    to the text, as llama.cpp's pieces do."""
    if family == "qwen2":
        return unicodedata.normalize("NFC", text)
    if family == "llama2" and text:  # Prepend("▁") always
        return " " + text
    if family in ("mistral-metaspace", "metaspace-legacy") and text and not text.startswith(" "):
        return " " + text
    return text


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "kitchen-sink"])
def test_decode_round_trips(winnow_bin, family_files, tmp_path, family):
    # Strings without added-token text: an added token would also start a new "first" piece.
    strings = [s for s in held_out_strings()
               if not any(t in s for t in ADDED_TEXTS + ["\u2581"])]
    rows = winnow_rows(winnow_bin, family_files[family], strings, tmp_path, "--no-special")
    bad = [(s, r["text"]) for s, r in zip(strings, rows)
           if r["text"] != expected_decoding(family, s)]
    assert not bad, f"{len(bad)} of {len(strings)} do not round-trip; first: {bad[:3]!r}"
    if family in BYTE_LEVEL:  # tokenizers' own decode agrees where it has no whole-text step
        ref = reference(family_files[family], parse_special=True)
        for s, r in zip(strings, rows):
            assert ref.decode(r["ids"], skip_special_tokens=False) == r["text"], s


def test_special_tokens_render_only_when_asked(winnow_bin, family_files):
    path = str(family_files["llama3"])
    ids = json.loads(run_winnow(winnow_bin, "tokenize", "--tokenizer-json", path, "--text",
                                "Hi<|eot_id|>"))
    assert run_winnow(winnow_bin, "tokenize", "--tokenizer-json", path, "--decode-ids",
                      json.dumps(ids)) == "Hi"
    assert run_winnow(winnow_bin, "tokenize", "--tokenizer-json", path, "--decode-ids",
                      json.dumps(ids), "--render-special") == "<|begin_of_text|>Hi<|eot_id|>"
    # Non-special added tokens always render.
    path = str(family_files["qwen2"])
    ids = json.loads(run_winnow(winnow_bin, "tokenize", "--tokenizer-json", path, "--text",
                                "<tool_call>x"))
    assert run_winnow(winnow_bin, "tokenize", "--tokenizer-json", path, "--decode-ids",
                      json.dumps(ids)) == "<tool_call>x"


def test_errors_name_the_component(winnow_bin, family_files, tmp_path):
    doc = json.loads(family_files["llama3"].read_text(encoding="utf-8"))
    doc["pre_tokenizer"]["pretokenizers"][1] = {"type": "Whitespace"}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc), encoding="utf-8")
    proc = subprocess.run([str(winnow_bin), "tokenize", "--tokenizer-json", str(bad), "--text",
                           "x"], capture_output=True, text=True)
    assert proc.returncode == 1
    assert "pre_tokenizer.pretokenizers[1].type 'Whitespace' is not supported" in proc.stderr
    proc = subprocess.run([str(winnow_bin), "tokenize", "--tokenizer-json",
                           str(family_files["llama3"]), "--chat", str(bad)],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "--model" in proc.stderr
