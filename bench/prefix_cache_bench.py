#!/usr/bin/env python3
"""Prefix caching on and off, side by side: TTFT and throughput on the workloads it serves.

For each workload — shared-prefix (one system prompt before every request) and multi-turn
(conversations that resend their history) — starts a `winnow serve` with
--enable-prefix-caching=false, runs bench/loadgen.py against it, stops it, then does the same
with caching on. Same prompts, seed, limits and machine in both runs; the table gives the
on/off ratios. Writes every loadgen JSON under --out-dir. Never asserts on times.

    .venv/bin/python bench/prefix_cache_bench.py --winnow build/winnow
    .venv/bin/python bench/prefix_cache_bench.py --workloads multi-turn --num-requests 64
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import capacity  # noqa: E402  (its Daemon starts and stops one `winnow serve`)
import loadgen  # noqa: E402

WORKLOAD_ARGS = {
    "shared-prefix": ["--shared-prefix-len", "512", "--prompt-len", "uniform:32:128"],
    "multi-turn": ["--turns", "4", "--prompt-len", "uniform:32:96"],
}


def run_one(args, workload: str, caching: bool) -> dict:
    out = pathlib.Path(args.out_dir) / f"{workload}-caching-{'on' if caching else 'off'}.json"
    log = pathlib.Path(args.out_dir) / f"{workload}-caching-{'on' if caching else 'off'}.log"
    daemon = capacity.Daemon(args.winnow, args.model, [
        "--enable-prefix-caching", "true" if caching else "false",
        "--threads", str(args.threads), "--max-seqs", str(args.concurrency)], log)
    try:
        rc = loadgen.main([
            "--target", daemon.target, "--workload", workload, "--mode", "concurrency",
            "--concurrency", str(args.concurrency), "--num-requests", str(args.num_requests),
            "--output-len", f"fixed:{args.output_tokens}", "--seed", str(args.seed),
            "--json-out", str(out), *WORKLOAD_ARGS[workload]])
    finally:
        daemon.stop()
    if rc != 0:
        raise SystemExit(f"loadgen failed for {workload} (caching {caching}); see {out}")
    return json.loads(out.read_text())["summary"]


def row(workload: str, label: str, s: dict) -> str:
    cached = s["cached_prompt_tokens"] / max(1, s["prompt_tokens"])
    return (f"{workload:<14}{label:<9}{s['request_throughput']:>8.2f}"
            f"{s['output_token_throughput']:>10.1f}{s['ttft_seconds']['p50'] * 1e3:>10.0f}"
            f"{s['ttft_seconds']['p90'] * 1e3:>10.0f}{s['e2e_seconds']['p50'] * 1e3:>10.0f}"
            f"{cached:>9.0%}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--winnow", default=str(REPO / "build" / "winnow"))
    ap.add_argument("--model", default=str(REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--workloads", default="shared-prefix,multi-turn")
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-dir", default=str(REPO / "bench" / "results" / "prefix_cache"))
    args = ap.parse_args()
    pathlib.Path(args.out_dir).mkdir(parents=True, exist_ok=True)

    lines = [f"{'workload':<14}{'caching':<9}{'req/s':>8}{'out tok/s':>10}{'TTFT p50':>10}"
             f"{'TTFT p90':>10}{'E2E p50':>10}{'cached':>9}"]
    ratios = []
    for workload in args.workloads.split(","):
        off = run_one(args, workload, caching=False)
        on = run_one(args, workload, caching=True)
        lines += [row(workload, "off", off), row(workload, "on", on)]
        ratios.append(
            f"{workload}: on/off throughput {on['request_throughput'] / off['request_throughput']:.2f}x, "
            f"TTFT p50 {on['ttft_seconds']['p50'] / off['ttft_seconds']['p50']:.2f}x, "
            f"TTFT p90 {on['ttft_seconds']['p90'] / off['ttft_seconds']['p90']:.2f}x")
    print("\n".join(lines + [""] + ratios))
    print(f"\n{platform.platform()}, {os.cpu_count()} CPUs, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; JSON in {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
