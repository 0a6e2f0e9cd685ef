#!/usr/bin/env python3
"""Capacity benchmark: how many long-prompt requests run at once in a fixed KV pool, per policy.

Starts one `winnow serve` with a KV pool of --kv-blocks sized so that --fit-uncompressed (N)
long-prompt requests fit uncompressed (prompt + output, every layer), then, for `none` and each
policy at each budget, submits the same burst of --requests requests at once (segmented
prompts: chat text, a long document marked as compressible context, the question; greedy,
--output-tokens with ignore_eos) and measures, while polling GetServerStatus every
--poll seconds:

  - the most requests running at once (ServerStatus.running: admitted, holding KV), and the
    time-weighted mean while requests were in flight;
  - throughput: output tokens/s and requests/s over the burst's wall time;
  - TTFT and end-to-end latency percentiles (via bench/loadgen.py's summary);
  - preemptions during the burst, KV blocks freed by compression (sum of usage fields).

Everything runs against one daemon, one configuration after the other, so every policy sees
the same pool, prompts, limits and machine. Writes JSON (default bench/results/capacity.json)
and prints a table. Never asserts on times.

    .venv/bin/python bench/capacity.py --winnow build/winnow          # all policies, 0.1 & 0.2
    .venv/bin/python bench/capacity.py --policies snapkv --budgets 0.1 --requests 8
    .venv/bin/python bench/capacity.py --kv-cache-dtype q8_0 --policies snapkv --budgets 0.1
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import platform
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "clients" / "python"))
import winnow_stubs  # noqa: E402

# The client package (clients/python/src) and its stubs, generated from this checkout's protos.
winnow_stubs.use_source_tree()
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "bench" / "quality"))

import grpc  # noqa: E402

import loadgen  # noqa: E402
import tasks as taskgen  # noqa: E402
from winnow_client import WinnowClient, pb2  # noqa: E402

POLICIES = ["streaming_llm", "h2o", "snapkv", "pyramidkv", "vl_cache", "aircache", "xkv",
            "elastic_cache", "tokenselect"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    def __init__(self, binary: str, model: str, args: list[str], log_path: pathlib.Path):
        self.port = free_port()
        self.log = open(log_path, "wb")
        cmd = [binary, "serve", "--model", model, "--host", "127.0.0.1", "--port", str(self.port),
               "--http-port", "-1", *args]
        env = {k: v for k, v in os.environ.items() if not k.startswith("WINNOW_")}
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.cmd = cmd
        self.target = f"127.0.0.1:{self.port}"
        self.client = WinnowClient(self.target)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"daemon exited ({self.proc.returncode}); see {log_path}")
            try:
                if self.client.health(timeout=1.0) == "SERVING":
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
        self.stop()
        raise SystemExit(f"daemon not serving after 120 s; see {log_path}")

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def make_prompts(n: int, target_tokens: int, seed: int) -> list[list[dict]]:
    """n distinct passkey prompts of about the same length, as segments (chat text, the
    haystack as context, the question): every request is a long-prompt request of the size the
    pool was cut for."""
    chars = int(target_tokens * taskgen.CHARS_PER_TOKEN[taskgen.FILLER])
    return [taskgen.make_passkey(random.Random(f"capacity:{seed}:{i}"), chars)["segments"]
            for i in range(n)]


def prompt_tokens(client: WinnowClient, segments: list[dict]) -> int:
    # Segments are tokenised one by one without BOS (server/request_builder.cc), plus a BOS up
    # front when the model asks for one: count it the same way.
    bos = len(client.tokenize("", add_special_tokens=True))
    return bos + sum(len(client.tokenize(s.get("text", s.get("context")),
                                         add_special_tokens=False)) for s in segments)


def build_request(segments, index: int, max_tokens: int, policy: str, budget: float):
    req = pb2.GenerateRequest(request_id=f"capacity-{policy}-{budget}-{index}")
    for s in segments:
        seg = req.segments.segments.add()
        if "context" in s:
            seg.context.text = s["context"]
        else:
            seg.text.text = s["text"]
    req.sampling.temperature = 0.0
    req.stopping.max_tokens = max_tokens
    req.stopping.ignore_eos = True
    if policy != "none":
        req.compression.policy = policy
        req.compression.budget = budget
    return req


def run_one(client: WinnowClient, rec: loadgen.Record, request, t0: float, usage: dict,
            timeout: float) -> None:
    """loadgen.stream_request, keeping the final usage."""
    def keep_usage(msg):
        if msg.HasField("usage"):
            usage[rec.index] = msg.usage
    loadgen.stream_request(client, rec, request, timeout, t0, on_message=keep_usage)


def burst(daemon: Daemon, prompts, lengths, policy: str, budget: float, output_tokens: int,
          poll: float, timeout: float) -> dict:
    client = daemon.client
    st0 = client.server_status()
    records = [loadgen.Record(i, lengths[i], output_tokens) for i in range(len(prompts))]
    usage: dict[int, object] = {}
    samples = []  # (t, running, waiting, free blocks)
    done = threading.Event()

    def poller():
        while not done.is_set():
            st = client.server_status()
            samples.append((time.perf_counter(), st.running, st.waiting, st.kv_blocks_free))
            time.sleep(poll)

    t0 = time.perf_counter()
    pt = threading.Thread(target=poller)
    pt.start()
    threads = []
    for i, segs in enumerate(prompts):
        req = build_request(segs, i, output_tokens, policy, budget)
        th = threading.Thread(target=run_one,
                              args=(client, records[i], req, t0, usage, timeout))
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    done.set()
    pt.join()
    st1 = client.server_status()

    summary = loadgen.summarize(records, wall)
    running = [s[1] for s in samples]
    # Time-weighted mean of `running` over the burst.
    weighted = 0.0
    for (ta, ra, _, _), (tb, _, _, _) in zip(samples, samples[1:]):
        weighted += ra * (tb - ta)
    span = samples[-1][0] - samples[0][0] if len(samples) > 1 else 0.0
    total_blocks = st1.kv_blocks_total
    return {
        "policy": policy,
        "budget": budget if policy != "none" else None,
        "max_running": max(running) if running else 0,
        "mean_running": weighted / span if span > 0 else float("nan"),
        "max_kv_used_fraction": max((total_blocks - s[3]) / total_blocks for s in samples)
        if samples else float("nan"),
        "preemptions": st1.preemptions_total - st0.preemptions_total,
        "blocks_freed_by_compression": sum(u.kv_blocks_freed_by_compression
                                           for u in usage.values()),
        "kv_blocks_peak_mean": statistics.fmean(u.kv_blocks_peak for u in usage.values())
        if usage else float("nan"),
        "kv_blocks_final_mean": statistics.fmean(u.kv_blocks_final for u in usage.values())
        if usage else float("nan"),
        "summary": summary,
        "samples": [(round(t - t0, 3), r, w, f) for t, r, w, f in samples],
    }


def wait_idle(client: WinnowClient, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = client.server_status()
        if st.running == 0 and st.waiting == 0 and st.kv_blocks_free == st.kv_blocks_total:
            return
        time.sleep(0.1)
    raise SystemExit("daemon did not return to idle between configurations")


def fmt_row(r: dict, base: dict | None) -> str:
    s = r["summary"]
    ttft = s["ttft_seconds"]
    ratio = r["max_running"] / base["max_running"] if base and base["max_running"] else math.nan
    name = r["policy"] if r["budget"] is None else f"{r['policy']} @ {r['budget']:g}"
    errs = sum(s["errors"].values())
    return (f"| {name} | {r['max_running']} | {ratio:.1f}× | {r['mean_running']:.1f} | "
            f"{s['output_token_throughput']:.1f} | {s['request_throughput']:.3f} | "
            f"{ttft['p50']:.1f} | {ttft['p90']:.1f} | {s['e2e_seconds']['p50']:.1f} | "
            f"{r['preemptions']} | {r['kv_blocks_final_mean']:.0f} | "
            f"{s['completed']}/{s['requests']}" + (f" ({errs} err)" if errs else "") + " |")


HEADER = ("| configuration | max running | vs none | mean running | output tok/s | req/s | "
          "TTFT p50 (s) | TTFT p90 (s) | E2E p50 (s) | preemptions | KV blocks/request at end "
          "| completed |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--winnow", default=str(REPO / "build" / "winnow"))
    ap.add_argument("--model", default=str(REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--budgets", default="0.1,0.2")
    ap.add_argument("--requests", type=int, default=12, help="requests per burst")
    ap.add_argument("--prompt-tokens", type=int, default=800,
                    help="target prompt length (passkey document + question)")
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--fit-uncompressed", type=int, default=2,
                    help="N: the pool holds N longest requests (prompt + output) uncompressed")
    ap.add_argument("--max-batched-tokens", type=int, default=512)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--kv-cache-dtype", default=None, choices=["f32", "f16", "bf16", "q8_0"],
                    help="passed to the daemon; the pool is then sized in bytes (--kv-cache-bytes)"
                         " as --fit-uncompressed requests at f32, so every dtype gets the same "
                         "memory and a smaller dtype holds more tokens. Unset: --kv-blocks, "
                         "the daemon's default dtype")
    ap.add_argument("--poll", type=float, default=0.1, help="GetServerStatus interval (s)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="per-request deadline (s)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json-out", default=str(REPO / "bench" / "results" / "capacity.json"))
    args = ap.parse_args(argv)

    prompts = make_prompts(args.requests, args.prompt_tokens, args.seed)
    # The model's layer count sizes the pool; a throwaway daemon tells it and tokenises.
    with tempfile.TemporaryDirectory(prefix="winnow-capacity-") as tmp:
        probe = Daemon(args.winnow, args.model, ["--threads", "1"], pathlib.Path(tmp) / "p.log")
        try:
            info = probe.client.model_info()
            lengths = [prompt_tokens(probe.client, p) for p in prompts]
        finally:
            probe.stop()
    layers = info.num_layers
    longest = max(lengths) + args.output_tokens
    per_request = layers * math.ceil(longest / args.block_size)
    kv_blocks = args.fit_uncompressed * per_request
    print(f"{args.requests} requests, prompts {min(lengths)}–{max(lengths)} tokens, "
          f"{args.output_tokens} output tokens; {layers} layers; pool {kv_blocks} blocks = "
          f"{args.fit_uncompressed} × {per_request} (the longest request uncompressed)",
          flush=True)
    pool_args = ["--kv-blocks", str(kv_blocks)]
    kv_bytes = None
    if args.kv_cache_dtype is not None:
        # The same bytes as kv_blocks f32 blocks: K and V, per KV head, block_size rows of
        # head_dim floats.
        f32_block_bytes = 2 * info.num_kv_heads * args.block_size * info.head_dim * 4
        kv_bytes = kv_blocks * f32_block_bytes
        pool_args = ["--kv-cache-bytes", str(kv_bytes), "--kv-cache-dtype", args.kv_cache_dtype]
        print(f"pool: {kv_bytes} bytes (those blocks at f32), KV stored as {args.kv_cache_dtype}",
              flush=True)

    log_path = pathlib.Path(tempfile.gettempdir()) / f"winnow-capacity-{os.getpid()}.log"
    daemon = Daemon(args.winnow, args.model,
                    [*pool_args, "--block-size", str(args.block_size),
                     "--max-batched-tokens", str(args.max_batched_tokens),
                     "--max-seqs", "64", "--max-queue", "1024", "--threads", str(args.threads)],
                    log_path)
    st = daemon.client.server_status()
    print(f"daemon pool: {st.kv_blocks_total} blocks, KV dtype {st.kv_cache_dtype or '?'}",
          flush=True)
    daemon_pool = {"kv_blocks_total": st.kv_blocks_total, "kv_cache_dtype": st.kv_cache_dtype}
    results = []
    configs = [("none", 1.0)] + [(p, float(b)) for p in args.policies.split(",") if p
                                 for b in args.budgets.split(",") if b]
    t_start = time.time()
    try:
        # Warm-up: page the weights and the pool in, so that the first configuration is not
        # charged for it.
        warm = build_request(prompts[0], -1, 4, "none", 1.0)
        for _ in daemon.client.generate(request=warm, timeout=args.timeout):
            pass
        for policy, budget in configs:
            wait_idle(daemon.client)
            r = burst(daemon, prompts, lengths, policy, budget, args.output_tokens, args.poll,
                      args.timeout)
            results.append(r)
            base = results[0]
            print(fmt_row(r, base), flush=True)
    finally:
        daemon.stop()

    print()
    print(HEADER)
    for r in results:
        print(fmt_row(r, results[0]))
    out = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "command": " ".join([sys.executable, *sys.argv]),
        "daemon": daemon.cmd,
        "config": vars(args),
        "prompt_tokens": lengths,
        "kv_blocks": kv_blocks,
        "kv_cache_bytes": kv_bytes,
        "kv_cache_dtype": args.kv_cache_dtype,
        "daemon_pool": daemon_pool,
        "per_request_blocks_uncompressed": per_request,
        "wall_seconds": time.time() - t_start,
        "results": results,
    }
    if args.json_out:
        path = pathlib.Path(args.json_out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=1) + "\n")
        print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
