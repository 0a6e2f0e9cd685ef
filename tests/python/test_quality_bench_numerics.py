"""quality_bench's numerics flags (--cpu-activations, --kv-dtype) and the reference's top-2
margins, on a real document and the default model.

docs/experiments/numerics-floor.md measured that an f16 KV cache keeps all 32
greedy tokens of the f32 reference on each of the twelve short documents: asserted here on the
first one, so a change that makes f16 KV drift shows up. Runtime: two prefills of ~1.5k tokens.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from test_compression_quality import REPO, bench_path

sys.path.insert(0, str(REPO / "bench" / "quality"))

import documents  # noqa: E402

GEN_TOKENS = 16


def run_references(model_path, tasks_path, out, *flags):
    cmd = [str(bench_path()), f"--model={model_path}", f"--tasks={tasks_path}", "--policies=",
           f"--gen-tokens={GEN_TOKENS}", f"--threads={os.cpu_count() or 1}",
           f"--json-out={out}", *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"quality_bench failed:\n{proc.stderr[-4000:]}"
    return json.loads(out.read_text())


def test_f16_kv_keeps_the_f32_references_tokens(model_path, tmp_path):
    tasks = documents.generate("short", "plain", 1)
    if not tasks:
        pytest.skip("the documents need Python 3.11's pydoc_data")
    tasks_path = tmp_path / "tasks.jsonl"
    tasks_path.write_text(json.dumps(tasks[0]) + "\n")
    f32 = run_references(model_path, tasks_path, tmp_path / "f32.json")
    f16 = run_references(model_path, tasks_path, tmp_path / "f16.json", "--kv-dtype=f16")
    assert (f32["kv_dtype"], f32["cpu_activations"]) == ("f32", "f32")
    assert (f16["kv_dtype"], f16["cpu_activations"]) == ("f16", "f32")
    ref32, ref16 = f32["tasks"][0], f16["tasks"][0]
    assert ref16["ref_tokens"] == ref32["ref_tokens"]
    margins = ref32["ref_margins"]
    assert len(margins) == GEN_TOKENS and all(m >= 0 for m in margins)
    # The two runs' margins differ only by f16 rounding of the cache.
    assert max(abs(a - b) for a, b in zip(margins, ref16["ref_margins"])) < 0.05


@pytest.mark.parametrize("flag,accepted", [("--kv-dtype=f8", "f32, f16, bf16 or q8_0"),
                                           ("--cpu-activations=f16", "f32 or q8")])
def test_an_unknown_numerics_flag_is_refused_by_name(model_path, tmp_path, flag, accepted):
    proc = subprocess.run([str(bench_path()), f"--model={model_path}",
                           f"--tasks={tmp_path / 'none.jsonl'}", flag],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert flag.split("=")[0] in proc.stderr and accepted in proc.stderr, proc.stderr
