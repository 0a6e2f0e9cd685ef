#!/usr/bin/env python3
"""RULER-style task accuracy through the daemon's chat API, with 95% confidence intervals, query
aware and query agnostic: the table that ranks compression policies (docs/compression.md).

Every sample is one chat request as a user sends it: "Read the document below." + real prose
(needle.py's: the Python Language Reference's topics and the licence texts every Debian machine
has, so nothing is downloaded) with the task's sentences at uniform random depths + the
question; no spans, no answer prefix, the model's own chat template, the daemon's own numerics.

Tasks (RULER's families, sized for what the default model can do; a task ranks policies only
where the full cache answers >= 80% of it at that length, the rest are reported as not kept):
  number      one sentence states a 7-digit access code; asked for it
  word        one sentence states a password, one of sixteen common words; asked for it
  phrase      one sentence states a passphrase of three of those words; asked for it, and
              right only with the three in order (a multi-word value)
  name        one sentence names an office's manager, a first name and a surname; asked who,
              and right only with both in order (a multi-word value of names, not words)
  multikey    four offices' codes; asked for one (three distractors)
  multivalue  three codes stated for one office; asked for all three
  multiquery  two offices' codes; asked for both
  vartrack    "VAR ABCDE = 12345" and a chain of two assignments "VAR FGHIJ = VAR ABCDE"; asked
              which variables hold the number; all three names are the answer

A sample is correct when every expected value is in the reply: numbers as whole digit runs
(needle.is_correct: a digit more or less is wrong), words and names as whole words in any case,
a phrase as its words in order with only spaces or punctuation between them.

Modes: `aware`: the document and the question in one user message, the whole prompt compressed
(what a user sends; a policy entry with `probe=repeat` compresses that message as its context);
`agnostic`: the document in one message compressed alone (compression scope
"context"), the question in a second message computed after the plan. The full cache runs in
each mode's layout, so each mode compares with its own reference.

Formats: `chat` (the default, above) needs an instruct model with a chat template. A base model
(Gemma 3 270M) is asked as a completion, `--format completion`: the document, then
"Question: ...", then "Answer:"; the reply is scored up to the next "Question:" the model
writes, and `agnostic` compresses the document's tokens alone (`context_tokens`) before the
question is computed.

Each (task, length, mode, policy, budget) cell answers the same samples (seeded per task and
length), so the comparison with the full cache is paired: the "kept" column averages accuracy
over the kept tasks, and its ratio to the full cache's average gets a paired bootstrap interval
(samples resampled within each task). Cells are saved to --json as they finish and skipped when
the file already has them (a cell with fewer samples is extended; cells are saved every few
samples), so a long table can be built over several runs. `--by-depth` adds each cell's
accuracy by the stated value's depth, `--digits` how many of a single number's leading digits
the replies got; both read the saved cells, so a run whose cells are all saved starts no daemon.

    .venv/bin/python bench/quality/ruler.py --tasks number --lengths 4000 --samples 100 \
        --policies none,winnowkv --budgets 0.1 --modes aware --json ruler.json --by-depth
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import pathlib
import random
import re
import string
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import capacity  # noqa: E402  (its Daemon starts and stops one `winnow serve`)
import documents  # noqa: E402
import needle  # noqa: E402

TASKS = ("number", "word", "phrase", "name", "multikey", "multivalue", "multiquery", "vartrack")
MODES = ("aware", "agnostic")
KEEP_THRESHOLD = 0.8  # the full cache's accuracy a task needs before it ranks policies
MAX_TOKENS = {"multivalue": 64, "multiquery": 48, "vartrack": 48}  # others: 24
FIRST_NAMES = ["Amara", "Bruno", "Celeste", "Dmitri", "Elena", "Farid", "Greta", "Hugo", "Ingrid",
               "Jonas", "Keiko", "Lucien", "Mirela", "Nikolai", "Orla", "Pavel"]
SURNAMES = ["Albescu", "Brandt", "Castellano", "Dervish", "Eklund", "Fontaine", "Galloway",
            "Haraldsen", "Ivanova", "Jaramillo", "Kowalczyk", "Lindqvist", "Moreau", "Nakamura",
            "Okonkwo", "Petrakis"]


def _code(rng: random.Random) -> str:
    return str(rng.randrange(10 ** (needle.CODE_DIGITS - 1), 10 ** needle.CODE_DIGITS))


def _variable(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_uppercase) for _ in range(5))


def task_sentences(rng: random.Random, task: str) -> tuple[list[str], str, list[str], str]:
    """The sentences to hide, the question, the expected values and how they are matched
    ("number", "word" or "phrase")."""
    if task == "phrase":
        place, words = rng.choice(needle.PLACES), rng.sample(needle.WORDS, 3)
        phrase = " ".join(words)
        return ([f"The passphrase for the {place} office is {phrase}."],
                f"What is the passphrase for the {place} office?", [phrase], "phrase")
    if task == "name":
        place = rng.choice(needle.PLACES)
        name = f"{rng.choice(FIRST_NAMES)} {rng.choice(SURNAMES)}"
        return ([f"The manager of the {place} office is {name}."],
                f"Who is the manager of the {place} office?", [name], "phrase")
    if task == "word":
        place, word = rng.choice(needle.PLACES), rng.choice(needle.WORDS)
        return ([f"The password for the {place} office is {word}."],
                f"What is the password for the {place} office?", [word], "word")
    if task == "vartrack":
        names = []
        while len(names) < 3:
            name = _variable(rng)
            if name not in names:
                names.append(name)
        value = str(rng.randrange(10000, 100000))
        chain = [f"VAR {names[0]} = {value}."]
        chain += [f"VAR {names[i]} = VAR {names[i - 1]}." for i in range(1, len(names))]
        return (chain, f"Which variables are assigned the value {value}? Name all of them.",
                names, "word")
    if task == "multivalue":
        place, codes = rng.choice(needle.PLACES), [_code(rng) for _ in range(3)]
        return ([f"One of the access codes for the {place} office is {c}." for c in codes],
                f"What are the three access codes for the {place} office?", codes, "number")
    count = {"number": 1, "multikey": 4, "multiquery": 2}[task]
    places, codes = rng.sample(needle.PLACES, count), [_code(rng) for _ in range(count)]
    sentences = [f"The access code for the {p} office is {c}." for p, c in zip(places, codes)]
    if task == "multiquery":
        return (sentences, f"What are the access codes for the {places[0]} office and the "
                           f"{places[1]} office?", codes, "number")
    return (sentences, f"What is the access code for the {places[0]} office?", codes[:1],
            "number")


def make_sample(rng: random.Random, paragraphs: list[str], target_chars: int, task: str) -> dict:
    """One document of about target_chars of prose with the task's sentences at uniform random
    depths; vartrack keeps its chain in order (each assignment after the one it reads)."""
    body = needle.prose_body(rng, paragraphs, target_chars)
    sentences, question, answers, match = task_sentences(rng, task)
    depths = [rng.random() for _ in sentences]
    if task == "vartrack":
        depths.sort()
    document = needle.document_with(body, sentences, depths)
    return {"task": task, "document": document, "question": question, "answers": answers,
            "match": match, "depths": depths}


def make_samples(task: str, tokens: int, count: int, seed: int,
                 paragraphs: list[str]) -> list[dict]:
    rng = random.Random(f"ruler:{seed}:{task}:{tokens}")
    chars = int(tokens * documents.CHARS_PER_TOKEN)
    return [make_sample(rng, paragraphs, chars, task) for _ in range(count)]


def is_correct(sample: dict, reply: str) -> bool:
    """Every expected value in the reply: numbers as whole digit runs, words as whole words, a
    phrase as its words in order with nothing but spaces or punctuation between them."""
    if sample["match"] == "number":
        return all(needle.is_correct(reply, value) for value in sample["answers"])
    if sample["match"] == "phrase":
        return all(has_phrase(reply, value) for value in sample["answers"])
    return all(needle.has_word(reply, value) for value in sample["answers"])


def has_phrase(reply: str, phrase: str) -> bool:
    """The phrase's words in the reply as whole words, in order, any case, separated only by
    spaces or punctuation ("Marigold, harbour and lantern" is wrong: a word between)."""
    pattern = r"\W+".join(re.escape(word) for word in phrase.split())
    return re.search(rf"\b{pattern}\b", reply, re.IGNORECASE) is not None


def compression_for(policy: str, budget: float, mode: str) -> dict | None:
    """A policy entry's compression in a mode. A probe scores a context (scope "context"): in
    the aware mode that context is the one message, the question included."""
    compression = needle.compression_for(policy, budget)
    if compression is not None and (mode == "agnostic" or "probe" in compression):
        compression.update({"scope": "context", "context_messages": 1})
    return compression


def chat_for(sample: dict, mode: str) -> list[tuple[str, str]]:
    """The document and the question in one user message (aware) or two (agnostic)."""
    if mode == "agnostic":
        return [("user", sample["document"]), ("user", sample["question"])]
    return [("user", sample["document"] + "\n\n" + sample["question"])]


def completion_for(sample: dict) -> str:
    """A base model's prompt: the document, the question, and where the answer goes."""
    return sample["document"] + "\n\nQuestion: " + sample["question"] + "\nAnswer:"


