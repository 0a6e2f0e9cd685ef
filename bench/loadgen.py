#!/usr/bin/env python3
"""Load generator for the winnow daemon (gRPC Generate streams).

Two arrival modes:
  --mode concurrency  N clients, each sending its next request as soon as the last finished
                      (closed loop; measures capacity at a fixed load).
  --mode rate         requests arrive as a Poisson process at --rate per second (open loop;
                      measures latency at an offered load, queueing included).

Prompt and output lengths come from distributions: fixed:N, uniform:LO:HI, normal:MEAN:STD,
lognormal:MEDIAN:SIGMA (all clipped to >= 1). Prompts are exact token counts, cut from a
tokenized text corpus so the model sees ordinary text; outputs are forced to their drawn length
with ignore_eos unless --no-ignore-eos.

Three workloads (--workload):
  random         every prompt cut from the corpus at its own offset (the default);
  shared-prefix  every prompt starts with the same --shared-prefix-len tokens (a system prompt
                 or few-shot block), then a per-request marker and its own --prompt-len tokens;
  multi-turn     --concurrency conversations of --turns turns each: turn k's prompt is the whole
                 history (earlier prompts, the model's earlier outputs as token ids) plus a new
                 user message of --prompt-len tokens, the way chat clients resend history.
The last two are what prefix caching serves (bench/prefix_cache_bench.py compares it on/off).
--kv-compression '{"policy": ..., "budget": ...}' sends a compression spec with every request;
in multi-turn, "scope": "history" compresses each turn's history (everything before its new
user message, as context_tokens) in stages that the next turn attaches.

Reports throughput and TTFT / TPOT / ITL / E2E percentiles as a table, and writes everything
(config, per-request records, summary) as JSON. Never asserts on times.

    python bench/loadgen.py --target localhost:50051 --mode concurrency --concurrency 8 \\
        --num-requests 64 --prompt-len uniform:32:512 --output-len fixed:64
    python bench/loadgen.py --mode rate --rate 2 --num-requests 100 --json-out run.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import platform
import random
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "clients" / "python"))
import winnow_stubs  # noqa: E402

# The client package (clients/python/src) and its stubs, generated from this checkout's protos.
winnow_stubs.use_source_tree()

import grpc  # noqa: E402

from winnow_client import WinnowClient, pb2  # noqa: E402

CORPUS = (
    "A paged key-value cache splits each sequence's attention state into fixed-size blocks, so "
    "that memory is allocated on demand and returned the moment a request finishes. Continuous "
    "batching schedules work one iteration at a time: new requests join the running batch as "
    "soon as their first prefill chunk fits, and finished ones leave without waiting for the "
    "rest. When the pool runs out, the scheduler preempts the least important sequence and "
    "recomputes it later. Compression policies keep only the keys and values that matter for "
    "future tokens, which frees blocks and lets more requests run at once. The quick brown fox "
    "jumps over the lazy dog while the river flows past the old mill and the town sleeps. "
)


# ------------------------------------------------------------------------------------------
# Length distributions


class Dist:
    def __init__(self, spec: str):
        parts = spec.split(":")
        self.kind, self.args = parts[0], [float(x) for x in parts[1:]]
        need = {"fixed": 1, "uniform": 2, "normal": 2, "lognormal": 2}
        if self.kind not in need or len(self.args) != need[self.kind]:
            raise argparse.ArgumentTypeError(
                f"bad distribution '{spec}': use fixed:N, uniform:LO:HI, normal:MEAN:STD or "
                "lognormal:MEDIAN:SIGMA")
        self.spec = spec

    def sample(self, rng: random.Random) -> int:
        a = self.args
        if self.kind == "fixed":
            v = a[0]
        elif self.kind == "uniform":
            v = rng.uniform(a[0], a[1])
        elif self.kind == "normal":
            v = rng.gauss(a[0], a[1])
        else:
            v = a[0] * math.exp(rng.gauss(0.0, a[1]))
        return max(1, int(round(v)))


# ------------------------------------------------------------------------------------------
# One request


@dataclass
class Record:
    index: int
    prompt_tokens: int
    max_tokens: int
    start: float = 0.0
    ttft: float | None = None
    e2e: float | None = None
    output_tokens: int = 0
    itl: list = field(default_factory=list)  # seconds between tokens (per token)
    cached_prompt_tokens: int = 0  # usage.cached_prompt_tokens: prompt KV the cache supplied
    kv_tokens: float = 0.0  # usage.kv_tokens_per_layer at finish, averaged over layers
    status: str = "NOT_SENT"  # until sent: then OK or the gRPC status code's name
    error: str = ""


def run_request(client: WinnowClient, rec: Record, prompt_ids: list[int], ignore_eos: bool,
                timeout: float, t0: float, compression: dict | None = None) -> Record:
    req = WinnowClient.build_request(token_ids=prompt_ids, max_tokens=rec.max_tokens,
                                     ignore_eos=ignore_eos, temperature=0.0,
                                     request_id=f"loadgen-{rec.index}", compression=compression)
    return stream_request(client, rec, req, timeout, t0)


def stream_request(client: WinnowClient, rec: Record, request, timeout: float, t0: float,
                   on_message=None) -> Record:
    """Sends a built GenerateRequest and records its timings in rec; on_message (optional)
    sees every streamed response."""
    start = time.perf_counter()
    rec.start = start - t0
    rec.status = "OK"
    last = None
    try:
        for msg in client.generate(request=request, timeout=timeout):
            if on_message is not None:
                on_message(msg)
            if msg.HasField("usage"):
                rec.cached_prompt_tokens = msg.usage.cached_prompt_tokens
                per_layer = list(msg.usage.kv_tokens_per_layer)
                rec.kv_tokens = sum(per_layer) / len(per_layer) if per_layer else 0.0
            n = len(msg.token_ids)
            if n == 0:
                continue
            now = time.perf_counter()
            if rec.ttft is None:
                rec.ttft = now - start
                # Tokens that arrive together with the first count as 0-gap tokens.
                rec.itl.extend([0.0] * (n - 1))
            else:
                gap = (now - last) / n
                rec.itl.extend([gap] * n)
            last = now
            rec.output_tokens += n
    except grpc.RpcError as e:
        rec.status, rec.error = e.code().name, e.details() or ""
    rec.e2e = time.perf_counter() - start
    return rec


# ------------------------------------------------------------------------------------------
# Summary


def percentiles(values: list[float], ps=(50, 90, 95, 99)) -> dict:
    if not values:
        return {"mean": None, **{f"p{p}": None for p in ps}}
    s = sorted(values)
    out = {"mean": statistics.fmean(s)}
    for p in ps:
        # Nearest-rank on the sorted sample, interpolated.
        k = (len(s) - 1) * p / 100.0
        lo, hi = math.floor(k), math.ceil(k)
        out[f"p{p}"] = s[lo] + (s[hi] - s[lo]) * (k - lo)
    return out


def summarize(records: list[Record], wall: float) -> dict:
    ok = [r for r in records if r.status == "OK"]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    e2e = [r.e2e for r in ok]
    tpot = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok
            if r.ttft is not None and r.output_tokens > 1]
    itl = [x for r in ok for x in r.itl]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    errors: dict[str, int] = {}
    for r in records:
        if r.status != "OK":
            errors[r.status] = errors.get(r.status, 0) + 1
    return {
        "requests": len(records),
        "completed": len(ok),
        "errors": errors,
        "wall_seconds": wall,
        "request_throughput": len(ok) / wall if wall > 0 else 0.0,
        "output_token_throughput": out_tokens / wall if wall > 0 else 0.0,
        "total_token_throughput": (out_tokens + in_tokens) / wall if wall > 0 else 0.0,
        "prompt_tokens": in_tokens,
        "cached_prompt_tokens": sum(r.cached_prompt_tokens for r in ok),
        # The KV each request held at its end, per layer: what a resident request costs.
        "kv_tokens_per_layer_at_finish": percentiles([r.kv_tokens for r in ok]),
        "output_tokens": out_tokens,
        "ttft_seconds": percentiles(ttft),
        "tpot_seconds": percentiles(tpot),
        "itl_seconds": percentiles(itl),
        "e2e_seconds": percentiles(e2e),
    }


def format_table(summary: dict, config: dict) -> str:
    lines = [
        f"workload={config['workload']} mode={config['mode']} "
        + (f"concurrency={config['concurrency']}" if config["mode"] == "concurrency"
           else f"rate={config['rate']}/s")
        + f" prompt_len={config['prompt_len']} output_len={config['output_len']}",
        f"requests: {summary['completed']}/{summary['requests']} ok"
        + (f", errors {summary['errors']}" if summary["errors"] else "")
        + f", wall {summary['wall_seconds']:.2f} s",
        f"prompt tokens: {summary['prompt_tokens']}, of which cached "
        f"{summary['cached_prompt_tokens']}; KV held at finish per request, per layer: mean "
        + ("-" if summary["kv_tokens_per_layer_at_finish"]["mean"] is None else
           f"{summary['kv_tokens_per_layer_at_finish']['mean']:.0f} tokens"),
        f"throughput: {summary['request_throughput']:.3f} req/s, "
        f"{summary['output_token_throughput']:.1f} output tok/s, "
        f"{summary['total_token_throughput']:.1f} total tok/s",
        "",
        f"{'metric (ms)':<12}{'mean':>10}{'p50':>10}{'p90':>10}{'p95':>10}{'p99':>10}",
    ]
    for key, label in [("ttft_seconds", "TTFT"), ("tpot_seconds", "TPOT"),
                       ("itl_seconds", "ITL"), ("e2e_seconds", "E2E")]:
        p = summary[key]
        cells = ["-" if p[k] is None else f"{p[k] * 1000:.1f}"
                 for k in ("mean", "p50", "p90", "p95", "p99")]
        lines.append(f"{label:<12}" + "".join(f"{c:>10}" for c in cells))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------
# Drivers


def corpus_tokens(client: WinnowClient, need: int) -> list[int]:
    ids = client.tokenize(CORPUS, add_special_tokens=False)
    if not ids:
        raise RuntimeError("the daemon tokenized the corpus to nothing")
    return (ids * (need // len(ids) + 1))[:need]


class Prompts:
    """The token ids of each request's prompt (or user message, for multi-turn).

    The corpus repeats with a short period, so two cuts of it can be equal: every prompt
    except the shared prefix starts with a marker naming its request, so that no two requests
    share more than the prefix meant to be shared."""

    def __init__(self, client: WinnowClient, workload: str, shared_prefix_len: int,
                 longest: int, seed: int):
        self.client = client
        self.seed = seed
        self.corpus = corpus_tokens(client, longest + shared_prefix_len + 1024)
        # The shared prefix is cut from the corpus's far end, so it differs from the cuts.
        self.shared = self.corpus[-shared_prefix_len:] if workload == "shared-prefix" else []

    def marker(self, i: int) -> list[int]:
        # The seed too: runs with different seeds against one daemon share nothing.
        return self.client.tokenize(f"\nRun {self.seed}, request {i}:\n",
                                    add_special_tokens=False)

    def prompt(self, i: int, n: int) -> list[int]:
        off = (i * 97) % 1024
        return self.shared + self.marker(i) + self.corpus[off:off + n]


def turn_compression(compression: dict | None, history_tokens: int) -> dict | None:
    """The compression spec of a turn whose history (before its new message) has this many
    tokens: scope "history" compresses that history; a first turn has none to compress."""
    if not compression or compression.get("scope") != "history":
        return compression
    if history_tokens == 0:
        return None
    return {**compression, "context_tokens": history_tokens}


def run_conversation(client: WinnowClient, records: list[Record], prompts: Prompts,
                     ignore_eos: bool, timeout: float, t0: float,
                     compression: dict | None = None) -> None:
    """One chat: each turn resends the history (earlier turns' prompts and the model's outputs,
    as token ids) plus a new user message. A failed turn ends the conversation."""
    history: list[int] = []
    for rec in records:
        before = len(history)
        history += prompts.prompt(rec.index, rec.prompt_tokens)
        rec.prompt_tokens = len(history)
        output: list[int] = []
        req = WinnowClient.build_request(token_ids=history, max_tokens=rec.max_tokens,
                                         ignore_eos=ignore_eos, temperature=0.0,
                                         request_id=f"loadgen-{rec.index}",
                                         compression=turn_compression(compression, before))
        stream_request(client, rec, req, timeout, t0,
                       on_message=lambda msg: output.extend(msg.token_ids))
        if rec.status != "OK":
            return
        history += output


def run_closed_loop(target: str, concurrency: int, jobs: list, stop_at: float) -> None:
    """`concurrency` clients, each taking the next job (a callable of a client) as soon as its
    last one finished."""
    next_job = iter(jobs)
    lock = threading.Lock()

    def worker():
        c = WinnowClient(target)
        try:
            while time.perf_counter() < stop_at:
                with lock:
                    job = next(next_job, None)
                if job is None:
                    return
                job(c)
        finally:
            c.close()

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def run_open_loop(target: str, records: list[Record], prompts: Prompts, args, rng, t0: float,
                  stop_at: float, ignore_eos: bool) -> None:
    """Poisson arrivals at args.rate over one shared channel (streams multiplex over HTTP/2)."""
    slots = threading.Semaphore(args.max_in_flight)
    threads = []
    shared = WinnowClient(target)
    arrival = 0.0
    for r in records:
        arrival += rng.expovariate(args.rate)
        delay = t0 + arrival - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        if time.perf_counter() >= stop_at:
            continue
        slots.acquire()

        def go(r=r):
            try:
                ids = prompts.prompt(r.index, r.prompt_tokens)
                r.prompt_tokens = len(ids)
                run_request(shared, r, ids, ignore_eos, args.timeout, t0, args.kv_compression)
            finally:
                slots.release()

        t = threading.Thread(target=go)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    shared.close()


def plan_lengths(args, rng, context_length: int) -> list[tuple[int, int]]:
    """(prompt or user-message tokens, max_tokens) per request, clipped so that every prompt —
    a multi-turn conversation's last, whole history included — fits the context."""
    turns = args.turns if args.workload == "multi-turn" else 1
    room = context_length // turns - args.shared_prefix_len - 24  # 24: the request marker
    plans = []
    for _ in range(args.num_requests):
        p = max(1, min(args.prompt_len.sample(rng), room - 2))
        o = max(1, min(args.output_len.sample(rng), room - p))
        plans.append((p, o))
    return plans


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--target", default=os.environ.get("WINNOW_TARGET", "localhost:50051"))
    ap.add_argument("--mode", choices=["concurrency", "rate"], default="concurrency")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--rate", type=float, default=1.0, help="requests/s (rate mode)")
    ap.add_argument("--max-in-flight", type=int, default=256,
                    help="rate mode: cap on open streams (arrivals beyond it wait)")
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured requests first")
    ap.add_argument("--prompt-len", type=Dist, default=Dist("uniform:32:256"))
    ap.add_argument("--output-len", type=Dist, default=Dist("fixed:32"))
    ap.add_argument("--workload", choices=["random", "shared-prefix", "multi-turn"],
                    default="random")
    ap.add_argument("--shared-prefix-len", type=int, default=512,
                    help="shared-prefix workload: tokens every prompt starts with")
    ap.add_argument("--turns", type=int, default=4,
                    help="multi-turn workload: turns per conversation (--num-requests is "
                         "rounded up to whole conversations)")
    ap.add_argument("--kv-compression", type=json.loads, default=None,
                    help="a compression spec (JSON) for every request, as the client's "
                         "build_request takes it; multi-turn with \"scope\": \"history\" "
                         "compresses each turn's history")
    ap.add_argument("--no-ignore-eos", action="store_true")
    ap.add_argument("--timeout", type=float, default=600.0, help="per-request deadline (s)")
    ap.add_argument("--max-duration", type=float, default=1800.0,
                    help="stop issuing requests after this many seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json-out", help="write config, summary and per-request records here")
    ap.add_argument("--label", default="", help="free text stored in the JSON")
    args = ap.parse_args(argv)
    if args.num_requests < 1 or args.concurrency < 1 or args.rate <= 0 or args.turns < 1:
        ap.error("--num-requests, --concurrency and --turns must be >= 1, --rate > 0")
    if args.workload == "multi-turn":
        if args.mode != "concurrency":
            ap.error("--workload multi-turn runs conversations in closed loop: use "
                     "--mode concurrency")
        args.num_requests = -(-args.num_requests // args.turns) * args.turns
    if args.workload != "shared-prefix":
        args.shared_prefix_len = 0

    rng = random.Random(args.seed)
    client = WinnowClient(args.target)
    info = client.model_info()
    plans = plan_lengths(args, rng, info.context_length)
    prompts = Prompts(client, args.workload, args.shared_prefix_len, max(p for p, _ in plans),
                      args.seed)
    ignore_eos = not args.no_ignore_eos

    # Warm-up prompts share nothing with the measured ones (their markers name indices < 0).
    for w in range(args.warmup):
        run_request(client, Record(-1 - w, 16, 4), prompts.prompt(-1 - w, 16)[-16:], True,
                    args.timeout, time.perf_counter())

    records = [Record(i, p, o) for i, (p, o) in enumerate(plans)]
    t0 = time.perf_counter()
    stop_at = t0 + args.max_duration

    def single(r: Record):
        def job(c: WinnowClient):
            ids = prompts.prompt(r.index, r.prompt_tokens)
            r.prompt_tokens = len(ids)
            run_request(c, r, ids, ignore_eos, args.timeout, t0, args.kv_compression)
        return job

    def conversation(recs: list[Record]):
        return lambda c: run_conversation(c, recs, prompts, ignore_eos, args.timeout, t0,
                                          args.kv_compression)

    if args.workload == "multi-turn":
        jobs = [conversation(records[i:i + args.turns])
                for i in range(0, len(records), args.turns)]
        run_closed_loop(args.target, args.concurrency, jobs, stop_at)
    elif args.mode == "concurrency":
        run_closed_loop(args.target, args.concurrency, [single(r) for r in records], stop_at)
    else:
        run_open_loop(args.target, records, prompts, args, rng, t0, stop_at, ignore_eos)
    wall = time.perf_counter() - t0

    summary = summarize([r for r in records if r.status != "NOT_SENT"], wall)
    config = {
        "target": args.target, "workload": args.workload, "mode": args.mode,
        "concurrency": args.concurrency, "shared_prefix_len": args.shared_prefix_len,
        "turns": args.turns if args.workload == "multi-turn" else 1,
        "rate": args.rate, "num_requests": args.num_requests,
        "prompt_len": args.prompt_len.spec, "output_len": args.output_len.spec,
        "ignore_eos": ignore_eos, "seed": args.seed, "label": args.label,
        "kv_compression": args.kv_compression,
        "model": {"name": info.name, "architecture": info.architecture},
        "server_limits": json.loads(json.dumps({
            "max_batched_tokens": client.server_status().limits.max_batched_tokens,
            "max_seqs": client.server_status().limits.max_seqs,
            "kv_blocks_total": client.server_status().kv_blocks_total})),
        "client_machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    client.close()
    print(format_table(summary, config))
    if args.json_out:
        out = pathlib.Path(args.json_out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"config": config, "summary": summary,
                                   "requests": [asdict(r) for r in records]}, indent=1))
        print(f"\nwrote {out}")
    return 0 if summary["completed"] == summary["requests"] else 1


if __name__ == "__main__":
    sys.exit(main())
