#!/usr/bin/env python3
"""Soak test for the winnow daemon: many small, mixed gRPC requests against a small KV pool and a
low max_seqs, so that preemption happens all the time, then checks that nothing leaked.

The mix (seeded): random prompt lengths and max_tokens, about 20% cancelled mid-stream, 10% with
short deadlines, random priorities, random compression policies and budgets, random sampling and
stop strings, and about 5% invalid or never-fitting requests that must be refused at once.

At the end it checks, and exits 1 on any violation:
  - the pool is entirely free and running = waiting = 0 (GetServerStatus and /metrics);
  - every request had exactly one terminal outcome, of a kind its plan allows;
  - the daemon logged exactly one "request finished" per accepted request, with a reason that
    matches what the client saw (and none for refused ones), and its metrics
    (winnow_requests_finished_total by reason, winnow_requests_rejected_total by code) moved by
    exactly the client's counts;
  - the daemon's resident memory grew by at most --max-rss-growth-mib between the end of the
    warm-up and the end of the run;
  - the daemon's log holds no error or critical line.

By default it starts its own daemon (--bin, --model) on free loopback ports and stops it with
SIGTERM at the end (which must drain and exit 0). With --target it uses a running daemon; give
--metrics-url, --daemon-pid and --daemon-log too, or the checks that need them are skipped (and
said to be).

    python bench/soak.py --num-requests 10000 --concurrency 8 --json-out soak.json
    python bench/soak.py --target localhost:50051 --metrics-url http://localhost:8000/metrics \\
        --daemon-pid $(pidof winnow) --daemon-log winnow.log
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import pathlib
import platform
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "clients" / "python"))
import winnow_stubs  # noqa: E402

winnow_stubs.use_source_tree()

import grpc  # noqa: E402

from winnow_client import WinnowClient, pb2  # noqa: E402

sys.path.insert(0, str(REPO / "bench"))  # after winnow_client: this puts clients/python first
from loadgen import corpus_tokens  # noqa: E402

POLICIES = ["streaming_llm", "h2o", "snapkv", "pyramidkv", "vl_cache", "aircache", "xkv",
            "elastic_cache", "tokenselect"]
STOP_STRINGS = [" the", ".", " and"]
REASONS = {pb2.FINISH_REASON_STOP: "stop", pb2.FINISH_REASON_LENGTH: "length",
           pb2.FINISH_REASON_CANCELLED: "cancelled", pb2.FINISH_REASON_DEADLINE: "deadline",
           pb2.FINISH_REASON_ERROR: "error"}
# What the daemon may log as the finish reason of a request, by what the client saw. A client
# cancel or deadline can cross the last token on the wire (the server finished first): allowed,
# and counted as a race.
SERVER_REASONS = {
    "length": {"length"}, "stop": {"stop"},
    "CANCELLED": {"cancelled"}, "DEADLINE_EXCEEDED": {"deadline", "cancelled"},
}
RACE_REASONS = {"length", "stop"}


# ------------------------------------------------------------------------------------------
# The plan: what each request is and what it may end in


@dataclass
class Plan:
    index: int
    kind: str  # ok | cancel | deadline | invalid
    request: object = field(repr=False)
    max_tokens: int = 0
    cancel_after: int = 0  # cancel once this many tokens arrived (kind cancel)
    timeout: float = 600.0
    expect_code: str = "OK"  # invalid: the gRPC code it must be refused with
    needle: str = ""  # invalid: text the error message must contain


@dataclass
class Context:
    """What the plan needs from the daemon."""
    corpus: list
    vocab_size: int
    context_length: int
    pool_tokens: int  # tokens one sequence could hold with the whole pool


def valid_request(rng: random.Random, ctx: Context, request_id: str):
    n = rng.randint(1, 64)
    off = rng.randrange(len(ctx.corpus) - n)
    kwargs = dict(token_ids=ctx.corpus[off:off + n], max_tokens=rng.randint(1, 32),
                  ignore_eos=rng.random() < 0.5, priority=rng.randint(-1, 2),
                  request_id=request_id)
    if rng.random() < 0.3:
        kwargs.update(temperature=0.8, top_p=0.95, seed=rng.randrange(1 << 30))
    if rng.random() < 0.1:
        kwargs["stop"] = [rng.choice(STOP_STRINGS)]
    if rng.random() < 0.5:
        kwargs["compression"] = {"policy": rng.choice(POLICIES),
                                 "budget": round(rng.uniform(0.1, 1.0), 2)}
    return WinnowClient.build_request(**kwargs), kwargs["max_tokens"]


def invalid_request(rng: random.Random, ctx: Context, request_id: str):
    """(request, gRPC code, text the error names): refused before or at Submit."""
    def req(**kw):
        kw.setdefault("token_ids", ctx.corpus[:8])
        kw.setdefault("max_tokens", 4)
        return WinnowClient.build_request(request_id=request_id, **kw)

    nan_temp = req()
    nan_temp.sampling.temperature = math.nan
    cases = [
        (req(token_ids=None, prompt=""), "INVALID_ARGUMENT", "prompt"),
        (req(token_ids=[1, ctx.vocab_size + 3]), "INVALID_ARGUMENT", "token_ids.ids[1]"),
        (req(compression={"policy": "snapkv-typo", "budget": 0.5}), "INVALID_ARGUMENT",
         "compression.policy"),
        (req(compression={"policy": "h2o", "budget": 1.5}), "INVALID_ARGUMENT",
         "compression.budget"),
        (nan_temp, "INVALID_ARGUMENT", "sampling.temperature"),
        (req(max_tokens=10**6), "INVALID_ARGUMENT", "--max-tokens-limit"),
        # Never fit: beyond the whole pool, or beyond the model's context.
        (req(max_tokens=ctx.pool_tokens + 16), "RESOURCE_EXHAUSTED", "KV blocks"),
        (req(token_ids=(ctx.corpus * (ctx.context_length // len(ctx.corpus) + 1))[
            :ctx.context_length - 8], max_tokens=16), "RESOURCE_EXHAUSTED", "context"),
    ]
    return rng.choice(cases)


def make_plans(rng: random.Random, n: int, ctx: Context, run_id: str) -> list[Plan]:
    plans = []
    for i in range(n):
        rid = f"soak-{run_id}-{i}"
        roll = rng.random()
        if roll < 0.05:
            request, code, needle = invalid_request(rng, ctx, rid)
            plans.append(Plan(i, "invalid", request, expect_code=code, needle=needle))
            continue
        request, max_tokens = valid_request(rng, ctx, rid)
        plan = Plan(i, "ok", request, max_tokens)
        if roll < 0.25:
            plan.kind = "cancel"
            plan.cancel_after = rng.randint(1, 3)
        elif roll < 0.35:
            plan.kind = "deadline"
            plan.timeout = rng.uniform(0.05, 0.5)
        plans.append(plan)
    return plans


# ------------------------------------------------------------------------------------------
# Running a request and judging what the client saw


@dataclass
class Outcome:
    index: int
    kind: str
    code: str = "OK"  # gRPC status the stream ended with
    details: str = ""
    tokens: int = 0
    messages: int = 0
    finish_reasons: list = field(default_factory=list)  # every finish_reason seen, in order
    finish_at: int = -1  # index of the message carrying the (first) finish_reason
    completion_tokens: int = -1  # from the final usage
    cancelled_by_client: bool = False

    @property
    def terminal(self) -> str:
        """The one outcome: a finish reason (status OK) or the status code."""
        if self.code == "OK" and self.finish_reasons:
            return self.finish_reasons[-1]
        return self.code


def run_one(client: WinnowClient, plan: Plan) -> Outcome:
    out = Outcome(plan.index, plan.kind)
    call = client.generate(request=plan.request, timeout=plan.timeout)
    try:
        for msg in call:
            out.messages += 1
            out.tokens += len(msg.token_ids)
            if msg.finish_reason:
                out.finish_reasons.append(REASONS.get(msg.finish_reason, str(msg.finish_reason)))
                if out.finish_at < 0:
                    out.finish_at = out.messages - 1
                out.completion_tokens = msg.usage.completion_tokens
            elif plan.kind == "cancel" and out.tokens >= plan.cancel_after:
                out.cancelled_by_client = True
                call.cancel()
    except grpc.RpcError as e:
        out.code, out.details = e.code().name, e.details() or ""
    return out


def check_outcome(plan: Plan, out: Outcome) -> list[str]:
    """Violations in one request's stream: more or less than one terminal outcome, or one its
    plan does not allow."""
    where = f"request {plan.index} ({plan.kind})"
    v = []
    if len(out.finish_reasons) > 1:
        v.append(f"{where}: {len(out.finish_reasons)} finish messages {out.finish_reasons}")
    if out.finish_reasons and out.finish_at != out.messages - 1:
        v.append(f"{where}: messages after the finish message")
    if out.code == "OK":
        if not out.finish_reasons:
            v.append(f"{where}: stream ended OK without a finish reason")
        elif out.terminal not in ("length", "stop"):
            v.append(f"{where}: status OK with finish reason {out.terminal}")
        if out.completion_tokens != out.tokens:
            v.append(f"{where}: usage says {out.completion_tokens} tokens, "
                     f"{out.tokens} streamed")
        if out.terminal == "length" and out.tokens != plan.max_tokens:
            v.append(f"{where}: length after {out.tokens} of {plan.max_tokens} tokens")
    elif out.finish_reasons and out.terminal in ("length", "stop"):
        v.append(f"{where}: finished {out.terminal} but the status is {out.code}")
    if out.tokens > plan.max_tokens:
        v.append(f"{where}: {out.tokens} tokens streamed, max_tokens {plan.max_tokens}")
    allowed = {"ok": {"length", "stop"}, "cancel": {"length", "stop", "CANCELLED"},
               "deadline": {"length", "stop", "DEADLINE_EXCEEDED"},
               "invalid": {plan.expect_code}}[plan.kind]
    if out.terminal not in allowed:
        v.append(f"{where}: ended {out.terminal} ({out.details!r}), expected one of "
                 f"{sorted(allowed)}")
    if out.code == "CANCELLED" and not out.cancelled_by_client:
        v.append(f"{where}: CANCELLED without the client cancelling ({out.details!r})")
    if plan.kind == "invalid" and plan.needle not in out.details:
        v.append(f"{where}: error {out.details!r} does not name {plan.needle!r}")
    return v


def run_phase(target: str, plans: list[Plan], concurrency: int) -> list[Outcome]:
    """Runs the plans on `concurrency` client threads (closed loop), one channel each."""
    outcomes: list[Outcome | None] = [None] * len(plans)
    pending = iter(range(len(plans)))
    lock = threading.Lock()

    def worker():
        client = WinnowClient(target)
        try:
            while True:
                with lock:
                    i = next(pending, None)
                if i is None:
                    return
                outcomes[i] = run_one(client, plans[i])
        finally:
            client.close()

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


# ------------------------------------------------------------------------------------------
# The daemon's side: log, metrics, state, memory


def read_log_records(path: pathlib.Path) -> list[dict]:
    """The daemon's JSON log lines (text lines become {"level": letter, "msg": line})."""
    records = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                records.append(json.loads(line))
                continue
            except json.JSONDecodeError:
                pass
        m = re.match(r"\S+ ([A-Z]) (.*)", line)
        if m:
            records.append({"level": {"E": "error", "C": "critical"}.get(m[1], m[1]),
                            "msg": m[2]})
    return records