def completion_answer(reply: str) -> str:
    """A base model's answer: its reply up to the next question it goes on to write."""
    return reply.split("Question:")[0]


def shared_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def completion_compression(client, sample: dict, compression: dict | None,
                           mode: str) -> dict | None:
    """compression_for's scope "context" for a completion: the tokens the prompt shares with
    the document alone (agnostic) or with the document and its question (a probe, aware)."""
    if compression is None or compression.get("scope") != "context":
        return compression
    context = sample["document"]
    if mode == "aware":
        context += "\n\nQuestion: " + sample["question"]
    prompt = client.tokenize(completion_for(sample))
    tokens = shared_prefix(client.tokenize(context), prompt)
    compression = dict(compression, context_tokens=tokens)
    del compression["context_messages"]
    return compression


def ask(client, sample: dict, compression: dict | None, mode: str, form: str,
        max_tokens: int) -> tuple[str, str, object]:
    """One sample asked as a chat (instruct models) or a completion (base models): the reply,
    the part of it that answers, and the final response (its usage)."""
    if form == "completion":
        text, _, final = client.generate_text(
            completion_for(sample), max_tokens=max_tokens,
            compression=completion_compression(client, sample, compression, mode))
        return text, completion_answer(text), final
    text, _, final = client.generate_text(chat=chat_for(sample, mode), max_tokens=max_tokens,
                                          compression=compression)
    return text, text, final


