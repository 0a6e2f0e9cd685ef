"""Compression quality against the full cache on the default model: what holds at budget 0.1.

Tested, not assumed (issue 4): bench/quality_bench (C++, Model + CompressionSession directly)
runs 12 long-context tasks from bench/quality/tasks.py (3 each of passkey, multi-key retrieval,
document QA and copy, ~600-950-token prompts, the document marked as compressible context)
for each policy below at budgets 0.1 and 0.2, against the full cache of the same prompt. The
tasks (seed 101) are not the published table's (seed 1, docs/experiments/compression-retrieval.md).

Metrics, per task (bench/quality_bench.cc explains how they are computed):
  - KL: mean over generated tokens 2..16 of KL(full || compressed) of the next-token
    distribution, teacher-forced on the full cache's greedy tokens (token 1 comes from the
    full-cache prefill for every policy, so it carries no signal);
  - top-1 agreement: share of those positions where both argmaxes agree;
  - retained accuracy: of the tasks the full cache solves, the share the compressed free-running
    greedy generation still solves.

Criteria: a policy *beats* a baseline when its mean KL is lower AND a one-sided exact paired
sign-flip permutation test on the per-task KL differences gives p < 0.05 (winning by noise on
a couple of tasks does not pass). It *stays close to the full cache* when top-1 agreement
>= 0.9 and retained accuracy >= 0.75. Every budget is the fraction of the whole prompt's KV,
so all policies compare at equal memory.

What the issue hoped for — every seed policy close to the full cache and beating StreamingLLM
and H2O at 0.1 — does not all hold on SmolLM2-135M; this file asserts what was measured, so a
regression in any of it fails (numbers and reasons in docs/experiments/compression-retrieval.md):
  - xkv, aircache, tokenselect and winnowkv beat both baselines at 0.1; vl_cache beats
    StreamingLLM only;
  - tokenselect stays close at 0.1 (it evicts nothing); xkv and winnowkv stay close from 0.2;
  - elastic_cache beats neither (its paper's range is 1.0 down to 0.2, on description tasks),
    so it has no claim here.

Runtime: one prefill per task, then 1-2 compressions per policy and budget (H2O's replays a
full QK pass); about 2 minutes on a 2-core machine.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "quality"))

import score  # noqa: E402
import tasks as taskgen  # noqa: E402

BASELINES = ["streaming_llm", "h2o"]
BUDGETS = [0.1, 0.2]
NUM_PER_KIND = taskgen.ASSERTED_PER_KIND
TARGET_TOKENS = taskgen.ASSERTED_TOKENS
TASK_SEED = taskgen.ASSERTED_SEED
GEN_TOKENS = taskgen.ASSERTED_GEN_TOKENS
P_MAX = 0.05
MIN_TOP1 = 0.9
MIN_RETAINED_ACCURACY = 0.75

# (policy, baseline, budget) pairs asserted to win; (policy, budget) asserted close.
BEATS = [(p, b, 0.1) for p in ("xkv", "aircache", "tokenselect", "winnowkv")
         for b in BASELINES] + [("vl_cache", "streaming_llm", 0.1)]
CLOSE = [("tokenselect", 0.1), ("xkv", 0.2), ("tokenselect", 0.2), ("winnowkv", 0.2)]
POLICIES = BASELINES + sorted({p for p, _, _ in BEATS} | {p for p, _ in CLOSE})


def bench_path() -> pathlib.Path:
    # `make py-test` sets WINNOW_BIN=<build>/winnow; quality_bench is built next to it.
    winnow = os.environ.get("WINNOW_BIN")
    build = pathlib.Path(winnow).parent if winnow else REPO / "build"
    return pathlib.Path(os.environ.get("WINNOW_QUALITY_BENCH", build / "quality_bench"))


@pytest.fixture(scope="module")
def quality(model_path, tmp_path_factory):
    bench = bench_path()
    if not bench.exists():
        pytest.fail(f"quality_bench not found at {bench}; build it (ninja -C build quality_bench)"
                    " or set WINNOW_QUALITY_BENCH")
    task_list = taskgen.generate(NUM_PER_KIND, TARGET_TOKENS, TASK_SEED)
    tmp = tmp_path_factory.mktemp("quality")
    tasks_path = tmp / "tasks.jsonl"
    out_path = tmp / "out.json"
    tasks_path.write_text("".join(json.dumps(t) + "\n" for t in task_list))
    cmd = [str(bench), f"--model={model_path}", f"--tasks={tasks_path}",
           f"--policies={','.join(POLICIES)}", f"--budgets={','.join(map(str, BUDGETS))}",
           f"--gen-tokens={GEN_TOKENS}", f"--threads={os.cpu_count() or 1}",
           # Greedy generations only where accuracy is asserted: KL suffices elsewhere.
           f"--free-run={','.join(sorted({p for p, _ in CLOSE}))}", f"--json-out={out_path}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, f"quality_bench failed:\n{proc.stderr[-4000:]}"
    result = json.loads(out_path.read_text())
    assert not result["errors"], result["errors"]
    agg = score.aggregate(result, {t["id"]: t for t in task_list})
    # Printed with -s / on failure: the numbers behind every verdict.
    for (policy, budget), c in sorted(agg["cells"].items()):
        print(f"{policy:>14} @ {budget:g}: KL {c['kl_mean']:.3f}  top-1 {c['top1']:.2f}  "
              f"retained accuracy {c['retained_accuracy']:.2f}  kept {c['retention']:.3f}")
    return agg


def test_full_cache_solves_the_tasks(quality):
    # Otherwise "retained accuracy" would rest on too few tasks to mean anything.
    assert quality["full_accuracy"] >= 0.5, quality["full_ok"]


@pytest.mark.parametrize("policy,baseline,budget", BEATS)
def test_beats_baseline(quality, policy, baseline, budget):
    mine = quality["cells"][(policy, budget)]["kl_per_task"]
    theirs = quality["cells"][(baseline, budget)]["kl_per_task"]
    p = score.paired_permutation_p(mine, theirs)
    wins, ties, losses = score.paired_wins(mine, theirs)
    detail = (f"{policy} KL {score.mean(mine.values()):.3f} vs {baseline} "
              f"{score.mean(theirs.values()):.3f} at {budget}; per-task wins/ties/losses "
              f"{wins}/{ties}/{losses}; permutation p = {p:.4f}")
    assert score.mean(mine.values()) < score.mean(theirs.values()) and p < P_MAX, detail


@pytest.mark.parametrize("policy,budget", CLOSE)
def test_close_to_full_cache(quality, policy, budget):
    c = quality["cells"][(policy, budget)]
    detail = (f"{policy} at {budget}: top-1 agreement {c['top1']:.2f} (need >= {MIN_TOP1}), "
              f"retained accuracy {c['retained_accuracy']:.2f} (need >= "
              f"{MIN_RETAINED_ACCURACY}), KL {c['kl_mean']:.3f}, kept {c['retention']:.3f}")
    assert c["top1"] >= MIN_TOP1 and c["retained_accuracy"] >= MIN_RETAINED_ACCURACY, detail
