"""Scoring and aggregation for the KV-compression quality benchmark.

A generation solves its task when the answer is the FIRST candidate it mentions: the answer,
or any distractor the task lists (the other keys of a multi-key task, the other cities or jobs
of a directory). Substring search alone would credit "Lima is 8282 ... Oslo is 5353" for 5353.
Matching is on normalised text: lower case, runs of non-alphanumerics collapsed to one space,
with word boundaries, so "48693." matches 48693 and "4869" does not.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict


def normalise(text: str) -> str:
    return " " + re.sub(r"[^0-9a-z]+", " ", text.lower()).strip() + " "


def first_mention(text: str, candidate: str) -> int:
    """Index of the first whole-word occurrence of candidate in text, or -1."""
    return normalise(text).find(normalise(candidate))


def solved(text: str, answer: str, distractors: list[str] | None = None) -> bool:
    at = first_mention(text, answer)
    if at < 0:
        return False
    for d in distractors or []:
        if normalise(d) == normalise(answer):
            continue
        other = first_mention(text, d)
        if 0 <= other < at:
            return False
    return True


def mean(xs):
    xs = list(xs)
    return sum(xs) / len(xs) if xs else float("nan")


def aggregate(result: dict, tasks_meta: dict[str, dict]) -> dict:
    """Per (policy, budget) means over tasks, from quality_bench's JSON.

    tasks_meta: task id -> the generator's task (answer, distractors).
    Returns {"tasks": [...], "full": {...}, "cells": {(policy, budget): {...}}}.
    """
    tasks = {t["id"]: t for t in result["tasks"]}
    full_ok = {tid: solved(t["ref_text"], t["answer"], tasks_meta.get(tid, {}).get("distractors"))
               for tid, t in tasks.items()}
    cells: dict[tuple[str, float], dict] = {}
    grouped = defaultdict(list)
    for run in result["runs"]:
        grouped[(run["policy"], float(run["budget"]))].append(run)
    for key, runs in grouped.items():
        per_task_kl = [mean(r["kl"]) if r["kl"] else 0.0 for r in runs]
        steps = sum(r["steps"] for r in runs)
        top1 = sum(r["top1_match"] for r in runs)
        ok = []
        agree = []
        for r in runs:
            if "text" not in r:  # no free run for this policy (--free-run)
                continue
            t = tasks[r["task"]]
            ok.append(solved(r["text"], t["answer"],
                             tasks_meta.get(r["task"], {}).get("distractors")))
            agree.append(r["agree_prefix"] / len(t["ref_tokens"]))
        with_text = [r for r in runs if "text" in r]
        solved_by_full = [o for o, r in zip(ok, with_text) if full_ok[r["task"]]]
        cells[key] = {
            "policy": key[0],
            "budget": key[1],
            "tasks": len(runs),
            "kl_mean": mean(per_task_kl),
            "kl_per_task": dict(zip((r["task"] for r in runs), per_task_kl)),
            "kl_median": statistics.median(per_task_kl) if per_task_kl else float("nan"),
            "top1": top1 / steps if steps else float("nan"),
            "accuracy": mean(ok),
            # Of the tasks the full cache solves: the share the compressed cache still solves.
            "retained_accuracy": mean(solved_by_full),
            "greedy_agreement": mean(agree),
            "retention": mean(r["retention"] for r in runs),
            "ok_per_task": dict(zip((r["task"] for r in with_text), ok)),
        }
    return {
        "full_accuracy": mean(full_ok.values()),
        "full_ok": full_ok,
        "full_accuracy_by_kind": {
            k: mean(full_ok[tid] for tid, t in tasks.items() if t["kind"] == k)
            for k in sorted({t["kind"] for t in tasks.values()})},
        "cells": cells,
    }


def paired_wins(a: dict[str, float], b: dict[str, float]) -> tuple[int, int, int]:
    """(tasks where a < b, ties, tasks where a > b) over the tasks both have."""
    lo = eq = hi = 0
    for tid in a.keys() & b.keys():
        if math.isclose(a[tid], b[tid], rel_tol=1e-9, abs_tol=1e-12):
            eq += 1
        elif a[tid] < b[tid]:
            lo += 1
        else:
            hi += 1
    return lo, eq, hi


def sign_test_p(wins: int, losses: int) -> float:
    """One-sided exact sign-test p-value for wins out of wins + losses (ties dropped)."""
    n = wins + losses
    if n == 0:
        return 1.0
    return sum(math.comb(n, k) for k in range(wins, n + 1)) / 2 ** n


def paired_permutation_p(better: dict[str, float], worse: dict[str, float]) -> float:
    """One-sided exact sign-flip permutation test that `better` has the lower mean.

    Per task d = worse - better; under H0 (no difference) each d is as likely to have either
    sign, so p = share of the 2^n sign assignments whose mean is >= the observed one. Exact
    for n <= 20 (enumerated); it uses the differences' sizes, unlike the sign test.
    """
    ids = sorted(better.keys() & worse.keys())
    d = [worse[i] - better[i] for i in ids]
    n = len(d)
    if n == 0:
        return 1.0
    if n > 20:
        raise ValueError("paired_permutation_p enumerates 2^n assignments; n must be <= 20")
    observed = sum(d)
    absd = [abs(x) for x in d]
    count = 0
    for mask in range(1 << n):
        total = sum(a if (mask >> k) & 1 else -a for k, a in enumerate(absd))
        if total >= observed - 1e-12:
            count += 1
    return count / (1 << n)