def run_cell(client, samples: list[dict], policy: str, budget: float, mode: str,
             parallel: int, form: str = "chat") -> list[dict]:
    compression = compression_for(policy, budget, mode)

    def score(sample: dict) -> dict:
        text, answer, final = ask(client, sample, compression, mode, form,
                                  MAX_TOKENS.get(sample["task"], 24))
        usage = final.usage
        return {"reply": text, "prompt_tokens": usage.prompt_tokens,
                "kv_kept": sum(usage.kv_tokens_kept_per_layer),
                "kv_evicted": usage.kv_tokens_evicted,
                "depths": sample["depths"], "correct": is_correct(sample, answer)}

    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
        return list(pool.map(score, samples))


def policy_entries(policies: str, budgets: list[float]) -> list[tuple[str, float]]:
    """(policy, budget) per comma-separated policy and budget; the full cache once. A policy
    may name its own budgets after an @, separated by slashes (`winnowkv@0.05/0.1`)."""
    entries = []
    for entry in policies.split(","):
        policy, _, own = entry.partition("@")
        mine = [float(b) for b in own.split("/")] if own else budgets
        entries += [(policy, b) for b in ([1.0] if policy == "none" else mine)]
    return entries


def cell_key(task: str, tokens: int, mode: str, policy: str, budget: float) -> str:
    return f"{task}|{tokens}|{mode}|{policy}|{'-' if policy == 'none' else f'{budget:g}'}"


