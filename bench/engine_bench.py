#!/usr/bin/env python3
"""winnow vs llama.cpp on the same GGUF: prefill tok/s and decode tok/s at several batch sizes.

Runs bench/engine_bench (the C++ Model::Forward benchmark) as a subprocess and llama.cpp in this
process through llama-cpp-python's low-level API, with the same thread count, prompt length,
decode steps, batch sizes and token ids. The two engines alternate, round after round, so that
both see the same machine state; each metric keeps its best round. Prints a table and writes
JSON (default bench/results/engine.json).

    .venv/bin/python bench/engine_bench.py --model models/SmolLM2-135M-Instruct.Q4_1.gguf \
        --winnow-bench build/engine_bench
"""

import argparse
import ctypes
import datetime
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

# Decode steps before the timed ones (matches kDecodeWarmupSteps in engine_bench.cc).
DECODE_WARMUP_STEPS = 4
# Suffix of the metrics counted in tokens per process-CPU second rather than per wall second. At
# --threads=1 they measure the work itself, almost regardless of other load on the machine.
CPU = "@cpu"


class Watch:
    """Wall and process-CPU time of a span (CPU: every thread of this process)."""

    def __init__(self):
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()

    def elapsed(self):
        return time.perf_counter() - self.wall0, time.process_time() - self.cpu0


def token_id(seq, pos):
    """Deterministic prompt token; mirrors TokenId() in bench/engine_bench.cc."""
    h = ((seq + 1) * 2654435761 + pos * 40503) & 0xFFFFFFFF
    return 1000 + ((h ^ (h >> 15)) % 20000)


def prompt(seq, n):
    return [token_id(seq, i) for i in range(n)]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    p.add_argument("--winnow-bench", default="build/engine_bench",
                   help="path to the engine_bench executable")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--prefill-chunk", type=int, default=512)
    p.add_argument("--decode-tokens", type=int, default=64)
    p.add_argument("--decode-context", type=int, default=64,
                   help="prompt tokens per sequence before the decode steps")
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--kv-cache-dtype", default="f16", choices=["f32", "f16", "bf16", "q8_0"],
                   help="winnow's KV cache dtype (llama.cpp's default cache is f16 too)")
    p.add_argument("--cpu-activations", default="q8", choices=["f32", "q8"],
                   help="winnow's matmul activations (llama.cpp quantises them to 8 bits too)")
    p.add_argument("--rounds", type=int, default=2,
                   help="alternating winnow/llama.cpp rounds; each metric keeps its best")
    p.add_argument("--out", default="bench/results/engine.json")
    p.add_argument("--skip-llama", action="store_true", help="measure winnow only")
    p.add_argument("--omp-wait-policy", choices=["active", "passive"],
                   help="OMP_WAIT_POLICY for llama.cpp's OpenMP threads (default: inherit). Its "
                        "barriers spin without yielding, so on a machine with other load and "
                        "threads == cores a descheduled peer stalls every barrier; passive "
                        "sleeps instead. winnow's pool spins with yields and is unaffected. "
                        "With active, llama.cpp's idle threads (in this process) keep spinning "
                        "while winnow runs: after round 1 winnow shares the cores with them.")
    args = p.parse_args()
    args.batches = [int(b) for b in args.batches.split(",") if b]
    return args


# ---------------------------------------------------------------------------------------------
# winnow


