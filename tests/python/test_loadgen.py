"""bench/loadgen.py's workloads against a live daemon: the prompts it builds share exactly what
each workload means to share, which the prefix cache's usage.cached_prompt_tokens shows."""

from __future__ import annotations

import json
import pathlib
import sys

from daemon_harness import Daemon

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
import loadgen  # noqa: E402


def run_loadgen(daemon: Daemon, tmp_path: pathlib.Path, *args: str) -> dict:
    out = tmp_path / "run.json"
    rc = loadgen.main(["--target", daemon.target, "--mode", "concurrency",
                       "--output-len", "fixed:2", "--json-out", str(out), *args])
    result = json.loads(out.read_text())
    assert rc == 0, result["summary"]
    return result


def test_workloads_share_only_what_they_mean_to(tmp_path):
    with Daemon("--block-size", "16") as d:
        random_run = run_loadgen(d, tmp_path, "--workload", "random", "--seed", "1",
                                 "--num-requests", "4", "--concurrency", "2",
                                 "--prompt-len", "fixed:40")
        # Distinct prompts: no full block in common.
        assert random_run["summary"]["cached_prompt_tokens"] == 0

        shared = run_loadgen(d, tmp_path, "--workload", "shared-prefix", "--seed", "2",
                             "--num-requests", "4", "--concurrency", "1",
                             "--shared-prefix-len", "64", "--prompt-len", "fixed:8")
        cached = [r["cached_prompt_tokens"] for r in shared["requests"]]
        # The first computes the 64-token prefix (4 blocks); the others find it, and no more.
        assert cached == [0, 64, 64, 64]

        chat = run_loadgen(d, tmp_path, "--workload", "multi-turn", "--seed", "3",
                           "--num-requests", "6", "--turns", "3", "--concurrency", "2",
                           "--prompt-len", "fixed:40")
        records = chat["requests"]
        assert [r["status"] for r in records] == ["OK"] * 6
        for turn, r in enumerate(records):
            if turn % 3 == 0:
                assert r["cached_prompt_tokens"] == 0
            else:
                # The history up to the last full block of the previous turn's prompt.
                previous = records[turn - 1]["prompt_tokens"]
                assert r["cached_prompt_tokens"] == previous // 16 * 16
            assert r["prompt_tokens"] > (turn % 3) * 40


def test_multi_turn_history_compression(tmp_path):
    # Each turn compresses its history in 32-token stages; the next turn attaches them (a whole
    # number of stages) and holds less KV than its prompt.
    with Daemon("--block-size", "16") as d:
        chat = run_loadgen(d, tmp_path, "--workload", "multi-turn", "--seed", "4",
                           "--num-requests", "6", "--turns", "3", "--concurrency", "2",
                           "--prompt-len", "fixed:40", "--kv-compression",
                           '{"policy": "kvzip", "budget": 0.25, "scope": "history", '
                           '"stage_tokens": 32}')
        records = chat["requests"]
        assert [r["status"] for r in records] == ["OK"] * 6
        for third in records[2::3]:
            assert third["cached_prompt_tokens"] > 0
            assert third["cached_prompt_tokens"] % 32 == 0
            assert third["kv_tokens"] < third["prompt_tokens"]