def paired_ratio_interval(policy_runs: list[list[bool]], full_runs: list[list[bool]],
                          reps: int = 2000, seed: int = 7) -> tuple[float, float, float]:
    """The ratio of the policy's accuracy averaged over tasks to the full cache's, with a 95%
    paired bootstrap interval: each replicate resamples every task's sample indices once and
    scores both caches on them."""
    def ratio(indices: list[list[int]]) -> float:
        mine = sum(sum(p[i] for i in ix) / len(ix) for p, ix in zip(policy_runs, indices))
        full = sum(sum(f[i] for i in ix) / len(ix) for f, ix in zip(full_runs, indices))
        return mine / full if full else 0.0

    rng = random.Random(seed)
    whole = [list(range(len(runs))) for runs in full_runs]
    draws = sorted(ratio([[rng.randrange(len(ix)) for _ in ix] for ix in whole])
                   for _ in range(reps))
    return ratio(whole), draws[int(0.025 * reps)], draws[int(0.975 * reps) - 1]


def _accuracy(runs: list[dict]) -> float:
    return sum(r["correct"] for r in runs) / len(runs)


def wilson_percent(runs: list[dict]) -> str:
    k = sum(r["correct"] for r in runs)
    lo, hi = needle.wilson(k, len(runs))
    return f"{k / len(runs):.0%} ({lo:.0%}–{hi:.0%})"


def kept_tasks(cells: dict, tasks: list[str], tokens: int, mode: str) -> list[str]:
    """The tasks whose full-cache cell reaches KEEP_THRESHOLD: those that rank policies."""
    full = [(t, cells.get(cell_key(t, tokens, mode, "none", 1.0))) for t in tasks]
    return [t for t, runs in full if runs and _accuracy(runs) >= KEEP_THRESHOLD]


def mean_accuracy(cells: dict, kept: list[str], tokens: int, mode: str, policy: str,
                  budget: float) -> float | None:
    """A policy's accuracy averaged over the kept tasks; None while a cell is missing."""
    runs = [cells.get(cell_key(t, tokens, mode, policy, budget)) for t in kept]
    return sum(map(_accuracy, runs)) / len(runs) if kept and all(runs) else None


def share_of_full(cells: dict, kept: list[str], tokens: int, mode: str, policy: str,
                  budget: float) -> str:
    """"111% of full (104%–119%)": the kept tasks' average accuracy as a share of the full
    cache's, with the paired bootstrap interval ("–" while a cell is missing)."""
    runs = [cells.get(cell_key(t, tokens, mode, policy, budget)) for t in kept]
    if not kept or not all(runs):
        return "–"
    full = [cells[cell_key(t, tokens, mode, "none", 1.0)] for t in kept]
    # A cell still being filled pairs with the full cache's first samples (the same ones).
    pairs = [(rs[:len(fs)], fs[:len(rs)]) for rs, fs in zip(runs, full)]
    ratio, lo, hi = paired_ratio_interval([[r["correct"] for r in rs] for rs, _ in pairs],
                                          [[r["correct"] for r in fs] for _, fs in pairs])
    return f"{ratio:.0%} of full ({lo:.0%}–{hi:.0%})"


def tables(cells: dict, tasks: list[str], lengths: list[int], modes: list[str],
           entries: list[tuple[str, float]]) -> str:
    """Per (length, mode): one row per task (accuracy with its Wilson interval, the full cache
    first), then one row for the kept tasks' average and its ratio to the full cache."""
    out = []
    compressed = [(p, b) for p, b in entries if p != "none"]
    for tokens in lengths:
        for mode in modes:
            full = {t: cells[k] for t in tasks
                    if (k := cell_key(t, tokens, mode, "none", 1.0)) in cells}
            if not full:
                continue
            out.append(f"\n### ~{tokens} tokens, {mode}\n")
            out.append("| task | full cache |" + "".join(f" {p} @ {b:g} |" for p, b in compressed))
            out.append("|---|---|" + "---|" * len(compressed))
            kept = kept_tasks(cells, tasks, tokens, mode)
            for task in full:
                row = [wilson_percent(full[task]) + ("" if task in kept else " (not kept)")]
                for policy, budget in compressed:
                    runs = cells.get(cell_key(task, tokens, mode, policy, budget))
                    row.append(wilson_percent(runs) if runs else "–")
                out.append(f"| {task} | " + " | ".join(row) + " |")
            row = []
            for policy, budget in compressed:
                mean = mean_accuracy(cells, kept, tokens, mode, policy, budget)
                row.append("–" if mean is None else f"{mean:.0%}; "
                           + share_of_full(cells, kept, tokens, mode, policy, budget))
            mean_full = mean_accuracy(cells, kept, tokens, mode, "none", 1.0) or 0.0
            out.append(f"| kept ({len(kept)}) | {mean_full:.0%} |" + "".join(f" {c} |" for c in row))
    return "\n".join(out)