def run_winnow(args):
    cmd = [args.winnow_bench, "--json", f"--model={args.model}", f"--threads={args.threads}",
           f"--prompt-tokens={args.prompt_tokens}", f"--prefill-chunk={args.prefill_chunk}",
           f"--decode-tokens={args.decode_tokens}", f"--decode-context={args.decode_context}",
           f"--batches={','.join(map(str, args.batches))}", "--reps=1",
           f"--kv-cache-dtype={args.kv_cache_dtype}",
           f"--cpu-activations={args.cpu_activations}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"engine_bench failed ({proc.returncode}): {proc.stderr.strip()}")
    r = json.loads(proc.stdout)
    out, tokens = {}, {}
    for key in ("prefill", "prefill_chunked"):
        out[key] = r[key]["tok_s"]
        out[key + CPU] = r[key]["tok_per_cpu_s"]
    for d in r["decode"]:
        out[f"decode_b{d['batch']}"] = d["tok_s"]
        out[f"decode_b{d['batch']}" + CPU] = d["tok_per_cpu_s"]
        tokens[d["batch"]] = d["seq0_tokens"]
    return out, tokens


# ---------------------------------------------------------------------------------------------
# llama.cpp


@ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
def _quiet_log(level, text, user_data):
    # llama.cpp logs every tensor on load; the table is what this script is for.
    pass


class LlamaCpp:
    """One llama.cpp model; a fresh context per measurement shape."""

    def __init__(self, args):
        import llama_cpp
        self.lc = llama_cpp
        self.args = args
        llama_cpp.llama_log_set(_quiet_log, None)
        llama_cpp.llama_backend_init()
        mparams = llama_cpp.llama_model_default_params()
        self.model = llama_cpp.llama_model_load_from_file(args.model.encode(), mparams)
        if not self.model:
            sys.exit(f"llama.cpp could not load {args.model}")
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self.model))
        self.system_info = llama_cpp.llama_print_system_info().decode().strip()
        self.version = llama_cpp.__version__

    def close(self):
        self.lc.llama_model_free(self.model)

    def _context(self, n_seq, tokens_per_seq, n_batch):
        lc = self.lc
        cp = lc.llama_context_default_params()
        # The KV cache is split evenly between sequences (kv_unified is off), so n_ctx covers
        # every sequence's full length; llama.cpp rounds it up as it needs.
        cp.n_ctx = n_seq * (tokens_per_seq + 16)
        cp.n_batch = n_batch
        cp.n_ubatch = n_batch  # one prompt is one compute graph, as in winnow's one forward
        cp.n_seq_max = n_seq
        cp.n_threads = self.args.threads
        cp.n_threads_batch = self.args.threads
        cp.no_perf = True
        ctx = lc.llama_init_from_model(self.model, cp)
        if not ctx:
            sys.exit("llama.cpp could not create a context")
        return ctx

    def _decode(self, ctx, batch, entries):
        """entries: (token, pos, seq, wants_logits) tuples."""
        batch.n_tokens = len(entries)
        for i, (tok, pos, seq, logits) in enumerate(entries):
            batch.token[i] = tok
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = 1 if logits else 0
        rc = self.lc.llama_decode(ctx, batch)
        if rc != 0:
            sys.exit(f"llama_decode returned {rc}")

    def _argmax(self, ctx, rows):
        ptr = self.lc.llama_get_logits(ctx)  # waits for the computation
        logits = np.ctypeslib.as_array(ptr, shape=(rows, self.n_vocab))
        return logits.argmax(axis=1)

    def prefill(self, chunk):
        """Best-of-one (after a warm-up) prefill of one prompt in chunks of `chunk` tokens."""
        lc, a = self.lc, self.args
        n_batch = min(chunk, a.prompt_tokens)
        ctx = self._context(1, a.prompt_tokens, n_batch)
        batch = lc.llama_batch_init(n_batch, 0, 1)
        mem = lc.llama_get_memory(ctx)
        toks = prompt(0, a.prompt_tokens)
        for rep in range(2):  # rep 0 warms up
            lc.llama_memory_clear(mem, True)
            watch = Watch()
            for start in range(0, a.prompt_tokens, chunk):
                n = min(chunk, a.prompt_tokens - start)
                last = start + n == a.prompt_tokens
                self._decode(ctx, batch, [(toks[start + i], start + i, 0, last and i == n - 1)
                                          for i in range(n)])
            self._argmax(ctx, 1)
            wall, cpu = watch.elapsed()
        lc.llama_batch_free(batch)
        lc.llama_free(ctx)
        return a.prompt_tokens / wall, a.prompt_tokens / cpu

    def decode(self, b):
        """Decode tok/s at batch `b`: b sequences, one token each per llama_decode.

        Returns (tok/s, tok per CPU-s, greedy tokens of sequence 0) like engine_bench's."""
        lc, a = self.lc, self.args
        length = a.decode_context + DECODE_WARMUP_STEPS + a.decode_tokens
        n_batch = max(a.prefill_chunk, a.decode_context, b)
        ctx = self._context(b, length, n_batch)
        batch = lc.llama_batch_init(n_batch, 0, b)
        # Prefill: whole prompts packed into batches of at most n_batch tokens.
        per_call = max(1, n_batch // a.decode_context)
        nxt = [0] * b
        for first in range(0, b, per_call):
            seqs = range(first, min(b, first + per_call))
            entries = []
            for s in seqs:
                toks = prompt(s + 1, a.decode_context)
                entries += [(t, i, s, i == a.decode_context - 1) for i, t in enumerate(toks)]
            self._decode(ctx, batch, entries)
            for s, tok in zip(seqs, self._argmax(ctx, len(seqs))):
                nxt[s] = int(tok)
        pos = a.decode_context
        seq0 = [nxt[0]]

        def step():
            nonlocal pos, nxt
            self._decode(ctx, batch, [(nxt[s], pos, s, True) for s in range(b)])
            nxt = [int(t) for t in self._argmax(ctx, b)]
            seq0.append(nxt[0])
            pos += 1

        for _ in range(DECODE_WARMUP_STEPS):
            step()
        watch = Watch()
        for _ in range(a.decode_tokens):
            step()
        wall, cpu = watch.elapsed()
        lc.llama_batch_free(batch)
        lc.llama_free(ctx)
        return b * a.decode_tokens / wall, b * a.decode_tokens / cpu, seq0

    def run(self):
        out, tokens = {}, {}
        out["prefill"], out["prefill" + CPU] = self.prefill(self.args.prompt_tokens)
        out["prefill_chunked"], out["prefill_chunked" + CPU] = self.prefill(self.args.prefill_chunk)
        for b in self.args.batches:
            key = f"decode_b{b}"
            out[key], out[key + CPU], tokens[b] = self.decode(b)
        return out, tokens


# ---------------------------------------------------------------------------------------------


def machine():
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gib = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal"):
                    mem_gib = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return {"cpu": cpu, "nproc": os.cpu_count(), "mem_gib": mem_gib,
            "platform": platform.platform()}


def labels(args):
    rows = [("prefill", f"prefill {args.prompt_tokens} tok, one forward"),
            ("prefill_chunked",
             f"prefill {args.prompt_tokens} tok, chunks of {args.prefill_chunk}")]
    rows += [(f"decode_b{b}", f"decode batch {b} ({args.decode_tokens} steps)")
             for b in args.batches]
    return rows


def main():
    args = parse_args()
    if args.omp_wait_policy:
        # Must be set before llama_cpp (and so libgomp) is loaded.
        os.environ["OMP_WAIT_POLICY"] = args.omp_wait_policy.upper()
    if args.omp_wait_policy == "active" and args.rounds > 1 and not args.skip_llama:
        # Measured on 2 cores: winnow's round went from 13.6 s to 36 s once llama.cpp had run.
        print("warning: with --omp-wait-policy active, llama.cpp's idle OpenMP threads spin "
              "through winnow's later rounds; only round 1 of winnow is uncontended",
              file=sys.stderr)
    if not os.path.exists(args.winnow_bench):
        sys.exit(f"{args.winnow_bench} not found; build it: ninja -C build engine_bench")
    load_at_start = os.getloadavg()
    llama = None if args.skip_llama else LlamaCpp(args)
    best = {"winnow": {}, "llama.cpp": {}}
    tokens = {}
    for r in range(args.rounds):
        rounds = [("winnow", lambda: run_winnow(args))]
        if llama:
            rounds.append(("llama.cpp", llama.run))
        for name, fn in rounds:
            t0 = time.perf_counter()
            res, tokens[name] = fn()
            print(f"round {r + 1}/{args.rounds} {name}: {time.perf_counter() - t0:.1f} s",
                  file=sys.stderr)
            for k, v in res.items():
                best[name][k] = max(best[name].get(k, 0.0), v)
    if llama:
        llama.close()

    rows = []
    fmt = lambda v, spec: format(v, spec) if v is not None else "-"
    for suffix, unit in (("", "tok/s"), (CPU, "tok per process-CPU second")):
        print(f"| metric ({unit}) | winnow | llama.cpp | ratio (winnow/llama.cpp) |")
        print("|---|---:|---:|---:|")
        for key, label in labels(args):
            w = best["winnow"].get(key + suffix)
            l = best["llama.cpp"].get(key + suffix)
            ratio = w / l if w and l else None
            rows.append({"metric": key + suffix, "label": label, "unit": unit, "winnow": w,
                         "llama_cpp": l, "ratio": ratio})
            print(f"| {label} | {fmt(w, '.1f')} | {fmt(l, '.1f')} | {fmt(ratio, '.2f')} |")
        print()

    # Greedy decoding of the same prompt by both engines should agree for a while; float32 vs
    # quantised-activation arithmetic lets near-ties flip eventually. A mismatch at the first
    # token would mean the two did not run the same model and the speeds are not comparable.
    agreement = {}
    if llama:
        for b in args.batches:
            w, l = tokens["winnow"][b], tokens["llama.cpp"][b]
            same = next((i for i, (x, y) in enumerate(zip(w, l)) if x != y), min(len(w), len(l)))
            agreement[b] = {"identical_prefix": same, "of": len(w)}
            print(f"greedy tokens of sequence 0 at batch {b}: first {same} of {len(w)} identical",
                  file=sys.stderr)

    result = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.relpath(sys.executable)] + sys.argv),
        "machine": machine(),
        "model": args.model,
        "threads": args.threads,
        "kv_cache_dtype": args.kv_cache_dtype,
        "cpu_activations": args.cpu_activations,
        "prompt_tokens": args.prompt_tokens,
        "prefill_chunk": args.prefill_chunk,
        "decode_tokens": args.decode_tokens,
        "decode_context": args.decode_context,
        "batches": args.batches,
        "rounds": args.rounds,
        "llama_cpp": ({"version": llama.version, "system_info": llama.system_info,
                       "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(unset)")}
                      if llama else None),
        # Other processes compete with both engines; the 1-minute load average says how much.
        "load_average_at_start": load_at_start,
        "load_average_at_end": os.getloadavg(),
        "rows": rows,
        "greedy_agreement": agreement,
    }
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
