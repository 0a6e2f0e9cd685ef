"""tokenizer.json files of the supported families, made at test time with the `tokenizers`
library (no hub access): SmolLM2's own vocabulary and merges (from the default GGUF through
transformers) under each byte-level family's configuration, and a small SentencePiece-style BPE
trained here for the Llama-2/Mistral/Gemma configurations. The structure of each follows the
family's published tokenizer.json: normalizer, pre-tokenizer, model flags, post-processor,
decoder and the kinds of added tokens it has.
"""
import json
import random
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors, trainers

# Llama 3's split (Qwen2's differs only in taking one digit at a time).
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")

SPM = "\u2581"


def smollm2_gguf(model_path: Path, out: Path) -> Path:
    """What transformers makes of the default GGUF: GPT-2 ByteLevel, no BOS."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(model_path.parent), gguf_file=model_path.name)
    hf.backend_tokenizer.save(str(out))
    return out


def _special(content: str) -> AddedToken:
    return AddedToken(content, special=True, normalized=False)


def smollm2(base: Path, out: Path) -> Path:
    """SmolLM2's own configuration: single digits, then GPT-2 ByteLevel."""
    tok = Tokenizer.from_file(str(base))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.save(str(out))
    return out


def llama3(base: Path, out: Path) -> Path:
    """Llama 3.x: Split regex + ByteLevel without regex, ignore_merges, <|begin_of_text|>."""
    tok = Tokenizer.from_file(str(base))
    tok.model.ignore_merges = True
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.add_special_tokens([_special(t) for t in [
        "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
        "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>"]])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    tok.save(str(out))
    return out


def qwen2(base: Path, out: Path) -> Path:
    """Qwen2/Qwen3: NFC, Split regex (single digits) + ByteLevel, no BOS, and non-special
    added tokens beside the special ones."""
    tok = Tokenizer.from_file(str(base))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t in ["<tool_call>", "</tool_call>", "<think>", "</think>"]])
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.save(str(out))
    return out


def kitchen_sink(base: Path, out: Path) -> Path:
    """Not a real family: every Split behaviour, invert, contiguous Digits, ByteLevel with a
    prefix space, and added tokens with lstrip/rstrip/single_word/normalized."""
    tok = Tokenizer.from_file(str(base))
    tok.normalizer = normalizers.Sequence([normalizers.Replace(Regex(r"\t+"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split("-", behavior="merged_with_previous"),
        pre_tokenizers.Split(Regex(r"\s+"), behavior="merged_with_next"),
        pre_tokenizers.Split(Regex(r"[.,;]"), behavior="contiguous"),
        pre_tokenizers.Split(Regex(r"[a-z]+"), behavior="isolated", invert=True),
        pre_tokenizers.Split("#", behavior="removed"),
        pre_tokenizers.Digits(individual_digits=False),
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)])
    tok.add_tokens([
        AddedToken("<lstrip>", special=False, lstrip=True, normalized=False),
        AddedToken("<rstrip>", special=False, rstrip=True, normalized=False),
        AddedToken("word", special=False, single_word=True, normalized=False),
        AddedToken("<norm>", special=False, normalized=True)])
    tok.add_special_tokens([AddedToken("<both>", special=True, lstrip=True, rstrip=True,
                                       normalized=False)])
    both = tok.token_to_id("<both>")
    tok.post_processor = processors.TemplateProcessing(
        single="<both> $A <|im_end|> <both>", pair="$A $B:1",
        special_tokens=[("<both>", both), ("<|im_end|>", tok.token_to_id("<|im_end|>"))])
    tok.save(str(out))
    return out


# --- SentencePiece-style BPE (Llama 2, Mistral, Gemma) ----------------------------------------

SPM_WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world",
             "token", "izer", "piece", "sentence", "caf\u00e9", "na\u00efve", "stra\u00dfe",
             "running", "runner", "ran", "12", "345", "6789", "a", "an", "and", "of", "to", "in",
             "def", "return", "x", "=", "(", ")", ":", ".", ",", "!", "?", "I'm", "don't"]


def _spm_lines(n: int) -> list[str]:
    rng = random.Random(31)
    return [" ".join(rng.choice(SPM_WORDS) for _ in range(rng.randint(3, 12)))
            for _ in range(n)]


