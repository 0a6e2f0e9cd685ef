#!/usr/bin/env python3
"""How long does the full cache's greedy output survive a change of numerics alone?

The first divergence (divergence.py) counts the tokens a compressed cache generates identically
to the full cache. A greedy path splits at its first near-tie, whatever perturbs the logits, so
this measures the floor of that count: the same documents, no compression, only the arithmetic
changed (KV stored as f16 / bf16 / q8_0, or the daemon's q8 activations), each compared with
the f32 reference that divergence.py's policies are measured against.

    .venv/bin/python bench/quality/numerics_floor.py --lengths short \\
        --settings f32/f16,f32/bf16,f32/q8_0,q8/f16 --json-out /tmp/numerics-floor.json

A setting is ACTIVATIONS/KV_DTYPE (quality_bench's --cpu-activations and --kv-dtype).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import documents  # noqa: E402
import run as quality_run  # noqa: E402
from divergence import split_margin  # noqa: E402

BASELINE = "f32/f32"


def references(args, tasks, setting: str) -> dict:
    """{task id: quality_bench's task record (ref_tokens, ref_margins, ...)} under
    ACTIVATIONS/KV_DTYPE."""
    activations, kv_dtype = setting.split("/")
    # No policies: the references only (the budget list is required but unused).
    result = quality_run.run_bench(
        pathlib.Path(args.bench), pathlib.Path(args.model), tasks, [], [0.1], args.gen_tokens,
        args.threads, "", extra=[f"--cpu-activations={activations}", f"--kv-dtype={kv_dtype}"])
    return {t["id"]: t for t in result["tasks"]}


def agree_prefix(a: list, b: list) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default=str(REPO / "build" / "quality_bench"))
    ap.add_argument("--model", default=str(REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--settings", default="f32/f16,f32/bf16,f32/q8_0,q8/f16")
    ap.add_argument("--lengths", default="short")
    ap.add_argument("--count", type=int, default=0, help="documents per length (0: all)")
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json-out", default="")
    args = ap.parse_args(argv)

    settings = [s for s in args.settings.split(",") if s and s != BASELINE]
    out = {"config": vars(args), "sets": []}
    for length in args.lengths.split(","):
        tasks = documents.generate(length, "plain", args.count or None)
        t0 = time.time()
        base = references(args, tasks, BASELINE)
        rows = []
        for setting in settings:
            other = references(args, tasks, setting)
            per_task = {tid: agree_prefix(base[tid]["ref_tokens"], other[tid]["ref_tokens"])
                        for tid in base}
            margins = {tid: t["ref_margins"] for tid, t in base.items()}
            rows.append({"setting": setting, "per_task": per_task,
                         "mean": sum(per_task.values()) / len(per_task),
                         "split_margin": split_margin(per_task, margins)})
        print(f"## {length} documents: {len(tasks)} prompts, {args.gen_tokens} generated, "
              f"wall {time.time() - t0:.0f} s\n")
        print(f"First divergence from the {BASELINE} full cache (tokens, of {args.gen_tokens})\n")
        print("| activations/KV | mean | per document | f32 margin at the split (median) |\n"
              "|---|---:|---|---:|")
        for r in rows:
            print(f"| {r['setting']} | {r['mean']:.1f} | "
                  + " ".join(str(v) for v in r["per_task"].values())
                  + f" | {quality_run.fmt(r['split_margin'], '.2f')} |")
        print()
        out["sets"].append({"length": length, "rows": rows})
    if args.json_out:
        pathlib.Path(args.json_out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
