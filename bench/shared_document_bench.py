#!/usr/bin/env python3
"""Many questions over the same documents, through the daemon's gRPC chat API: no caching,
uncompressed prefix caching, and compressed contexts published for reuse, side by side.

The workload is RAG / document chat: D documents of real prose (bench/quality/needle.py's), each
stating four 7-digit access codes for four offices at random depths, and Q questions per document
(one office each), arriving interleaved (every document's first question, then every second
one, ...), from C closed-loop clients. A request is a chat of two user messages, the document
and the question. Each configuration gets a fresh daemon with the same fixed KV pool:

  none      --enable-prefix-caching false: every question prefills its document;
  prefix    prefix caching on: a question finds its document's blocks if they are still cached;
  POLICY@B  prefix caching on and kv_compression {POLICY, B, scope "context", context_messages 1}:
            the document is compressed alone (query-agnostic) and published; later questions
            attach it (docs/api.md, "Prefix caching");
  aware:POLICY@B
            prefix caching off and kv_compression {POLICY, B}: every question prefills its
            document and compresses the whole prompt, the question in it (query-aware, nothing
            to reuse): what the same budget keeps when the plan may read the question.

Reports per configuration: TTFT p50/p99 (all questions, and those that hit a cached document),
output tokens/s, the share of prompt tokens from a cache, the documents the pool keeps
(compressed: measured, the daemon's winnow_compressed_prefix_contexts at the end; uncompressed
prefix caching: computed, the pool's blocks over one document's, marked "≤"), and answer
accuracy with a 95% Wilson interval. Never asserts.

    .venv/bin/python bench/shared_document_bench.py --documents 8 --questions 4 \\
        --tokens 2000 --kv-blocks 9600 --configs none,prefix,winnowkv@0.1,winnowkv@0.2
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import pathlib
import random
import statistics
import sys
import tempfile
import time
import urllib.request

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "bench" / "quality"))
import capacity  # noqa: E402  (its Daemon starts and stops one `winnow serve`)
import documents  # noqa: E402
import needle  # noqa: E402


def make_documents(count: int, tokens: int, seed: int) -> list[dict]:
    paragraphs = needle.prose_paragraphs()
    if not paragraphs:
        raise SystemExit("shared_document_bench: no source documents on this machine")
    rng = random.Random(f"shared-document:{seed}")
    chars = int(tokens * documents.CHARS_PER_TOKEN)
    return [needle.make_sample(rng, paragraphs, chars, "multikey") for _ in range(count)]


def questions(docs: list[dict], per_document: int) -> list[dict]:
    """Interleaved: round q asks every document its q-th office."""
    out = []
    for q in range(per_document):
        for d, doc in enumerate(docs):
            place, code = doc["keys"][q % len(doc["keys"])]
            out.append({"document": d, "question": f"What is the access code for the {place} "
                        "office?", "code": code})
    return out


def parse_config(entry: str) -> tuple[str, dict | None, bool]:
    """'none' | 'prefix' | '[aware:]POLICY[+param=value...]@BUDGET' -> (label, compression,
    caching)."""
    if entry == "none":
        return entry, None, False
    if entry == "prefix":
        return entry, None, True
    aware = entry.startswith("aware:")
    policy, budget = entry.removeprefix("aware:").rsplit("@", 1)
    compression = needle.compression_for(policy, float(budget))
    if aware:
        return entry, compression, False
    compression.update({"scope": "context", "context_messages": 1})
    return entry, compression, True


def ask(client, doc: dict, q: dict, compression: dict | None, max_tokens: int) -> dict:
    chat = [("user", doc["document"]), ("user", q["question"])]
    start = time.monotonic()
    ttft, text, usage = None, [], None
    for msg in client.generate(chat=chat, max_tokens=max_tokens, compression=compression,
                               timeout=600):
        if ttft is None and msg.token_ids:
            ttft = time.monotonic() - start
        text.append(msg.text)
        if msg.finish_reason:
            usage = msg.usage
    reply = "".join(text)
    return {"document": q["document"], "ttft": ttft, "e2e": time.monotonic() - start,
            "reply": reply, "correct": needle.is_correct(reply, q["code"]),
            "prompt_tokens": usage.prompt_tokens, "cached": usage.cached_prompt_tokens,
            "completion_tokens": usage.completion_tokens}


def run_config(args, entry: str, docs: list[dict], qs: list[dict], log: pathlib.Path) -> dict:
    label, compression, caching = parse_config(entry)
    metrics_port = capacity.free_port()
    daemon = capacity.Daemon(args.bin, args.model, [
        "--enable-prefix-caching", "true" if caching else "false",
        "--kv-blocks", str(args.kv_blocks), "--max-seqs", str(args.concurrency),
        "--metrics-port", str(metrics_port), *args.serve_args.split()], log)
    try:
        start = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
            results = list(pool.map(
                lambda q: ask(daemon.client, docs[q["document"]], q, compression,
                              args.max_tokens), qs))
        wall = time.monotonic() - start
        resident = metric(metrics_port, "winnow_compressed_prefix_contexts")
        info = daemon.client.model_info()
    finally:
        daemon.stop()
    return {"config": label, "wall": wall, "results": results,
            "resident_compressed": resident if compression else None,
            "num_layers": info.num_layers, "block_size": info.block_size}


def metric(port: int, name: str) -> float:
    """One unlabelled-by-us sample of the daemon's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def pct(values: list[float], p: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(p / 100 * len(ordered)) - 1))]


