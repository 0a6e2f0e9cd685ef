"""Compression on real documents with an open-ended instruction (issue 15), against the full
cache on the default model: what the audit found and where winnowkv stands, at budget 0.1.

bench/quality_bench runs the first six short documents of bench/quality/documents.py
(1.2k-1.6k-token sections of the Python Language Reference and licence texts that every Debian 12
machine with Python 3.11 has, sent as plain text with a summarising instruction after them) and
compares each policy's teacher-forced next-token distributions with the full cache's: KL(full
|| compressed) over 32 generated tokens. A policy *beats* another when its mean KL is lower AND
a one-sided exact paired permutation test on the per-document KLs gives p < 0.05 (with six
documents that means winning on all six, or on five by a wide margin).

Asserted, as measured (docs/experiments/compression-documents.md):
  - winnowkv beats streaming_llm, vl_cache and elastic_cache;
  - winnowkv_docs, the document preset, beats winnowkv and xkv;
  - audit, Elastic Cache: the same importance without merging (merge=false) beats the paper's
    merge;
  - audit, VL-Cache: with VL-Cache's own scorer, a uniform split over layers beats its
    sparsity-aware split;
  - lookahead: winnowkv_docs with lookahead=16 (the plan waits for the reply's first 16 tokens
    and scores with their attention too) beats winnowkv_docs on the tokens after its plan (KL
    from generated token 18 on, where both run on a compressed cache).

Runtime: one prefill per document (about 8 s each), four of the policies add a QK pass over
the prompt; about 5 minutes on a 2-core machine.
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
sys.path.insert(0, str(REPO / "tests" / "python"))

import documents  # noqa: E402
import score  # noqa: E402
from test_compression_quality import bench_path  # noqa: E402

BUDGET = 0.1
GEN_TOKENS = 32
DOCUMENTS = 6  # the first six short documents, as measured in docs/experiments/compression-documents.md
P_MAX = 0.05
VL_SCORER = "window=50+kernel=1+pooling=none+gqa=sum+sinks=0"
UNIFORM = f"composite+allocation=uniform+{VL_SCORER}"
SPARSITY = f"composite+allocation=sparsity+{VL_SCORER}"
BEATS = [("winnowkv", "streaming_llm"), ("winnowkv", "vl_cache"),
         ("winnowkv", "elastic_cache"), ("elastic_cache+merge=false", "elastic_cache"),
         (UNIFORM, SPARSITY), ("winnowkv_docs", "winnowkv"), ("winnowkv_docs", "xkv")]
LOOKAHEAD = 16
# Compared on the steps after the lookahead's plan only: before it the lookahead policy runs on
# the full cache, which would win by construction.
BEATS_AFTER_LOOKAHEAD = [(f"winnowkv_docs+lookahead={LOOKAHEAD}", "winnowkv_docs")]
POLICIES = sorted({p for pair in BEATS + BEATS_AFTER_LOOKAHEAD for p in pair})


@pytest.fixture(scope="module")
def kl_per_document(model_path, tmp_path_factory):
    bench = bench_path()
    if not bench.exists():
        pytest.fail(f"quality_bench not found at {bench}; build it (ninja -C build quality_bench)"
                    " or set WINNOW_QUALITY_BENCH")
    tasks = documents.generate("short", "plain", DOCUMENTS)
    if len(tasks) < DOCUMENTS:
        pytest.skip("the documents need Python 3.11's pydoc_data and Debian's "
                    "/usr/share/common-licenses")
    tmp = tmp_path_factory.mktemp("documents")
    tasks_path = tmp / "tasks.jsonl"
    out_path = tmp / "out.json"
    tasks_path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    cmd = [str(bench), f"--model={model_path}", f"--tasks={tasks_path}",
           f"--policies={','.join(POLICIES)}", f"--budgets={BUDGET}",
           f"--gen-tokens={GEN_TOKENS}", f"--threads={os.cpu_count() or 1}", "--free-run=none",
           f"--json-out={out_path}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, f"quality_bench failed:\n{proc.stderr[-4000:]}"
    result = json.loads(out_path.read_text())
    assert not result["errors"], result["errors"]
    kl: dict[str, dict[str, float]] = {}
    kl_after: dict[str, dict[str, float]] = {}
    for run in result["runs"]:
        kl.setdefault(run["policy"], {})[run["task"]] = score.mean(run["kl"])
        kl_after.setdefault(run["policy"], {})[run["task"]] = score.mean(run["kl"][LOOKAHEAD:])
    for policy, per_doc in sorted(kl.items()):
        print(f"{policy:>60} @ {BUDGET:g}: KL {score.mean(per_doc.values()):.3f}, from "
              f"token {LOOKAHEAD + 2} on {score.mean(kl_after[policy].values()):.3f}")
    return {"all": kl, "after_lookahead": kl_after}


@pytest.mark.parametrize("better,worse", BEATS)
def test_beats(kl_per_document, better, worse):
    assert_beats(kl_per_document["all"], better, worse)


@pytest.mark.parametrize("better,worse", BEATS_AFTER_LOOKAHEAD)
def test_beats_after_the_lookahead(kl_per_document, better, worse):
    assert_beats(kl_per_document["after_lookahead"], better, worse)


def assert_beats(kl, better, worse):
    mine, theirs = kl[better], kl[worse]
    assert len(mine) == len(theirs) == DOCUMENTS
    p = score.paired_permutation_p(mine, theirs)
    wins, ties, losses = score.paired_wins(mine, theirs)
    detail = (f"{better} KL {score.mean(mine.values()):.3f} vs {worse} "
              f"{score.mean(theirs.values()):.3f}; wins/ties/losses {wins}/{ties}/{losses}; "
              f"permutation p = {p:.4f}")
    assert score.mean(mine.values()) < score.mean(theirs.values()) and p < P_MAX, detail
