#!/usr/bin/env python3
"""How long does a compressed cache's greedy output stay identical to the full cache's, on real
documents with an open-ended instruction (issue 15's measure)?

Builds the document tasks (documents.py) for each length and layout, runs bench/quality_bench
over every policy x budget and prints, per (length, layout), tables of:
  - first divergence: tokens generated identically to the full cache's greedy output before the
    first difference, mean over documents (out of --gen-tokens; token 1 always agrees, it comes
    from the full-cache prefill);
  - next-token KL(full || compressed), teacher-forced on the full cache's tokens;
  - the full cache's top-2 log-probability margin at the token where the path split (median):
    a greedy path splits first at its nearest ties, whatever perturbs it;
  - KV kept after the prefill compression.

    .venv/bin/python bench/quality/divergence.py --policies snapkv,xkv,winnowkv \\
        --budgets 0.05,0.1,0.2,0.5 --lengths short,long --layouts plain,spans \\
        --json-out bench/results/divergence.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import documents  # noqa: E402
import run as quality_run  # noqa: E402

POLICIES = ["streaming_llm", "h2o", "snapkv", "pyramidkv", "vl_cache", "aircache", "xkv",
            "elastic_cache", "winnowkv"]


def summarise(result: dict, gen_tokens: int, kl_from: int = 0) -> dict:
    """{(policy, budget): {"divergence": mean, "per_task": {...}, "kl": mean, "kept": mean}}."""
    cells: dict = {}
    for r in result["runs"]:
        c = cells.setdefault((r["policy"], float(r["budget"])),
                             {"per_task": {}, "kl": [], "kl_from": [], "kept": []})
        # A policy whose teacher-forced argmax never differed has no free run: it IS the
        # reference for the whole generation.
        c["per_task"][r["task"]] = r.get("agree_prefix", gen_tokens)
        c["kl"].append(sum(r["kl"]) / len(r["kl"]) if r["kl"] else 0.0)
        # The same later steps for every policy: a lookahead policy's first steps run on the
        # full cache, before its plan.
        later = r["kl"][kl_from:]
        c["kl_from"].append(sum(later) / len(later) if later else 0.0)
        c["kept"].append(r["retention"])
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    margins = {t["id"]: t.get("ref_margins", []) for t in result["tasks"]}
    return {k: {"divergence": mean(list(v["per_task"].values())), "per_task": v["per_task"],
                "split_margin": split_margin(v["per_task"], margins),
                "kl": mean(v["kl"]), "kl_from": mean(v["kl_from"]),
                "kept": mean(v["kept"])} for k, v in cells.items()}


def split_margin(per_task: dict, margins: dict) -> float:
    """Median over the documents whose path split of the full cache's top-2 log-probability
    margin at the token where it split: small means the split was at a near tie."""
    at_split = sorted(margins[t][n] for t, n in per_task.items() if n < len(margins.get(t, [])))
    return at_split[len(at_split) // 2] if at_split else float("nan")


def table(cells: dict, policies, budgets, key: str, spec: str) -> str:
    lines = ["| policy | " + " | ".join(str(b) for b in budgets) + " |",
             "|---|" + "---:|" * len(budgets)]
    for p in policies:
        vals = [cells.get((p, b), {}).get(key) for b in budgets]
        lines.append(f"| {p} | " + " | ".join(quality_run.fmt(v, spec) for v in vals) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default=str(REPO / "build" / "quality_bench"))
    ap.add_argument("--model", default=str(REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--budgets", default="0.1,0.5")
    ap.add_argument("--lengths", default="short")
    ap.add_argument("--layouts", default="plain")
    ap.add_argument("--count", type=int, default=0, help="documents per length (0: all)")
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--params", default="", help="POLICY:k=v,k=v;POLICY2:k=v (driver syntax)")
    ap.add_argument("--kl-from", type=int, default=0,
                    help="also the KL over the teacher-forced steps from this one on (0-based; "
                         "compares a lookahead policy's steps after its plan with the others')")
    ap.add_argument("--cpu-activations", default="f32",
                    help="f32 (default: the compression's effect alone) or q8 (the daemon's)")
    ap.add_argument("--kv-dtype", default="f32",
                    help="f32 (default), f16 (the daemon's), bf16 or q8_0")
    ap.add_argument("--json-out", default="")
    args = ap.parse_args(argv)
    numerics = [f"--cpu-activations={args.cpu_activations}", f"--kv-dtype={args.kv_dtype}"]

    policies = [p for p in args.policies.split(",") if p]
    budgets = [float(b) for b in args.budgets.split(",") if b]
    out = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
           "config": vars(args), "sets": []}
    for length in args.lengths.split(","):
        for layout in args.layouts.split(","):
            tasks = documents.generate(length, layout, args.count or None)
            if not tasks:
                raise SystemExit(f"no {length} documents on this machine (documents.py)")
            t0 = time.time()
            result = quality_run.run_bench(pathlib.Path(args.bench), pathlib.Path(args.model),
                                           tasks, policies, budgets, args.gen_tokens,
                                           args.threads, args.params, extra=numerics)
            wall = time.time() - t0
            cells = summarise(result, args.gen_tokens, args.kl_from)
            lengths = [t["num_tokens"] for t in result["tasks"]]
            print(f"## {length} documents, {layout} layout: {len(tasks)} prompts of "
                  f"{min(lengths)}-{max(lengths)} tokens, {args.gen_tokens} generated, "
                  f"{args.cpu_activations} activations, {args.kv_dtype} KV, "
                  f"wall {wall:.0f} s\n")
            print(f"First divergence (tokens, mean; {args.gen_tokens} = never)\n")
            print(table(cells, policies, budgets, "divergence", ".1f") + "\n")
            print("Next-token KL(full || compressed), nats\n")
            print(table(cells, policies, budgets, "kl", ".3f") + "\n")
            if args.kl_from > 0:
                print(f"Next-token KL from generated token {args.kl_from + 2} on\n")
                print(table(cells, policies, budgets, "kl_from", ".3f") + "\n")
            print("The full cache's top-2 margin where the greedy path split (nats, median "
                  "over the documents that split)\n")
            print(table(cells, policies, budgets, "split_margin", ".2f") + "\n")
            print("KV kept of the prompt (slots / (layers x prompt))\n")
            print(table(cells, policies, budgets, "kept", ".3f") + "\n")
            for e in result.get("errors", [])[:20]:
                print(f"error: {e['policy']} on {e['task']}: {e['error']}", file=sys.stderr)
            out["sets"].append({
                "length": length, "layout": layout, "wall_seconds": wall,
                "tasks": [{k: t[k] for k in ("id", "num_tokens", "ref_text")}
                          for t in result["tasks"]],
                "cells": [{"policy": p, "budget": b, **v} for (p, b), v in cells.items()],
                "errors": result.get("errors", [])})
    if args.json_out:
        path = pathlib.Path(args.json_out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