def log_errors(records: list[dict]) -> list[str]:
    return [f"daemon log: {r.get('level')}: {json.dumps(r)[:300]}" for r in records
            if r.get("level") in ("error", "critical")]


def reconcile_log(plans: list[Plan], outcomes: list[Outcome], records: list[dict],
                  run_id: str) -> tuple[list[str], dict]:
    """Exactly one "request finished" per accepted request, with a reason the client's outcome
    allows; none for refused ones. Returns (violations, {"reasons": counts, "races": n})."""
    prefix = f"soak-{run_id}-"
    finished = collections.defaultdict(list)
    for r in records:
        rid = str(r.get("request_id", ""))
        if r.get("msg") == "request finished" and rid.startswith(prefix):
            finished[int(rid[len(prefix):])].append(r)
    v, reasons, races = [], collections.Counter(), 0
    for plan, out in zip(plans, outcomes):
        lines = finished.pop(plan.index, [])
        if plan.kind == "invalid":
            if lines:
                v.append(f"request {plan.index}: refused yet logged as finished")
            continue
        if len(lines) != 1:
            v.append(f"request {plan.index}: {len(lines)} 'request finished' lines")
            continue
        reason = lines[0].get("reason")
        reasons[reason] += 1
        if reason not in SERVER_REASONS.get(out.terminal, set()) | RACE_REASONS:
            v.append(f"request {plan.index}: client saw {out.terminal}, server logged {reason}")
        elif reason in RACE_REASONS and out.terminal not in RACE_REASONS:
            races += 1
        elif out.code == "OK" and lines[0].get("completion_tokens") != out.tokens:
            v.append(f"request {plan.index}: server logged {lines[0].get('completion_tokens')} "
                     f"tokens, client got {out.tokens}")
    for index in finished:
        v.append(f"'request finished' logged for unknown request {prefix}{index}")
    return v, {"reasons": dict(reasons), "races": races}