def depth_table(cells: dict, tasks: list[str], lengths: list[int], modes: list[str],
                entries: list[tuple[str, float]], bins: int = 5) -> str:
    """Accuracy by the depth of the first stated value (fifths of the document), per cell:
    where in the document a compressed cache loses what the full cache finds."""
    edges = [f"{100 * i // bins}–{100 * (i + 1) // bins}%" for i in range(bins)]
    out = ["| cell | " + " | ".join(edges) + " |", "|---|" + "---:|" * bins]
    for tokens in lengths:
        for task in tasks:
            for mode in modes:
                for policy, budget in entries:
                    runs = cells.get(cell_key(task, tokens, mode, policy, budget))
                    if not runs:
                        continue
                    counts = [[0, 0] for _ in range(bins)]
                    for r in runs:
                        slot = counts[min(bins - 1, int(r["depths"][0] * bins))]
                        slot[0] += r["correct"]
                        slot[1] += 1
                    name = policy if policy == "none" else f"{policy} @ {budget:g}"
                    out.append(f"| {task}, ~{tokens}, {mode}, {name} | "
                               + " | ".join(f"{k}/{n}" for k, n in counts) + " |")
    return "\n".join(out)


def digits_table(cells: dict, samples: dict, tasks: list[str], lengths: list[int],
                 modes: list[str], entries: list[tuple[str, float]]) -> str:
    """For the tasks that ask one number (`samples`: (task, tokens) -> the cell's samples, in
    order): how many of its leading digits a reply got (needle.correct_prefix), as a mean and
    as counts of at least one and at least three: whether a compressed cache keeps a value's
    first digits and loses the rest."""
    out = ["| cell | mean leading digits | first digit right | >= 3 digits right | of |",
           "|---|---:|---:|---:|---:|"]
    for tokens in lengths:
        for task in tasks:
            wanted = samples.get((task, tokens), [])
            if not wanted or wanted[0]["match"] != "number" or len(wanted[0]["answers"]) != 1:
                continue
            for mode in modes:
                for policy, budget in entries:
                    runs = cells.get(cell_key(task, tokens, mode, policy, budget))
                    if not runs:
                        continue
                    got = [needle.correct_prefix(r["reply"], s["answers"][0])
                           for r, s in zip(runs, wanted)]
                    name = policy if policy == "none" else f"{policy} @ {budget:g}"
                    out.append(f"| {task}, ~{tokens}, {mode}, {name} | "
                               f"{sum(got) / len(got):.1f} | {sum(g >= 1 for g in got)} | "
                               f"{sum(g >= 3 for g in got)} | {len(got)} |")
    return "\n".join(out)


def setting_for(seed: int, model: str, serve_args: str = "", form: str = "chat") -> dict:
    """What saved cells were measured under: a file's cells are reused only in the same one."""
    setting = {"seed": seed, "model": pathlib.Path(model).name, "serve_args": serve_args}
    if form != "chat":  # chat's cells were saved before there was a choice
        setting["format"] = form
    return setting


def load_cells(path: pathlib.Path | None, setting: dict) -> dict:
    """The cells saved in `path` (none if it does not exist); an error if they were measured in
    another setting (seed, model, serve flags)."""
    saved = json.loads(path.read_text()) if path and path.exists() else {}
    if saved and saved["setting"] != setting:
        raise SystemExit(f"ruler: {path} holds cells of {saved['setting']}, not {setting}")
    return saved.get("cells", {})


