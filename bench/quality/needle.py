#!/usr/bin/env python3
"""Single-needle retrieval through the daemon's chat API, with 95% confidence intervals: does a
compressed cache keep the answer a user asks for?

Each sample is one chat request as a user sends it: "Read the document below." + a document of
real prose with one sentence stating a 7-digit access code at a random depth + the question
about it; no spans, no answer prefix, the model's own chat template. The daemon runs with its
own numerics (q8 activations, f16 KV by default), so the table is what a user gets. A reply
counts as correct when one of its numbers is the code, no digit more or less (digits may be
grouped by commas or spaces); `prefix` is how many leading digits of the code the reply got
right, which shows how a compressed cache fails (the first digits survive, the later ones
drift).

The documents are the prose of documents.py (the Python Language Reference's topics and the
licence texts every Debian machine has), paragraphs of several sources joined to the target
length, so nothing is downloaded. Every (policy, budget) cell answers the same samples; the
interval is Wilson's score interval.

    .venv/bin/python bench/quality/needle.py --samples 100 --tokens 2000 \
        --policies none,snapkv,winnowkv_docs,winnowkv_docs+neighbours=4 --budgets 0.1,0.2,0.5 \
        --json-out needle.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import pathlib
import random
import re
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import capacity  # noqa: E402  (its Daemon starts and stops one `winnow serve`)
import documents  # noqa: E402  (bench/quality, on the path capacity sets)

PLACES = ["Lisbon", "Oslo", "Nairobi", "Toronto", "Kyoto", "Dublin", "Lima", "Cairo", "Seoul",
          "Prague", "Denver", "Perth", "Porto", "Riga", "Quito", "Tunis", "Hanoi", "Bergen"]
CODE_DIGITS = 7


def prose_paragraphs() -> list[str]:
    """Every paragraph of the documents.py sources found on this machine, in source order."""
    paragraphs = []
    for length in ("short", "long"):
        for kind, name in documents.SOURCES[length]:
            text = documents.read_source(kind, name)
            if text:
                paragraphs += [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    return paragraphs


WORDS = ["marigold", "harbour", "lantern", "juniper", "meadow", "copper", "thistle", "saffron",
         "glacier", "walnut", "falcon", "orchard", "pebble", "cobalt", "willow", "ember"]
TASKS = ("single", "multikey", "word")


def prose_body(rng: random.Random, paragraphs: list[str], target_chars: int) -> list[str]:
    """Consecutive paragraphs from a random start (wrapping) until about target_chars."""
    start = rng.randrange(len(paragraphs))
    body, size = [], 0
    while size < target_chars:
        body.append(paragraphs[(start + len(body)) % len(paragraphs)])
        size += len(body[-1]) + 2
    return body


def document_with(body: list[str], sentences: list[str], depths: list[float]) -> str:
    """The document: each sentence inserted at its depth (0-1) of the prose. Inserted deepest
    first, so each lands at its depth and sentences keep the order of their depths."""
    body = list(body)
    for depth, sentence in sorted(zip(depths, sentences), reverse=True):
        body.insert(round(depth * len(body)), sentence)
    return "Read the document below.\n\n" + "\n\n".join(body)


def has_word(reply: str, word: str) -> bool:
    """The word in the reply as a whole word, any case."""
    return re.search(rf"\b{re.escape(word)}\b", reply, re.IGNORECASE) is not None


def make_sample(rng: random.Random, paragraphs: list[str], target_chars: int,
                task: str = "single") -> dict:
    """One document of about target_chars with the needle at a uniform random depth.

    single: one sentence states a 7-digit code, asked for; multikey: four such sentences for
    four offices at random depths, one asked for (the others are distractors); word: the value
    is a word (a password), scored as a whole word."""
    body = prose_body(rng, paragraphs, target_chars)
    places = rng.sample(PLACES, 4) if task == "multikey" else [rng.choice(PLACES)]
    if task == "word":
        values = [rng.choice(WORDS)]
        needles = [f"The password for the {places[0]} office is {values[0]}."]
        question = f"What is the password for the {places[0]} office?"
    else:
        values = [str(rng.randrange(10 ** (CODE_DIGITS - 1), 10 ** CODE_DIGITS))
                  for _ in places]
        needles = [f"The access code for the {p} office is {v}." for p, v in zip(places, values)]
        question = f"What is the access code for the {places[0]} office?"
    depths = [rng.random() for _ in needles]
    document = document_with(body, needles, depths)
    return {"task": task, "code": values[0], "depth": depths[0],
            "content": document + "\n\n" + question, "document": document,
            "question": question, "keys": list(zip(places, values))}


def digits_in(reply: str) -> list[str]:
    """The reply's digit runs, digits grouped by single commas or spaces joined."""
    return re.findall(r"\d+", re.sub(r"(?<=\d)[, ](?=\d)", "", reply))


def is_correct(reply: str, code: str) -> bool:
    """Whether one of the reply's numbers is the code: "17849611" for 1784961 is wrong (the
    number's end was lost with the token after it)."""
    return code in digits_in(reply)


def is_correct_for(sample: dict, reply: str) -> bool:
    """The sample's value in the reply: the exact number (is_correct), or the word as a whole
    word, any case."""
    if sample.get("task") == "word":
        return has_word(reply, sample["code"])
    return is_correct(reply, sample["code"])


