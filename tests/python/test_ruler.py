"""bench/quality/ruler.py: its tasks, scoring and paired interval, and a smoke run of the suite
against a live daemon in both modes (every cell answers every sample, saved cells are reused)."""

from __future__ import annotations

import json
import pathlib
import random
import re
import sys

import pytest

from daemon_harness import binary_path, model_path

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench" / "quality"))
import ruler  # noqa: E402


@pytest.fixture(scope="module")
def paragraphs():
    found = ruler.needle.prose_paragraphs()
    assert found, "no source documents on this machine (bench/quality/documents.py)"
    return found


@pytest.mark.parametrize("task", ruler.TASKS)
def test_every_value_is_stated_once_and_the_question_comes_last(task, paragraphs):
    sample = ruler.make_samples(task, 2000, 1, 5, paragraphs)[0]
    assert sample["document"].startswith("Read the document below.")
    for value in sample["answers"]:
        stated = rf"VAR {value} =" if task == "vartrack" else rf"\b{value}\b"
        assert len(re.findall(stated, sample["document"])) == 1, value
    assert sample["question"].endswith("?") or sample["question"].endswith("them.")
    assert len(sample["depths"]) == {"multikey": 4, "multivalue": 3, "multiquery": 2,
                                     "vartrack": 3}.get(task, 1)


def test_the_variable_chain_reads_in_order(paragraphs):
    sample = ruler.make_samples("vartrack", 2000, 1, 3, paragraphs)[0]
    first, second, third = sample["answers"]
    doc = sample["document"]
    value = re.search(r"the value (\d+)\?", sample["question"]).group(1)
    assert doc.index(f"VAR {first} = {value}.") < doc.index(f"VAR {second} = VAR {first}.") \
        < doc.index(f"VAR {third} = VAR {second}.")


def test_samples_depend_only_on_seed_task_and_length(paragraphs):
    a = ruler.make_samples("multiquery", 1000, 3, 1, paragraphs)
    assert a == ruler.make_samples("multiquery", 1000, 3, 1, paragraphs)
    assert a != ruler.make_samples("multiquery", 1000, 3, 2, paragraphs)


def test_a_sample_is_correct_only_with_every_value():
    codes = {"answers": ["1234567", "7654321"], "match": "number"}
    assert ruler.is_correct(codes, "They are 1,234,567 and 7654321.")
    assert not ruler.is_correct(codes, "It is 1234567.")
    assert not ruler.is_correct(codes, "They are 12345678 and 7654321.")
    names = {"answers": ["QWERT", "ASDFG"], "match": "word"}
    assert ruler.is_correct(names, "qwert and ASDFG")
    assert not ruler.is_correct(names, "QWERTY and ASDFG")


def test_the_paired_interval():
    full = [[True] * 10, [True] * 8 + [False] * 2]
    ratio, lo, hi = ruler.paired_ratio_interval(full, full)
    assert (ratio, lo, hi) == (1.0, 1.0, 1.0)
    ratio, lo, hi = ruler.paired_ratio_interval([[False] * 10, [False] * 10], full)
    assert (ratio, lo, hi) == (0.0, 0.0, 0.0)
    half = [[True, False] * 5, [True] * 4 + [False] * 6]
    ratio, lo, hi = ruler.paired_ratio_interval(half, full)
    assert ratio == pytest.approx(0.9 / 1.8) and lo < ratio < hi


def test_the_tables_keep_tasks_the_full_cache_can_do():
    def runs(correct: list[bool]) -> list[dict]:
        return [{"correct": c, "depths": [i / len(correct)]} for i, c in enumerate(correct)]

    cells = {"number|4000|aware|none|-": runs([True] * 9 + [False]),
             "number|4000|aware|snapkv|0.1": runs([True] * 8 + [False] * 2),
             "word|4000|aware|none|-": runs([True] * 5 + [False] * 5),
             "word|4000|aware|snapkv|0.1": runs([True] * 10)}
    text = ruler.tables(cells, ["number", "word"], [4000], ["aware"],
                        [("none", 1.0), ("snapkv", 0.1)])
    assert "| number | 90% (60%–98%) | 80% (49%–94%) |" in text
    assert "| word | 50% (24%–76%) (not kept) | 100% (72%–100%) |" in text
    assert "| kept (1) | 90% | 80%; 89% of full (" in text
    depth = ruler.depth_table(cells, ["number"], [4000], ["aware"], [("none", 1.0)])
    assert "| number, ~4000, aware, none | 2/2 | 2/2 | 2/2 | 2/2 | 1/2 |" in depth


def test_smoke_run_through_the_daemon_in_both_modes(tmp_path):
    if not binary_path().exists() or not model_path().exists():
        pytest.fail(f"need {binary_path()} and {model_path()} (make build model)")
    out = tmp_path / "ruler.json"
    argv = ["--bin", str(binary_path()), "--model", str(model_path()), "--tasks",
            "number,multiquery", "--lengths", "500", "--samples", "2", "--policies",
            "none,snapkv", "--budgets", "0.5", "--modes", "aware,agnostic", "--parallel", "2",
            "--seed", "2", "--json", str(out)]
    assert ruler.main(argv) == 0
    cells = json.loads(out.read_text())["cells"]
    assert set(cells) == {f"{t}|500|{m}|{p}" for t in ("number", "multiquery")
                          for m in ("aware", "agnostic") for p in ("none|-", "snapkv|0.5")}
    assert all(len(results) == 2 for results in cells.values())
    # The full cache finds the one code of seed 2's documents (one may flip with another CPU's
    # rounding; both would be a regression).
    assert sum(r["correct"] for r in cells["number|500|aware|none|-"]) >= 1
    # Saved cells are reused: no daemon is started for a table that is complete, and a cell
    # with fewer samples is the start of a longer one.
    saved = json.loads(out.read_text())
    saved["cells"]["number|500|aware|none|-"].pop()
    out.write_text(json.dumps(saved))
    assert ruler.main(argv[:-6] + ["--modes", "aware"] + argv[-4:]) == 0
    extended = json.loads(out.read_text())["cells"]
    assert extended["number|500|aware|none|-"] == cells["number|500|aware|none|-"]
    argv[1] = str(tmp_path / "no-such-binary")
    assert ruler.main(argv) == 0
    with pytest.raises(SystemExit, match="holds cells of"):
        ruler.main(argv[:-4] + ["--seed", "3", "--json", str(out)])