def scrape(url: str) -> dict:
    """{(name, frozenset(labels)): value} of every sample at a /metrics URL."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    return {(s.name, frozenset((k, v) for k, v in s.labels.items() if k != "model_name")):
            s.value for f in text_string_to_metric_families(text) for s in f.samples}


def labelled(samples: dict, name: str, label: str) -> dict:
    return {dict(labels)[label]: value for (n, labels), value in samples.items()
            if n == name and label in dict(labels)}


def reconcile_metrics(before: dict, after: dict, outcomes: list[Outcome],
                      log_reasons: dict | None) -> list[str]:
    """Counter deltas over the run against the client's counts (and the log's reasons)."""
    v = []
    fin = {k: labelled(after, "winnow_requests_finished_total", "reason")[k] -
           labelled(before, "winnow_requests_finished_total", "reason").get(k, 0)
           for k in labelled(after, "winnow_requests_finished_total", "reason")}
    rej = {k: labelled(after, "winnow_requests_rejected_total", "code")[k] -
           labelled(before, "winnow_requests_rejected_total", "code").get(k, 0)
           for k in labelled(after, "winnow_requests_rejected_total", "code")}
    accepted = sum(1 for o in outcomes if o.kind != "invalid")
    if sum(fin.values()) != accepted:
        v.append(f"metrics: {sum(fin.values())} requests finished, {accepted} accepted")
    if fin.get("error", 0):
        v.append(f"metrics: {fin['error']} requests finished with an error")
    refused = collections.Counter(o.code for o in outcomes if o.kind == "invalid")
    for code in set(refused) | {k for k, n in rej.items() if n}:
        if rej.get(code, 0) != refused.get(code, 0):
            v.append(f"metrics: {rej.get(code, 0)} rejected {code}, client saw "
                     f"{refused.get(code, 0)}")
    if log_reasons is not None:
        for reason in set(fin) | set(log_reasons):
            if fin.get(reason, 0) != log_reasons.get(reason, 0):
                v.append(f"metrics: {fin.get(reason, 0)} finished {reason}, log has "
                         f"{log_reasons.get(reason, 0)}")
    return v


def wait_idle(client: WinnowClient, metrics_url: str | None, timeout: float = 30.0):
    """Waits for running = waiting = 0 and a free pool; returns (violations, state)."""
    deadline = time.monotonic() + timeout
    while True:
        st = client.server_status()
        state = {"running": st.running, "waiting": st.waiting,
                 "kv_blocks_free": st.kv_blocks_free, "kv_blocks_total": st.kv_blocks_total,
                 "preemptions_total": st.preemptions_total}
        idle = st.running == 0 and st.waiting == 0 and st.kv_blocks_free == st.kv_blocks_total
        if idle or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    v = [] if idle else [f"server status not idle after {timeout}s: {state}"]
    if metrics_url:
        m = scrape(metrics_url)
        for name in ("winnow_requests_running", "winnow_requests_waiting",
                     "winnow_kv_blocks_used"):
            value = m.get((name, frozenset()))
            state[name] = value
            if value != 0:
                v.append(f"metrics: {name} = {value} at the end")
    return v, state


def rss_mib(pid: int | None) -> float | None:
    if pid is None:
        return None
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return None


# ------------------------------------------------------------------------------------------
# Our own daemon


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OwnDaemon:
    def __init__(self, args):
        self.port, self.http_port = free_port(), free_port()
        self.log_path = pathlib.Path(args.daemon_log or f"/tmp/winnow-soak-{os.getpid()}.log")
        cmd = [args.bin, "serve", "--model", args.model, "--host", "127.0.0.1",
               "--port", str(self.port), "--http-port", str(self.http_port),
               "--threads", str(args.threads), "--log-format", "json",
               "--kv-blocks", str(args.kv_blocks), "--max-seqs", str(args.max_seqs),
               "--max-batched-tokens", str(args.max_batched_tokens),
               "--drain-timeout", "60s", *args.daemon_arg]
        self.cmd = " ".join(cmd)
        env = {k: v for k, v in os.environ.items() if not k.startswith("WINNOW_")}
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.target = f"127.0.0.1:{self.port}"
        self.metrics_url = f"http://127.0.0.1:{self.http_port}/metrics"

    def wait_serving(self, client: WinnowClient, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}; see "
                                   f"{self.log_path}")
            try:
                if client.health(timeout=1.0) == "SERVING":
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"daemon not serving after {timeout}s; see {self.log_path}")

    def stop(self) -> list[str]:
        """SIGTERM; the daemon must drain and exit 0."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.log.close()
        return [] if code == 0 else [f"daemon exited with {code} after SIGTERM"]