def correct_prefix(reply: str, code: str) -> int:
    """The most leading digits of `code` that one digit run of the reply starts with."""
    best = 0
    for run in digits_in(reply):
        n = 0
        while n < min(len(run), len(code)) and run[n] == code[n]:
            n += 1
        best = max(best, n)
    return best


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson's score interval for k successes in n trials."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def compression_for(entry: str, budget: float) -> dict | None:
    """A policy entry, `name` or `name+param=value+...` (as capacity_bench takes them): numeric
    values go to compression.params, others to compression.options; `probe=repeat` is the
    compression's own probe field (with scope "context")."""
    name, *pairs = entry.split("+")
    if name == "none":
        return None
    params, options, spec = {}, {}, {}
    for pair in pairs:
        key, value = pair.split("=", 1)
        if key == "probe":
            spec["probe"] = value
            continue
        try:
            params[key] = float(value)
        except ValueError:
            options[key] = value
    return {"policy": name, "budget": budget, "params": params, "options": options, **spec}


def run_cell(client, samples: list[dict], policy: str, budget: float, max_tokens: int,
             parallel: int, split: str = "") -> list[dict]:
    """split "": the document and the question in one user message; "aware": in two, the whole
    prompt compressed; "agnostic": in two, the document's message compressed alone before the
    question is computed (compression scope "context", docs/compression.md)."""
    compression = compression_for(policy, budget)
    if compression is not None and split == "agnostic":
        compression.update({"scope": "context", "context_messages": 1})

    def ask(sample: dict) -> dict:
        chat = ([("user", sample["document"]), ("user", sample["question"])] if split
                else [("user", sample["content"])])
        text, _, final = client.generate_text(chat=chat, max_tokens=max_tokens,
                                              compression=compression)
        return {"reply": text, "prompt_tokens": final.usage.prompt_tokens,
                "correct": is_correct_for(sample, text),
                "prefix": correct_prefix(text, sample["code"])}

    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
        return list(pool.map(ask, samples))


def table(cells: dict, n: int, task: str = "single") -> str:
    digits = task != "word"
    lines = [f"| policy | budget | correct of {n} | 95% CI |"
             + (" mean correct leading digits |" if digits else ""),
             "|---|---:|---:|---|" + ("---:|" if digits else "")]
    for (policy, budget), results in cells.items():
        k = sum(r["correct"] for r in results)
        lo, hi = wilson(k, len(results))
        prefix = sum(r["prefix"] for r in results) / len(results)
        shown = "-" if policy == "none" else f"{budget:g}"
        lines.append(f"| {policy} | {shown} | {k} ({k / len(results):.0%}) | {lo:.0%}-{hi:.0%} |"
                     + (f" {prefix:.1f} of {CODE_DIGITS} |" if digits else ""))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="build/winnow")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--samples", type=int, default=100)
    ap.add_argument("--tokens", type=int, default=2000, help="document length, about")
    ap.add_argument("--task", choices=TASKS, default="single",
                    help="single code, four codes asked for one (multikey), or a word")
    ap.add_argument("--policies", default="none,snapkv,winnowkv_docs")
    ap.add_argument("--budgets", default="0.1,0.2,0.5")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--parallel", type=int, default=4, help="requests in flight")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--serve-args", default="", help="extra `winnow serve` flags")
    ap.add_argument("--split", choices=("", "aware", "agnostic"), default="",
                    help="document and question in two user messages; agnostic: the "
                         "document compressed alone, before the question (scope context)")
    ap.add_argument("--json-out", type=pathlib.Path)
    args = ap.parse_args(argv)

    paragraphs = prose_paragraphs()
    if not paragraphs:
        raise SystemExit("needle: no source documents on this machine (see documents.py)")
    rng = random.Random(f"needle:{args.seed}")
    target_chars = int(args.tokens * documents.CHARS_PER_TOKEN)
    samples = [make_sample(rng, paragraphs, target_chars, args.task)
               for _ in range(args.samples)]
    budgets = [float(b) for b in args.budgets.split(",")]
    cells: dict = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        daemon = capacity.Daemon(args.bin, args.model, args.serve_args.split(),
                                 pathlib.Path(tmp) / "daemon.log")
        try:
            for policy in args.policies.split(","):
                for budget in [1.0] if policy == "none" else budgets:
                    cells[(policy, budget)] = run_cell(daemon.client, samples, policy, budget,
                                                       args.max_tokens, args.parallel,
                                                       args.split)
                    print(f"needle: {policy} {budget:g} done ({time.monotonic() - started:.0f} s)",
                          file=sys.stderr)
        finally:
            daemon.stop()
    tokens = [r["prompt_tokens"] for r in next(iter(cells.values()))]
    print(f"{args.samples} samples, prompts {min(tokens)}-{max(tokens)} tokens "
          f"(mean {sum(tokens) / len(tokens):.0f}), {time.monotonic() - started:.0f} s\n")
    print(table(cells, args.samples, args.task))
    if args.json_out:
        args.json_out.write_text(json.dumps(
            {"args": {k: str(v) for k, v in vars(args).items()},
             "samples": samples,
             "cells": [{"policy": p, "budget": b, "results": r} for (p, b), r in cells.items()]},
            indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
