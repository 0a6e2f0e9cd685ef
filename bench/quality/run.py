#!/usr/bin/env python3
"""KV-compression quality benchmark: tasks -> quality_bench -> tables, JSON and a PNG.

Generates the long-context tasks (tasks.py), runs the C++ driver (bench/quality_bench.cc) over
every policy x budget against the full cache, scores the answers (score.py) and prints four
policy x budget tables: task accuracy, next-token KL(full || compressed), top-1 agreement and
the KV actually kept. Writes the aggregate JSON (default bench/results/quality.json) and, with
--png, the plot used in docs/experiments/compression-retrieval.md.

    cmake -S . -B build -G Ninja && ninja -C build quality_bench
    .venv/bin/python bench/quality/run.py --bench build/quality_bench \\
        --png docs/experiments/compression_quality.png --json-out bench/results/quality.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import score  # noqa: E402
import tasks as taskgen  # noqa: E402

ALL_POLICIES = ["none", "streaming_llm", "h2o", "snapkv", "pyramidkv", "vl_cache", "aircache",
                "xkv", "elastic_cache", "tokenselect"]
BUDGETS = [0.05, 0.1, 0.2, 0.5]


def run_bench(bench: pathlib.Path, model: pathlib.Path, task_list: list[dict], policies,
              budgets, gen_tokens: int, threads: int, params: str, extra=()) -> dict:
    with tempfile.TemporaryDirectory(prefix="winnow-quality-") as tmp:
        tasks_path = pathlib.Path(tmp) / "tasks.jsonl"
        out_path = pathlib.Path(tmp) / "out.json"
        tasks_path.write_text("".join(json.dumps(t) + "\n" for t in task_list))
        cmd = [str(bench), f"--model={model}", f"--tasks={tasks_path}",
               f"--policies={','.join(policies)}",
               f"--budgets={','.join(str(b) for b in budgets)}",
               f"--gen-tokens={gen_tokens}", f"--threads={threads}", f"--json-out={out_path}",
               *extra]
        if params:
            cmd.append(f"--params={params}")
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"quality_bench failed ({proc.returncode}): {' '.join(cmd)}")
        return json.loads(out_path.read_text())


def fmt(v, spec: str) -> str:
    return "—" if v is None or v != v else format(v, spec)


def tables(agg: dict, policies, budgets) -> str:
    cells = agg["cells"]
    head = "| policy | " + " | ".join(f"{b:g}" for b in budgets) + " |\n"
    head += "|---|" + "---:|" * len(budgets) + "\n"

    def table(title: str, key: str, spec: str) -> str:
        rows = [f"**{title}**\n", "", head.rstrip("\n")]
        for p in policies:
            vals = [fmt(cells[(p, b)][key], spec) if (p, b) in cells else "n/a" for b in budgets]
            rows.append(f"| {p} | " + " | ".join(vals) + " |")
        return "\n".join(rows) + "\n"

    full = agg["full_accuracy"]
    out = [table(f"Task accuracy (full cache: {full:.2f})", "accuracy", ".2f"),
           table("Next-token KL(full ‖ compressed), nats, mean over tasks", "kl_mean", ".3f"),
           table("Top-1 agreement with the full cache (teacher-forced)", "top1", ".2f"),
           table("Greedy agreement (share of the reference's tokens generated identically "
                 "before the first difference)", "greedy_agreement", ".2f"),
           table("KV kept after the prefill compression (slots / (layers × prompt))",
                 "retention", ".3f")]
    return "\n".join(out)


def plot(agg: dict, policies, budgets, path: pathlib.Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    cells = agg["cells"]
    panels = [("accuracy", "task accuracy", False), ("kl_mean", "KL(full ‖ compressed), nats", True),
              ("top1", "top-1 agreement (teacher-forced)", False),
              ("greedy_agreement", "greedy agreement (prefix share)", False)]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    markers = "osD^vPX*h<>p"
    colors = plt.get_cmap("tab20").colors
    for ax, (key, label, log) in zip(axes.flat, panels):
        for i, p in enumerate(policies):
            if p == "none":
                continue
            xs = [b for b in budgets if (p, b) in cells]
            ys = [cells[(p, b)][key] for b in xs]
            if key == "kl_mean":
                ys = [max(y, 1e-4) for y in ys]
            if xs:
                # Variants ("policy+k=v") dashed, next to their policy's colour family.
                ax.plot(xs, ys, marker=markers[i % len(markers)], color=colors[i % len(colors)],
                        linestyle="--" if "+" in p else "-", label=p, linewidth=1.5,
                        markersize=5)
        if key == "accuracy":
            ax.axhline(agg["full_accuracy"], color="black", linestyle=":", label="full cache")
        ax.set_xscale("log")
        ax.set_xticks(budgets)
        ax.set_xticklabels([f"{b:g}" for b in budgets])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("budget (fraction of the prompt's KV kept)")
        ax.set_ylabel(label)
        if log:
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 0.78, 1))
    fig.savefig(path, dpi=110)


def redraw(json_path: pathlib.Path, png: str) -> int:
    data = json.loads(json_path.read_text())
    agg = {"cells": {(c["policy"], c["budget"]): c for c in data["cells"]},
           "full_accuracy": data["full_accuracy"]}
    policies = [p for p in data["config"]["policies"].split(",") if p]
    budgets = [float(b) for b in data["config"]["budgets"].split(",") if b]
    print(tables(agg, policies, budgets))
    if png:
        lengths = [t["num_tokens"] for t in data["tasks"]]
        plot(agg, [p for p in policies if any(k[0] == p for k in agg["cells"])], budgets,
             pathlib.Path(png), title(data["config"]["model"], len(lengths), lengths))
    return 0


def paired_kl(result: dict, a: str, b: str, budgets) -> str:
    """Per budget: the mean KL of a and b over the same tasks, on how many tasks b's is lower
    and higher, and the two-sided sign test's p."""
    kl = {(r["policy"], float(r["budget"]), r["task"]): statistics.mean(r["kl"]) if r["kl"]
          else 0.0 for r in result["runs"]}
    lines = []
    for budget in budgets:
        tasks = sorted(t for (p, bu, t) in kl if p == a and bu == budget
                       and (b, budget, t) in kl)
        if not tasks:
            continue
        ka = [kl[(a, budget, t)] for t in tasks]
        kb = [kl[(b, budget, t)] for t in tasks]
        lower = sum(y < x for x, y in zip(ka, kb))
        higher = sum(y > x for x, y in zip(ka, kb))
        p = min(1.0, 2 * score.sign_test_p(max(lower, higher), min(lower, higher)))
        lines.append(f"budget {budget:g}: {a} KL {statistics.mean(ka):.3f}, {b} "
                     f"{statistics.mean(kb):.3f}; {b} lower on {lower}, higher on {higher} of "
                     f"{len(tasks)} tasks (sign test p = {p:.3f})")
    return "\n".join(lines)