# ------------------------------------------------------------------------------------------
# Main


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--num-requests", "-n", type=int, default=10000)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=None,
                    help="requests before the 'warm' RSS sample (default: 10%%, at most 1000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-rss-growth-mib", type=float, default=32.0,
                    help="allowed RSS growth from the end of the warm-up to the end")
    ap.add_argument("--json-out", help="write config, summary, violations here")
    own = ap.add_argument_group("own daemon (the default)")
    own.add_argument("--bin", default=os.environ.get("WINNOW_BIN", str(REPO / "build/winnow")))
    own.add_argument("--model", default=os.environ.get(
        "WINNOW_MODEL", str(REPO / "models/SmolLM2-135M-Instruct.Q4_1.gguf")))
    own.add_argument("--threads", type=int, default=2)
    own.add_argument("--kv-blocks", type=int, default=360,
                     help="pool size in blocks (360: 12 blocks of 16 tokens per layer for "
                          "SmolLM2-135M's 30 layers)")
    own.add_argument("--max-seqs", type=int, default=4)
    own.add_argument("--max-batched-tokens", type=int, default=64)
    own.add_argument("--daemon-arg", action="append", default=[],
                     help="extra flag for the daemon (repeat)")
    given = ap.add_argument_group("a running daemon")
    given.add_argument("--target", help="host:port of a running daemon (then none is started)")
    given.add_argument("--metrics-url")
    given.add_argument("--daemon-pid", type=int)
    given.add_argument("--daemon-log", help="its log file (own daemon: where to write it)")
    args = ap.parse_args(argv)
    if args.num_requests < 1 or args.concurrency < 1:
        ap.error("--num-requests and --concurrency must be >= 1")
    if args.warmup is None:
        args.warmup = min(1000, args.num_requests // 10)
    return args


def context_of(client: WinnowClient) -> Context:
    info, st = client.model_info(), client.server_status()
    pool_tokens = st.kv_blocks_total // info.num_layers * st.block_size
    return Context(corpus_tokens(client, 4096), info.vocab_size, info.context_length,
                   pool_tokens)


def summarize(plans, outcomes, wall, rss, state, log_stats) -> dict:
    kinds = collections.Counter(p.kind for p in plans)
    by_kind = collections.defaultdict(collections.Counter)
    for p, o in zip(plans, outcomes):
        by_kind[p.kind][o.terminal] += 1
    return {
        "requests": len(plans), "wall_seconds": round(wall, 1),
        "requests_per_second": round(len(plans) / wall, 2) if wall else None,
        "planned": dict(kinds),
        "outcomes": dict(collections.Counter(o.terminal for o in outcomes)),
        "outcomes_by_kind": {k: dict(c) for k, c in by_kind.items()},
        "tokens_streamed": sum(o.tokens for o in outcomes),
        "server_finished_reasons": log_stats.get("reasons") if log_stats else None,
        "cancel_or_deadline_races": log_stats.get("races") if log_stats else None,
        "rss_mib": rss, "end_state": state,
    }


def print_summary(s: dict, violations: list[str]) -> None:
    print(f"requests: {s['requests']} in {s['wall_seconds']} s "
          f"({s['requests_per_second']} req/s), {s['tokens_streamed']} tokens streamed")
    print(f"planned: {s['planned']}")
    for kind, c in sorted(s["outcomes_by_kind"].items()):
        print(f"  {kind:<9} -> {dict(sorted(c.items()))}")
    print(f"server finish reasons: {s['server_finished_reasons']} "
          f"(client cancel/deadline crossed by the server finishing: "
          f"{s['cancel_or_deadline_races']})")
    print(f"RSS MiB: {s['rss_mib']}")
    print(f"end state: {s['end_state']}")
    print(f"violations: {len(violations)}")
    for line in violations[:30]:
        print(f"  {line}")


def run(args) -> tuple[dict, list[str]]:
    daemon = None if args.target else OwnDaemon(args)
    target = args.target or daemon.target
    metrics_url = args.metrics_url or (daemon.metrics_url if daemon else None)
    pid = args.daemon_pid or (daemon.proc.pid if daemon else None)
    log_path = pathlib.Path(args.daemon_log) if args.daemon_log else (
        daemon.log_path if daemon else None)
    client = WinnowClient(target)
    violations, skipped = [], []
    try:
        if daemon:
            daemon.wait_serving(client)
        ctx = context_of(client)
        run_id = f"{int(time.time())}-{args.seed}"
        plans = make_plans(random.Random(args.seed), args.num_requests, ctx, run_id)
        before = scrape(metrics_url) if metrics_url else None
        rss = {"start": rss_mib(pid)}
        t0 = time.monotonic()
        outcomes = run_phase(target, plans[:args.warmup], args.concurrency)
        violations += wait_idle(client, metrics_url)[0]
        rss["warm"] = rss_mib(pid)
        outcomes += run_phase(target, plans[args.warmup:], args.concurrency)
        wall = time.monotonic() - t0
        end_violations, state = wait_idle(client, metrics_url)
        violations += end_violations
        rss["end"] = rss_mib(pid)
        for plan, out in zip(plans, outcomes):
            violations += check_outcome(plan, out)
        log_stats = None
        if log_path:
            records = read_log_records(log_path)
            log_v, log_stats = reconcile_log(plans, outcomes, records, run_id)
            violations += log_v + log_errors(records)
        else:
            skipped.append("daemon log (no --daemon-log)")
        if metrics_url:
            violations += reconcile_metrics(before, scrape(metrics_url), outcomes,
                                            log_stats["reasons"] if log_stats else None)
        else:
            skipped.append("metrics (no --metrics-url)")
        if pid and rss["end"] - rss["warm"] > args.max_rss_growth_mib:
            violations.append(f"RSS grew {rss['end'] - rss['warm']:.1f} MiB after the warm-up "
                              f"(limit {args.max_rss_growth_mib})")
        elif not pid:
            skipped.append("memory (no --daemon-pid)")
    finally:
        client.close()
        if daemon:
            violations += daemon.stop()
    if daemon:  # the drain and shutdown must not log errors either
        violations += [v for v in log_errors(read_log_records(log_path)) if v not in violations]
    summary = summarize(plans, outcomes, wall, rss, state, log_stats)
    summary["skipped_checks"] = skipped
    return summary, violations


def main(argv=None) -> int:
    args = parse_args(argv)
    summary, violations = run(args)
    print_summary(summary, violations)
    if args.json_out:
        config = {k: v for k, v in vars(args).items()}
        config["machine"] = {"platform": platform.platform(), "cpus": os.cpu_count()}
        config["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        pathlib.Path(args.json_out).write_text(json.dumps(
            {"config": config, "summary": summary, "violations": violations}, indent=1))
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
