#!/usr/bin/env python3
"""Multi-turn chat with and without history compression, side by side.

Conversations resend their whole history every turn (bench/loadgen.py --workload multi-turn).
For each configuration a `winnow serve` is started, loadgen runs against it, and it is stopped:

  none                  prefix caching off: every turn prefills its whole history
  prefix                prefix caching on: a turn reuses its history's uncompressed blocks
  POLICY@B              prefix caching on and kv_compression {POLICY, B, scope "history",
                        stage_tokens}: each turn compresses its history in stages and the next
                        attaches them (docs/compression.md, "API")
  POLICY+probe=repeat@B the same, each stage scored with the repeat probe

Reports throughput, TTFT, the share of prompt tokens the cache supplied, and the KV each
request held at its end (per layer: what a resident conversation costs), with ratios to
`prefix`. Same prompts, seed, limits and machine in every run. Never asserts on times.

    .venv/bin/python bench/multi_turn_bench.py
    .venv/bin/python bench/multi_turn_bench.py --configs prefix,kvzip+probe=repeat@0.2 --turns 8
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


def compression_of(config: str, stage_tokens: int) -> dict | None:
    """The kv_compression spec a configuration sends (None for none and prefix)."""
    if config in ("none", "prefix"):
        return None
    policy, budget = config.rsplit("@", 1)
    policy, *extras = policy.split("+")
    spec = {"policy": policy, "budget": float(budget), "scope": "history",
            "stage_tokens": stage_tokens}
    for extra in extras:
        key, value = extra.split("=", 1)
        spec[key] = value
    return spec


def run_one(args, config: str) -> dict:
    name = config.replace("@", "-at-").replace("+", "-").replace("=", "-")
    out = pathlib.Path(args.out_dir) / f"{name}.json"
    log = pathlib.Path(args.out_dir) / f"{name}.log"
    daemon = capacity.Daemon(args.winnow, args.model, [
        "--enable-prefix-caching", "false" if config == "none" else "true",
        "--threads", str(args.threads), "--max-seqs", str(args.concurrency),
        *(["--kv-blocks", str(args.kv_blocks)] if args.kv_blocks else [])], log)
    compression = compression_of(config, args.stage_tokens)
    try:
        rc = loadgen.main([
            "--target", daemon.target, "--workload", "multi-turn", "--mode", "concurrency",
            "--concurrency", str(args.concurrency), "--num-requests", str(args.num_requests),
            "--turns", str(args.turns), "--prompt-len", args.prompt_len,
            "--output-len", f"fixed:{args.output_tokens}", "--seed", str(args.seed),
            "--json-out", str(out),
            *(["--kv-compression", json.dumps(compression)] if compression else [])])
    finally:
        daemon.stop()
    if rc != 0:
        raise SystemExit(f"loadgen failed for {config}; see {out}")
    return json.loads(out.read_text())


def last_turn_kv(result: dict, turns: int) -> float:
    """Mean KV (per layer) a conversation held at the end of its last turn."""
    last = [r["kv_tokens"] for r in result["requests"][turns - 1::turns] if r["status"] == "OK"]
    return sum(last) / len(last) if last else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--winnow", default=str(REPO / "build" / "winnow"))
    ap.add_argument("--model", default=str(REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--configs", default="none,prefix,kvzip@0.2,kvzip+probe=repeat@0.2")
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--num-requests", type=int, default=32, help="rounded to whole conversations")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--prompt-len", default="uniform:64:128", help="each turn's new message")
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--stage-tokens", type=int, default=256)
    ap.add_argument("--kv-blocks", type=int, default=0,
                    help="a fixed pool (blocks over all layers); 0: the daemon's default")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-dir", default=str(REPO / "bench" / "results" / "multi_turn"))
    args = ap.parse_args()
    pathlib.Path(args.out_dir).mkdir(parents=True, exist_ok=True)

    results = {config: run_one(args, config) for config in args.configs.split(",")}
    base = results.get("prefix")
    lines = [f"| config | req/s | out tok/s | TTFT p50 ms | TTFT p99 ms | cached | "
             f"KV at last turn (tokens/layer) | vs prefix: tok/s, KV |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for config, result in results.items():
        s = result["summary"]
        kv = last_turn_kv(result, args.turns)
        ratio = "-"
        if base is not None:
            b = base["summary"]
            ratio = (f"{s['output_token_throughput'] / b['output_token_throughput']:.2f}x, "
                     f"{kv / last_turn_kv(base, args.turns):.2f}x")
        lines.append(
            f"| {config} | {s['request_throughput']:.2f} | {s['output_token_throughput']:.1f} | "
            f"{s['ttft_seconds']['p50'] * 1e3:.0f} | {s['ttft_seconds']['p99'] * 1e3:.0f} | "
            f"{s['cached_prompt_tokens'] / max(1, s['prompt_tokens']):.0%} | {kv:.0f} | {ratio} |")
    print("\n".join(lines))
    print(f"\n{platform.platform()}, {os.cpu_count()} CPUs, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {args.turns} turns, "
          f"stage_tokens {args.stage_tokens}, kv-blocks {args.kv_blocks or 'default'}; "
          f"JSON in {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
