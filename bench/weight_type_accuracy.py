#!/usr/bin/env python3
"""--cpu-weight-type's accuracy on a Hugging Face directory: each type against the weights as
stored (`none`), on the same prompts, with the same KV (f32) and activations.

Teacher-forced (`winnow score` over each prompt): the mean and the largest |Δ logprob| of each
next token, and the share of positions whose argmax agrees. Greedy (`winnow generate
--ignore-eos`): the share of prompts whose --max-tokens tokens are all equal, and the mean
length of the common prefix. Also the load time of each type (the best of three runs of
`winnow score` on one token, whose time is nearly all the load). Prints a Markdown table
(README, "Serving your own model").

    .venv/bin/python bench/weight_type_accuracy.py --winnow build/winnow --model DIR
    # DIR made from the default GGUF as tests/python/test_hf_model.py makes it (transformers):
    .venv/bin/python bench/weight_type_accuracy.py --winnow build/winnow \\
        --convert models/SmolLM2-135M-Instruct.Q4_1.gguf --model /tmp/SmolLM2-135M-Instruct
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np

TYPES = ["q8_0", "q5_1", "q5_0", "q4_1", "q4_0"]
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea, there lived",
    "<|im_start|>user\nExplain in two sentences why the sky is blue.<|im_end|>\n"
    "<|im_start|>assistant\n",
    "The three laws of thermodynamics state that energy is conserved, that entropy",
    "Ingredients: 2 cups of flour, 1 teaspoon of salt, 3 eggs. Step 1:",
    "import numpy as np\n\ndef softmax(x):\n",
    "In 1969, the Apollo 11 mission",
]


def run(winnow: str, *args: str) -> str:
    proc = subprocess.run([winnow, *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"winnow {args[0]} failed: {proc.stderr.strip()}")
    return proc.stdout


def scores(winnow: str, model: str, ids: list[int], flags: list[str]) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(ids, f)
        f.flush()
        return json.loads(run(winnow, "score", "--model", model, "--tokens-file", f.name,
                              "--kv-cache-dtype", "f32", *flags))


def greedy(winnow: str, model: str, prompt: str, tokens: int, flags: list[str]) -> list[int]:
    out = run(winnow, "generate", "--model", model, "--prompt", prompt, "--max-tokens",
              str(tokens), "--ignore-eos", "--json", "--quiet", "--kv-cache-dtype", "f32", *flags)
    return json.loads(out)["token_ids"]


def load_seconds(winnow: str, model: str, weight_type: str) -> float:
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        f.write("[1]")
        f.flush()
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            run(winnow, "score", "--model", model, "--tokens-file", f.name,
                "--cpu-weight-type", weight_type)
            best = min(best, time.perf_counter() - start)
        return best


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def measure(args, activations: str) -> list[dict]:
    acts = ["--cpu-activations", activations]
    ids = [json.loads(run(args.winnow, "tokenize", "--model", args.model, "--text", p))
           for p in PROMPTS]
    # Scored on the prompt followed by the reference's own greedy continuation: a realistic
    # text of --max-tokens more positions.
    ref_greedy = [greedy(args.winnow, args.model, p, args.max_tokens, acts) for p in PROMPTS]
    texts = [i + g for i, g in zip(ids, ref_greedy)]
    ref = [scores(args.winnow, args.model, t, acts) for t in texts]
    rows = []
    for t in TYPES:
        flags = acts + ["--cpu-weight-type", t]
        deltas, agree, positions, equal, prefix = [], 0, 0, 0, []
        for text, r, prompt, g in zip(texts, ref, PROMPTS, ref_greedy):
            s = scores(args.winnow, args.model, text, flags)
            deltas.extend(np.abs(np.array(s["logprob_next"]) - np.array(r["logprob_next"])))
            agree += sum(a == b for a, b in zip(s["argmax"], r["argmax"]))
            positions += len(text)
            ours = greedy(args.winnow, args.model, prompt, args.max_tokens, flags)
            equal += ours == g
            prefix.append(common_prefix(ours, g))
        rows.append({"type": t, "activations": activations, "mean": float(np.mean(deltas)),
                     "max": float(np.max(deltas)), "argmax": agree / positions,
                     "greedy_equal": equal / len(PROMPTS), "prefix": float(np.mean(prefix))})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--winnow", default="build/winnow")
    p.add_argument("--model", required=True, help="a Hugging Face directory (F32/F16/BF16)")
    p.add_argument("--convert", help="first write --model from this GGUF with transformers")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--activations", nargs="+", default=["q8", "f32"])
    args = p.parse_args()
    if args.convert:
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "python"))
        from test_hf_model import convert_default_model
        convert_default_model(pathlib.Path(args.convert).resolve(), pathlib.Path(args.model))
    loads = {t: load_seconds(args.winnow, args.model, t) for t in ["none"] + TYPES}
    print(f"{len(PROMPTS)} prompts, {args.max_tokens} greedy tokens each; "
          f"load: " + ", ".join(f"{t} {s:.2f} s" for t, s in loads.items()))
    print("| type | activations | mean \\|Δ logprob\\| | max \\|Δ logprob\\| | argmax agrees "
          "| greedy runs equal | common greedy prefix |")
    print("|---|---|---|---|---|---|---|")
    for activations in args.activations:
        for r in measure(args, activations):
            print(f"| {r['type']} | {r['activations']} | {r['mean']:.4f} | {r['max']:.3f} "
                  f"| {100 * r['argmax']:.1f}% | {round(r['greedy_equal'] * len(PROMPTS))}/"
                  f"{len(PROMPTS)} | {r['prefix']:.1f} / {args.max_tokens} |")


if __name__ == "__main__":
    main()