def _spm_model(specials: list[str]) -> tuple[dict, list]:
    """Vocabulary (specials, then the 256 <0xNN> byte tokens, then the trained pieces) and
    merges of a small BPE trained on U+2581-joined words."""
    trainer_tok = Tokenizer(models.BPE(unk_token=specials[0]))
    trainer_tok.normalizer = normalizers.Sequence([normalizers.Prepend(SPM),
                                                   normalizers.Replace(" ", SPM)])
    trainer_tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPM,
                                                         prepend_scheme="never", split=True)
    trainer = trainers.BpeTrainer(vocab_size=450, special_tokens=specials, limit_alphabet=120,
                                  show_progress=False)
    trainer_tok.train_from_iterator(_spm_lines(600), trainer)
    trained = json.loads(trainer_tok.to_str())["model"]
    vocab = {t: i for i, t in enumerate(specials)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1]):
        vocab.setdefault(piece, len(vocab))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" "))
              for m in trained["merges"]]
    return vocab, merges


def _spm_tokenizer(specials: list[str]) -> Tokenizer:
    vocab, merges = _spm_model(specials)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=specials[0],
                               byte_fallback=True, fuse_unk=True))
    tok.add_special_tokens([_special(t) for t in specials])
    return tok


def _string_merges(path: Path) -> None:
    """Rewrites the merges in the older "a b" string form (both forms must load)."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    doc["model"]["merges"] = [" ".join(m) for m in doc["model"]["merges"]]
    path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")


def llama2(out: Path) -> Path:
    """Llama 2 / Mistral v0.1: Prepend + Replace normalizer, no pre-tokenizer, byte fallback,
    fuse_unk, <s> first; a special [INST] and a normalized non-special token."""
    tok = _spm_tokenizer(["<unk>", "<s>", "</s>"])
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(SPM),
                                           normalizers.Replace(" ", SPM)])
    tok.pre_tokenizer = None
    tok.add_special_tokens([_special("[INST]"), _special("[/INST]")])
    tok.add_tokens([AddedToken("<extra>", special=False, normalized=True)])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B:1", special_tokens=[("<s>", 1)])
    tok.decoder = decoders.Sequence([decoders.Replace(SPM, " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.save(str(out))
    _string_merges(out)
    return out


def mistral_metaspace(out: Path) -> Path:
    """Later Mistral conversions: no normalizer, Metaspace pre-tokenizer (prepend first,
    no split), <s> first and </s> last."""
    tok = _spm_tokenizer(["<unk>", "<s>", "</s>"])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPM, prepend_scheme="first",
                                                 split=False)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A $B:1", special_tokens=[("<s>", 1), ("</s>", 2)])
    tok.decoder = decoders.Sequence([
        decoders.Metaspace(replacement=SPM, prepend_scheme="first", split=False),
        decoders.ByteFallback(), decoders.Fuse()])
    tok.save(str(out))
    return out


def metaspace_legacy(out: Path) -> Path:
    """Older Llama-2 conversions: Metaspace written with add_prefix_space (prepend always) and
    splitting at every U+2581."""
    mistral_metaspace(out)
    doc = json.loads(out.read_text(encoding="utf-8"))
    doc["pre_tokenizer"] = {"type": "Metaspace", "replacement": SPM, "add_prefix_space": True}
    out.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    return out


def gemma3(out: Path) -> Path:
    """Gemma: spaces become U+2581 with no prefix, no pre-tokenizer, <bos> first."""
    tok = _spm_tokenizer(["<unk>", "<pad>", "<eos>", "<bos>"])
    tok.normalizer = normalizers.Replace(" ", SPM)
    tok.add_special_tokens([_special("<start_of_turn>"), _special("<end_of_turn>")])
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B:1", special_tokens=[("<bos>", 3)])
    tok.decoder = decoders.Sequence([decoders.Replace(SPM, " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    tok.save(str(out))
    return out


def build_all(model_path: Path, directory: Path) -> dict[str, Path]:
    base = smollm2_gguf(model_path, directory / "smollm2-gguf.json")
    return {
        "smollm2-gguf": base,
        "smollm2": smollm2(base, directory / "smollm2.json"),
        "llama3": llama3(base, directory / "llama3.json"),
        "qwen2": qwen2(base, directory / "qwen2.json"),
        "kitchen-sink": kitchen_sink(base, directory / "kitchen-sink.json"),
        "llama2": llama2(directory / "llama2.json"),
        "mistral-metaspace": mistral_metaspace(directory / "mistral-metaspace.json"),
        "metaspace-legacy": metaspace_legacy(directory / "metaspace-legacy.json"),
        "gemma3": gemma3(directory / "gemma3.json"),
    }
