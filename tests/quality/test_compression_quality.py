"""At budget 0.1 the seed policies stay close to the full cache and beat StreamingLLM and H2O.

Tested, not assumed (issue 4): bench/quality_bench (C++, Model + CompressionSession directly)
runs 8 long-context tasks from bench/quality/tasks.py (2 each of passkey, multi-key retrieval,
document QA and copy, ~700-token prompts, the document marked as compressible context) with
every policy below at budget 0.1, against the full cache of the same prompt.

Metrics, per task (bench/quality_bench.cc explains how they are computed):
  - KL: mean over generated tokens 2..16 of KL(full || compressed) of the next-token
    distribution, teacher-forced with the full cache's greedy continuation, so that every step
    compares the same context. Continuous, so a handful of tasks separates policies.
  - top-1: share of those steps whose compressed argmax is the full cache's token.
  - retained accuracy: of the tasks the full cache solves, the share the compressed cache's own
    greedy generation still solves.

Criteria (fixed before looking at results):
  - beats a baseline: lower mean KL over the 8 tasks AND a one-sided exact paired sign-flip
    permutation test on the per-task KL differences with p < 0.05 (8 tasks: the smallest
    possible p is 1/256; winning by noise on a couple of tasks does not pass).
  - close to the full cache: top-1 agreement >= 0.9 and retained accuracy >= 0.75.

Runtime: one prefill per task, then ~2 compressions per policy (H2O's replays a full QK pass);
about 1.5-3 minutes on 2 cores.
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

SEED_POLICIES = ["snapkv", "vl_cache", "xkv", "aircache"]
BASELINES = ["streaming_llm", "h2o"]
BUDGET = 0.1
NUM_PER_KIND = 2
TARGET_TOKENS = 700
TASK_SEED = 101
GEN_TOKENS = 16
P_MAX = 0.05
MIN_TOP1 = 0.9
MIN_RETAINED_ACCURACY = 0.75


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
           f"--policies={','.join(BASELINES + SEED_POLICIES)}", f"--budgets={BUDGET}",
           f"--gen-tokens={GEN_TOKENS}", f"--threads={os.cpu_count() or 1}",
           # Greedy generations only where accuracy is asserted: the baselines' KL suffices.
           f"--free-run={','.join(SEED_POLICIES)}", f"--json-out={out_path}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"quality_bench failed:\n{proc.stderr[-4000:]}"
    result = json.loads(out_path.read_text())
    assert not result["errors"], result["errors"]
    agg = score.aggregate(result, {t["id"]: t for t in task_list})
    # Printed with -s / on failure: the numbers behind every verdict.
    for (policy, budget), c in sorted(agg["cells"].items()):
        print(f"{policy:>14} @ {budget:g}: KL {c['kl_mean']:.3f}  top-1 {c['top1']:.2f}  "
              f"retained accuracy {c['retained_accuracy']:.2f}  kept {c['retention']:.3f}")
    return agg


def cell(agg, policy):
    return agg["cells"][(policy, BUDGET)]


def test_full_cache_solves_the_tasks(quality):
    # Otherwise "retained accuracy" would rest on too few tasks to mean anything.
    assert quality["full_accuracy"] >= 0.5, quality["full_ok"]


@pytest.mark.parametrize("baseline", BASELINES)
@pytest.mark.parametrize("policy", SEED_POLICIES)
def test_beats_baseline_at_budget_0_1(quality, policy, baseline):
    mine = cell(quality, policy)["kl_per_task"]
    theirs = cell(quality, baseline)["kl_per_task"]
    p = score.paired_permutation_p(mine, theirs)
    wins, ties, losses = score.paired_wins(mine, theirs)
    detail = (f"{policy} KL {score.mean(mine.values()):.3f} vs {baseline} "
              f"{score.mean(theirs.values()):.3f}; per-task wins/ties/losses {wins}/{ties}/"
              f"{losses}; permutation p = {p:.4f}")
    assert score.mean(mine.values()) < score.mean(theirs.values()) and p < P_MAX, detail


@pytest.mark.parametrize("policy", SEED_POLICIES)
def test_close_to_full_cache_at_budget_0_1(quality, policy):
    c = cell(quality, policy)
    detail = (f"{policy}: top-1 agreement {c['top1']:.2f} (need >= {MIN_TOP1}), retained "
              f"accuracy {c['retained_accuracy']:.2f} (need >= {MIN_RETAINED_ACCURACY}), "
              f"KL {c['kl_mean']:.3f}, kept {c['retention']:.3f}")
    assert c["top1"] >= MIN_TOP1 and c["retained_accuracy"] >= MIN_RETAINED_ACCURACY, detail