def fill_cells(cells: dict, todo: list[tuple], samples: int, setting: dict, binary: str,
               model: str, parallel: int, path: pathlib.Path | None) -> None:
    """Brings every (task, tokens, mode, policy, budget) of `todo` to `samples` samples through
    one daemon started only if a cell is short, saving `cells` to `path` every few samples (a
    stopped run loses at most one batch)."""
    todo = [c for c in todo if len(cells.get(cell_key(*c), [])) < samples]
    if not todo:
        return
    paragraphs = needle.prose_paragraphs()
    if not paragraphs:
        raise SystemExit("ruler: no source documents on this machine (see documents.py)")
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        daemon = capacity.Daemon(binary, model, setting["serve_args"].split(),
                                 pathlib.Path(tmp) / "daemon.log")
        try:
            for task, tokens, mode, policy, budget in todo:
                key = cell_key(task, tokens, mode, policy, budget)
                wanted = make_samples(task, tokens, samples, setting["seed"], paragraphs)
                while len(cells.setdefault(key, [])) < samples:
                    have = len(cells[key])
                    cells[key] += run_cell(daemon.client, wanted[have:have + 4 * parallel],
                                           policy, budget, mode, parallel,
                                           setting.get("format", "chat"))
                    if path:
                        path.write_text(json.dumps({"setting": setting, "cells": cells}, indent=1))
                print(f"ruler: {key} {sum(r['correct'] for r in cells[key])}/{len(cells[key])} "
                      f"({time.monotonic() - started:.0f} s)", file=sys.stderr)
        finally:
            daemon.stop()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="build/winnow")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--lengths", default="1000,2000,4000",
                    help="document lengths in tokens, about (the model's context is 8192)")
    ap.add_argument("--samples", type=int, default=100, help="per (task, length)")
    ap.add_argument("--policies", default="none,winnowkv",
                    help="entries, name+param=value; a policy's own budgets after @, 0.05/0.3")
    ap.add_argument("--budgets", default="0.1,0.2")
    ap.add_argument("--modes", default="aware")
    ap.add_argument("--parallel", type=int, default=4, help="requests in flight")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--serve-args", default="", help="extra `winnow serve` flags")
    ap.add_argument("--format", choices=("chat", "completion"), default="chat",
                    help="chat messages (instruct models) or a completion (base models)")
    ap.add_argument("--json", type=pathlib.Path, help="cells saved here; cells in it are reused")
    ap.add_argument("--by-depth", action="store_true",
                    help="also each cell's accuracy by the stated value's depth")
    ap.add_argument("--digits", action="store_true",
                    help="also how many of a single number's leading digits the replies got")
    args = ap.parse_args(argv)

    tasks, modes = args.tasks.split(","), args.modes.split(",")
    for name, given, known in (("task", tasks, TASKS), ("mode", modes, MODES)):
        if unknown := [g for g in given if g not in known]:
            raise SystemExit(f"ruler: unknown {name} {unknown}; known: {', '.join(known)}")
    lengths = [int(n) for n in args.lengths.split(",")]
    budgets = [float(b) for b in args.budgets.split(",")]
    entries = policy_entries(args.policies, budgets)
    # The samples are one seeded sequence per (task, length), so a cell saved with fewer samples
    # is the start of a longer one: it is extended, never recomputed.
    setting = setting_for(args.seed, args.model, args.serve_args, args.format)
    cells = load_cells(args.json, setting)
    started = time.monotonic()
    todo = [(t, n, m, p, b) for n in lengths for t in tasks for m in modes for p, b in entries]
    fill_cells(cells, todo, args.samples, setting, args.bin, args.model, args.parallel, args.json)
    cells = {key: results[:args.samples] for key, results in cells.items()}
    print(f"{args.samples} samples per task and length, seed {args.seed}, "
          f"{time.monotonic() - started:.0f} s")
    print(tables(cells, tasks, lengths, modes, entries))
    if args.by_depth:
        print("\nBy depth of the (first) stated value:\n")
        print(depth_table(cells, tasks, lengths, modes, entries))
    if args.digits:
        paragraphs = needle.prose_paragraphs()
        samples = {(t, n): make_samples(t, n, args.samples, args.seed, paragraphs)
                   for t in tasks for n in lengths}
        print("\nLeading digits of the asked number:\n")
        print(digits_table(cells, samples, tasks, lengths, modes, entries))
    return 0


if __name__ == "__main__":
    sys.exit(main())
