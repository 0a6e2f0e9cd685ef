"""bench/quality/table.py: the table docs/compression.md ends with (its rows from saved cells, the
markers it writes between) and a short run of its cost and KL measurements against the real
binaries."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

from daemon_harness import binary_path, model_path

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench" / "quality"))
import table  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]


def runs(correct: list[bool]) -> list[dict]:
    return [{"correct": c, "depths": [0.5]} for c in correct]


def test_rows_from_saved_cells():
    cells = {"number|4000|aware|none|-": runs([True] * 9 + [False]),
             "number|4000|aware|snapkv|0.1": runs([True] * 8 + [False] * 2),
             "number|4000|agnostic|none|-": runs([True] * 10)}
    kl = {"snapkv|0.1": {"kl": 1.2345, "kept": 0.1049}}
    cost = {"4000": {"none": [{"seconds": 2.0, "prompt_tokens": 4000}],
                     "snapkv|0.1": [{"seconds": 2.2, "prompt_tokens": 4000},
                                    {"seconds": 9.0, "prompt_tokens": 4000},
                                    {"seconds": 2.4, "prompt_tokens": 4000}]}}
    text = table.render([("none", 1.0), ("snapkv", 0.1), ("h2o", 0.1)], 4000, ["number"],
                        cells, kl, cost, samples=10)
    lines = text.splitlines()
    assert lines[2] == "| none (full cache) | – | 90% (60%–98%) | 100% (72%–100%) | 0 | 1 | 500 |"
    assert lines[3].startswith("| snapkv | 0.1 | 80% (49%–94%); 89% of full (")
    # No agnostic cell yet; the median of the three runs (600 ms per 1k tokens) against 500.
    assert lines[3].endswith(" | – | 1.234 | 0.10 | 600 (1.20×) |")
    assert lines[4] == "| h2o | 0.1 | – | – | – | – | – |"


def test_a_task_the_full_cache_fails_is_not_in_the_accuracy():
    cells = {"word|4000|aware|none|-": runs([True] * 5 + [False] * 5),
             "word|4000|aware|snapkv|0.1": runs([True] * 10)}
    text = table.render([("snapkv", 0.1)], 4000, ["word"], cells, {}, {}, samples=10)
    assert text.splitlines()[2] == "| snapkv | 0.1 | – | – | – | – | – |"


def test_a_cell_still_being_filled_pairs_with_the_full_caches_first_samples():
    cells = {"number|4000|agnostic|none|-": runs([True] * 9 + [False]),
             "number|4000|agnostic|kvzip|0.2": runs([True, False, True, True])}
    text = table.render([("kvzip", 0.2)], 4000, ["number"], cells, {}, {}, samples=10)
    # 3 of 4 against the full cache's first 4 (all right): 75% of it.
    assert "| kvzip | 0.2 | – | 75% (30%–95%), 4 of 10 samples; 75% of full (" in text


def test_the_table_goes_between_the_markers(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(f"# A\n\ntext\n\n{table.BEGIN}\nold\n{table.END}\n\nafter\n")
    table.write_between_markers(doc, "| new |", "<!-- note -->")
    assert doc.read_text() == (f"# A\n\ntext\n\n{table.BEGIN}\n<!-- note -->\n\n| new |\n"
                               f"{table.END}\n\nafter\n")
    bare = tmp_path / "bare.md"
    bare.write_text("no markers")
    with pytest.raises(SystemExit, match="markers"):
        table.write_between_markers(bare, "", "")


def test_a_named_table_has_its_own_markers(tmp_path):
    begin, end = table.markers("gemma3")
    assert (begin, end) == ("<!-- table.py gemma3: begin -->", "<!-- table.py gemma3: end -->")
    doc = tmp_path / "doc.md"
    doc.write_text(f"{table.BEGIN}\nfirst\n{table.END}\n{begin}\nold\n{end}\n")
    table.write_between_markers(doc, "| second |", "<!-- note -->", "gemma3")
    assert doc.read_text() == (f"{table.BEGIN}\nfirst\n{table.END}\n"
                               f"{begin}\n<!-- note -->\n\n| second |\n{end}\n")


def test_the_docs_carry_the_markers():
    text = (REPO / "docs" / "compression.md").read_text()
    for begin, end in (table.markers(), table.markers("gemma3")):
        assert text.count(begin) == 1 and text.count(end) == 1


def test_cost_and_kl_measured_with_the_real_binaries(tmp_path):
    bench = pathlib.Path(binary_path()).parent / "quality_bench"
    if not binary_path().exists() or not model_path().exists() or not bench.exists():
        pytest.fail(f"need {binary_path()}, {bench} and {model_path()} (make build model)")
    entries = [("none", 1.0), ("snapkv", 0.5), ("kvzip+probe=repeat", 0.5)]
    table.measure_cost(entries, 300, 1, str(binary_path()), str(model_path()),
                       tmp_path / "cost.json")
    cost = json.loads((tmp_path / "cost.json").read_text())["300"]
    assert set(cost) == {"none", "snapkv|0.5", "kvzip+probe=repeat|0.5"}
    assert all(r["seconds"] > 0 and r["prompt_tokens"] > 200 for rs in cost.values() for r in rs)
    # A base model's prompt: a completion, the probe's context the document and its question.
    table.measure_cost(entries[1:], 300, 1, str(binary_path()), str(model_path()),
                       tmp_path / "completion.json", "completion")
    completion = json.loads((tmp_path / "completion.json").read_text())["300"]
    assert set(completion) == {"snapkv|0.5", "kvzip+probe=repeat|0.5"}
    assert all(r["prompt_tokens"] > 200 for rs in completion.values() for r in rs)
    # One task per kind (the table takes three); a probe is not replayed by quality_bench.
    table.measure_kl(entries, str(bench), str(model_path()), tmp_path / "kl.json", per_kind=1)
    kl = json.loads((tmp_path / "kl.json").read_text())
    assert set(kl) == {"snapkv|0.5"} and kl["snapkv|0.5"]["kl"] > 0
    assert 0.4 < kl["snapkv|0.5"]["kept"] < 0.65
    # Nothing is measured again: the table renders from what was saved.
    doc = tmp_path / "doc.md"
    doc.write_text(f"{table.BEGIN}\n{table.END}\n")
    argv = ["--bin", "/nonexistent", "--bench", "/nonexistent", "--policies",
            ",".join(p for p, _ in entries), "--budgets", "0.5", "--tokens", "300",
            "--parts", "kl,cost", "--dir", str(tmp_path), "--write", str(doc)]
    assert table.main(argv) == 0
    assert "| snapkv | 0.5 | – | – | " in doc.read_text()


def test_run_pairs_compare_kl_task_by_task():
    import run as quality_run  # bench/quality/run.py

    def kl_runs(policy, values):
        return [{"policy": policy, "budget": 0.1, "task": f"t{i}", "kl": [v]}
                for i, v in enumerate(values)]

    result = {"runs": kl_runs("a", [0.5] * 10) + kl_runs("b", [0.4] * 9 + [0.6])}
    line = quality_run.paired_kl(result, "a", "b", [0.1, 0.2])
    # One line: budget 0.2 has no runs. 9 lower, 1 higher: two-sided p = 2 x 11/1024.
    assert line == ("budget 0.1: a KL 0.500, b 0.420; b lower on 9, higher on 1 of 10 tasks "
                    "(sign test p = 0.021)")
