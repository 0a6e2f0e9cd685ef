#!/usr/bin/env python3
"""Long-context tasks for the KV-compression quality benchmark (bench/quality_bench.cc).

Every task is a ChatML prompt for the default model (SmolLM2-135M-Instruct) built from segments,
the way a client sends it to the daemon: a text segment (system turn, user header, instruction),
one *context* segment (the haystack or document, which modality-aware policies score and evict),
and a text segment with the question and the assistant header (their observation window).

Kinds (each deterministic from the seed):
  passkey   a five-digit pass key hidden at a random depth of the filler;
  kv        several "special magic number for <city>" facts in filler; the question names one;
  doc       staff notes on three people (city and job each) in filler; asked where one lives
            and what their job is; the job is scored;
  copy      a "secret sentence" in the document, to be repeated exactly.

The filler is the classic passkey haystack ("The grass is green. The sky is blue. ..."), or with
--filler=varied sentences from a small grammar (harder for the default model).

The assistant turn opens with an answer prefix ("The pass key is"), as RULER does, so the
answer comes first. Answers are short strings; a task counts as solved when the answer is the
first candidate the generation mentions (bench/quality/score.py).

    python bench/quality/tasks.py --num-per-kind 6 --target-tokens 1200 --seed 1 > tasks.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import sys

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
KINDS = ("passkey", "kv", "doc", "copy")
# The twelve retrieval tasks `make test` asserts (tests/python/test_compression_quality.py) and
# docs/compression.md's tables quote: three per kind, ~700 tokens, seed 101, 16 tokens generated.
ASSERTED_PER_KIND, ASSERTED_TOKENS, ASSERTED_SEED, ASSERTED_GEN_TOKENS = 3, 700, 101, 16

# Characters per SmolLM2 token of each filler (measured with the model's tokenizer); only used to
# size the haystack, the driver reports the exact token counts.
CHARS_PER_TOKEN = {"plain": 3.66, "varied": 4.9}

_SUBJECTS = ["The river", "An old farmer", "The village baker", "A tired traveller", "The wind",
             "The night train", "A small bird", "The school teacher", "The harbour crane",
             "A young painter", "The mountain road", "The market square", "A quiet librarian",
             "The orchard", "The fishing boat", "A stray dog", "The lighthouse keeper",
             "The morning fog", "A group of students", "The town clock"]
_VERBS = ["moved slowly past", "waited near", "looked across", "walked towards", "rested beside",
          "sang quietly by", "turned away from", "circled above", "drifted along", "stood close to",
          "returned to", "passed through"]
_OBJECTS = ["the wooden bridge", "the green hills", "the empty station", "the stone wall",
            "the busy street", "the frozen lake", "the tall pine trees", "the open field",
            "the little chapel", "the narrow valley", "the red barn", "the sleeping town",
            "the old mill", "the sandy shore", "the garden gate"]
_TAILS = ["before the sun went down.", "while the bells rang.", "as the rain began.",
          "in the early spring.", "on a cold winter morning.", "after a long day.",
          "without saying a word.", "under a grey sky.", "late in the afternoon.",
          "when the lamps were lit.", "as the season changed.", "for the last time that year."]

_CITIES = ["Paris", "Tokyo", "Cairo", "Lima", "Oslo", "Dublin", "Nairobi", "Madrid", "Berlin",
           "Toronto", "Sydney", "Mumbai", "Seoul", "Vienna", "Prague", "Lisbon", "Athens",
           "Chicago", "Denver", "Rome", "Moscow", "Havana", "Manila", "Jakarta"]
_FIRST = ["Anna", "Peter", "Maria", "James", "Sofia", "David", "Laura", "Tom", "Elena", "Mark",
          "Julia", "Omar", "Nina", "Paul", "Clara", "Victor", "Irene", "Hugo", "Alice", "Lucas"]
_LAST = ["Novak", "Berg", "Costa", "Fischer", "Moreau", "Kowalski", "Jensen", "Romano",
         "Silva", "Meyer", "Dubois", "Larsen", "Okafor", "Tanaka", "Walsh", "Ivanova"]
_JOBS = ["baker", "pilot", "doctor", "teacher", "plumber", "painter", "lawyer", "farmer",
         "dentist", "chef", "nurse", "architect", "librarian", "firefighter", "musician"]
_QUOTES = ["the silver fox hides under the blue moon", "seven green apples fell from the tree",
           "the purple train leaves at midnight", "a golden key opens the northern door",
           "the brave turtle crossed the frozen river", "twelve paper boats sail to the island",
           "the copper bell rings twice at dawn", "an orange kite flew over the castle",
           "the quiet whale sings to the stars", "nine wooden horses sleep in the barn"]


def filler_sentence(rng: random.Random) -> str:
    return (f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} "
            f"{rng.choice(_TAILS)}")


# The classic passkey filler (Mohtashami & Jaggi), as an alternative to the grammar.
_PLAIN = ["The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.",
          "There and back again."]
# "plain" (default): on the default model the full cache solves ~70 % of kv/doc/copy tasks in
# this filler and ~35 % in the varied one (15 tasks of each, measured), and a benchmark needs
# tasks the model can do uncompressed. "varied" stays available as the harder haystack.
FILLER = "plain"


def haystack(rng: random.Random, target_chars: int, needles: list[str]) -> str:
    """Filler prose of about target_chars with each needle inserted at a random sentence."""
    sentences: list[str] = []
    length = sum(len(n) + 1 for n in needles)
    while length < target_chars:
        s = filler_sentence(rng) if FILLER == "varied" else _PLAIN[len(sentences) % 5]
        sentences.append(s)
        length += len(s) + 1
    # Needles go at distinct depths in the first 90 % of the haystack: a needle in the last
    # sentences sits next to the question, where every policy's recent window keeps it anyway.
    slots = sorted(rng.sample(range(max(1, int(len(sentences) * 0.9))), len(needles)))
    for k, (slot, needle) in enumerate(zip(slots, needles)):
        sentences.insert(slot + k, needle)
    # Paragraphs of 5 sentences read more like a document than one giant line.
    paras = [" ".join(sentences[i:i + 5]) for i in range(0, len(sentences), 5)]
    return "\n".join(paras)


def chat_segments(instruction: str, context: str, question: str, answer_prefix: str) -> list[dict]:
    """ChatML prompt; the assistant turn opens with answer_prefix (RULER-style), so that the
    answer is the first thing generated and a 135M model does not wander off first."""
    head = (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{instruction}\n\n")
    tail = f"\n\n{question}<|im_end|>\n<|im_start|>assistant\n{answer_prefix}"
    return [{"text": head}, {"context": context}, {"text": tail}]


# The first generated token comes from the full cache (the engine compresses after the prefill
# that produced its logits), so no task may have its whole answer in that token. Numbers are
# safe: SmolLM2 emits " " and then one token per digit.


def make_passkey(rng: random.Random, target_chars: int) -> dict:
    key = str(rng.randint(10000, 99999))
    needle = f"The pass key is {key}. Remember it. {key} is the pass key."
    ctx = haystack(rng, target_chars, [needle])
    return {"kind": "passkey", "answer": key,
            "segments": chat_segments(
                "There is a pass key hidden inside a lot of irrelevant text. Find it.", ctx,
                "What is the pass key?", "The pass key is")}


def make_kv(rng: random.Random, target_chars: int) -> dict:
    cities = rng.sample(_CITIES, 3)
    values = [str(rng.randint(1000, 9999)) for _ in cities]
    needles = [f"The special magic number for {c} is {v}." for c, v in zip(cities, values)]
    ask = rng.randrange(len(cities))
    ctx = haystack(rng, target_chars, needles)
    return {"kind": "kv", "answer": values[ask], "distractors": values,
            "segments": chat_segments(
                "Some special magic numbers are hidden inside the text below. Memorize them.",
                ctx, f"What is the special magic number for {cities[ask]}?",
                f"The special magic number for {cities[ask]} is")}


def make_doc(rng: random.Random, target_chars: int) -> dict:
    people = []
    used = set()
    while len(people) < 3:
        name = f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"
        if name.split()[0] in used:
            continue
        used.add(name.split()[0])
        people.append((name, rng.choice(_CITIES), rng.choice(_JOBS)))
    needles = [f"{n} lives in {c} and works as a {j}." for n, c, j in people]
    ask = rng.randrange(len(people))
    name, city, job = people[ask]
    ctx = haystack(rng, target_chars, needles)
    # The city is one token, the first generated one (free, from the full cache), so the job,
    # which the model states next, is what is scored.
    return {"kind": "doc", "answer": job, "distractors": _JOBS,
            "segments": chat_segments(
                "Read the staff notes below and answer the question.", ctx,
                f"Where does {name} live, and what is their job?", f"{name} lives in")}


def make_copy(rng: random.Random, target_chars: int) -> dict:
    quote = rng.choice(_QUOTES)
    needle = f'The secret sentence is: "{quote}". Remember the secret sentence.'
    ctx = haystack(rng, target_chars, [needle])
    return {"kind": "copy", "answer": quote,
            "segments": chat_segments(
                "There is a secret sentence hidden inside a lot of irrelevant text. Find it.", ctx,
                "What is the secret sentence? Repeat it exactly.", 'The secret sentence is: "')}


MAKERS = {"passkey": make_passkey, "kv": make_kv, "doc": make_doc, "copy": make_copy}


def generate(num_per_kind: int, target_tokens: int, seed: int,
             kinds: tuple[str, ...] = KINDS) -> list[dict]:
    """Tasks interleaved by kind (passkey, kv, doc, copy, passkey, ...), each with an id."""
    tasks = []
    for i in range(num_per_kind):
        for kind in kinds:
            # One RNG per task: the set for N tasks is a prefix-stable superset of N - 1.
            rng = random.Random(f"{seed}:{kind}:{i}")
            # Lengths vary +-25 % so that the positions of the needles relative to block
            # boundaries and windows are not all alike.
            chars = int(target_tokens * CHARS_PER_TOKEN[FILLER] * rng.uniform(0.75, 1.25))
            task = MAKERS[kind](rng, chars)
            task["id"] = f"{kind}-{i}"
            tasks.append(task)
    return tasks


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-per-kind", type=int, default=6)
    ap.add_argument("--target-tokens", type=int, default=1200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--filler", choices=("plain", "varied"), default="plain")
    args = ap.parse_args(argv)
    global FILLER
    FILLER = args.filler
    kinds = tuple(k for k in args.kinds.split(",") if k)
    for k in kinds:
        if k not in MAKERS:
            ap.error(f"unknown kind {k!r} (known: {', '.join(KINDS)})")
    for t in generate(args.num_per_kind, args.target_tokens, args.seed, kinds):
        sys.stdout.write(json.dumps(t) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