def documents_kept(run: dict, kv_blocks: int) -> str:
    """Measured for compressed contexts; for uncompressed prefix caching the most the pool can
    hold (its blocks over one document's); none for no caching."""
    if run["resident_compressed"] is not None:
        return f"{run['resident_compressed']:g}"
    if run["config"] != "prefix":
        return "0"
    tokens = statistics.mean(r["prompt_tokens"] for r in run["results"])
    blocks = math.ceil(tokens / run["block_size"]) * run["num_layers"]
    return f"≤ {kv_blocks // blocks}"


def summarize(run: dict, kv_blocks: int) -> dict:
    rs = run["results"]
    ttfts = [r["ttft"] for r in rs]
    hits = [r["ttft"] for r in rs if r["cached"] > 0]
    k = sum(r["correct"] for r in rs)
    lo, hi = needle.wilson(k, len(rs))
    prompt = sum(r["prompt_tokens"] for r in rs)
    return {
        "config": run["config"],
        "ttft_p50": pct(ttfts, 50), "ttft_p99": pct(ttfts, 99),
        "hit_ttft_p50": pct(hits, 50) if hits else math.nan,
        "output_tok_s": sum(r["completion_tokens"] for r in rs) / run["wall"],
        "cached_share": sum(r["cached"] for r in rs) / max(1, prompt),
        "resident": documents_kept(run, kv_blocks),
        "correct": k, "n": len(rs), "ci": (lo, hi), "wall": run["wall"],
    }


def table(rows: list[dict]) -> str:
    lines = ["| config | TTFT p50 (ms) | TTFT p99 (ms) | TTFT p50, cached doc (ms) | out tok/s "
             "| prompt tokens from a cache | documents kept | correct | 95% CI |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        hit = "-" if math.isnan(r["hit_ttft_p50"]) else f"{r['hit_ttft_p50'] * 1e3:.0f}"
        lines.append(
            f"| {r['config']} | {r['ttft_p50'] * 1e3:.0f} | {r['ttft_p99'] * 1e3:.0f} | {hit} "
            f"| {r['output_tok_s']:.1f} | {r['cached_share']:.0%} | {r['resident']} "
            f"| {r['correct']}/{r['n']} | {r['ci'][0]:.0%}-{r['ci'][1]:.0%} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=str(REPO / "build" / "winnow"))
    ap.add_argument("--model", default=str(REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--documents", type=int, default=8)
    ap.add_argument("--questions", type=int, default=4, help="per document (at most 4 offices)")
    ap.add_argument("--tokens", type=int, default=2000, help="document length, about")
    ap.add_argument("--kv-blocks", type=int, default=9600,
                    help="the fixed pool (blocks of 16 tokens, one layer each)")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--configs", default="none,prefix,winnowkv@0.1,winnowkv@0.2")
    ap.add_argument("--serve-args", default="")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json-out", type=pathlib.Path)
    args = ap.parse_args(argv)

    docs = make_documents(args.documents, args.tokens, args.seed)
    qs = questions(docs, args.questions)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for entry in args.configs.split(","):
            run = run_config(args, entry, docs, qs, pathlib.Path(tmp) / f"{entry}.log")
            runs.append(run)
            print(f"shared_document_bench: {entry} done in {run['wall']:.0f} s", file=sys.stderr)
            rows = [summarize(r, args.kv_blocks) for r in runs]
            if args.json_out:  # after every configuration, so a stopped run keeps the others
                args.json_out.write_text(json.dumps(
                    {"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows,
                     "runs": runs}, indent=1))
    doc_tokens = statistics.mean(r["prompt_tokens"] for r in runs[0]["results"])
    print(f"{args.documents} documents x {args.questions} questions, prompts ~{doc_tokens:.0f} "
          f"tokens, pool {args.kv_blocks} blocks, {args.concurrency} clients\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