def title(model: str, num_tasks: int, lengths) -> str:
    return (f"winnow KV compression, {pathlib.Path(model).name}: {num_tasks} long-context tasks "
            f"(~{sum(lengths) // len(lengths)} tokens), CPU")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default=str(REPO / "build" / "quality_bench"))
    ap.add_argument("--model", default=str(REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--num-per-kind", type=int, default=3)
    ap.add_argument("--target-tokens", type=int, default=800)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--policies", default=",".join(ALL_POLICIES))
    ap.add_argument("--budgets", default=",".join(str(b) for b in BUDGETS))
    ap.add_argument("--gen-tokens", type=int, default=12)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--params", default="", help="POLICY:k=v,k=v;POLICY2:k=v (driver syntax)")
    ap.add_argument("--pairs", default="",
                    help="A,B;C,D: per budget, B's KL against A's task by task (sign test)")
    ap.add_argument("--json-out", default=str(REPO / "bench" / "results" / "quality.json"))
    ap.add_argument("--png", default="", help="write the plot here (needs matplotlib)")
    ap.add_argument("--from-json", default="",
                    help="redraw the tables (and --png) from a JSON this script wrote; no run")
    args = ap.parse_args(argv)
    if args.from_json:
        return redraw(pathlib.Path(args.from_json), args.png)

    policies = [p for p in args.policies.split(",") if p]
    budgets = [float(b) for b in args.budgets.split(",") if b]
    task_list = taskgen.generate(args.num_per_kind, args.target_tokens, args.seed)
    t0 = time.time()
    result = run_bench(pathlib.Path(args.bench), pathlib.Path(args.model), task_list, policies,
                       budgets, args.gen_tokens, args.threads, args.params)
    wall = time.time() - t0
    meta = {t["id"]: t for t in task_list}
    agg = score.aggregate(result, meta)
    ran = sorted({p for (p, _) in agg["cells"]})
    missing = [p for p in policies if p not in ran]

    md = tables(agg, policies, budgets)
    lengths = [t["num_tokens"] for t in result["tasks"]]
    print(f"{len(task_list)} tasks ({args.num_per_kind} per kind: {', '.join(taskgen.KINDS)}), "
          f"prompts {min(lengths)}–{max(lengths)} tokens (mean {sum(lengths) / len(lengths):.0f}),"
          f" {args.gen_tokens} generated tokens; full-cache accuracy by kind: "
          + ", ".join(f"{k} {v:.2f}" for k, v in agg["full_accuracy_by_kind"].items()))
    print(f"wall {wall:.0f} s; policies not run: {', '.join(missing) or 'none'}\n")
    print(md)
    for pair in filter(None, args.pairs.split(";")):
        print(paired_kl(result, *pair.split(","), budgets))
    for e in result.get("errors", [])[:20]:
        print(f"error: {e['policy']} on {e['task']}: {e['error']}", file=sys.stderr)

    out = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "config": {k: v for k, v in vars(args).items()},
        "wall_seconds": wall,
        "known_policies": result.get("known_policies"),
        "policies_not_run": missing,
        "errors": result.get("errors", []),
        "full_accuracy": agg["full_accuracy"],
        "full_accuracy_by_kind": agg["full_accuracy_by_kind"],
        "tasks": [{k: t[k] for k in ("id", "kind", "answer", "num_tokens", "ref_text")}
                  for t in result["tasks"]],
        "cells": [dict(v) for v in agg["cells"].values()],
        "runs": result["runs"],
    }
    if args.json_out:
        path = pathlib.Path(args.json_out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=1) + "\n")
    if args.png:
        plot(agg, [p for p in policies if p in ran], budgets, pathlib.Path(args.png),
             title(args.model, len(task_list), lengths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
