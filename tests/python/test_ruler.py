"""bench/quality/ruler.py: its tasks, scoring and paired interval, and a smoke run of the suite
against a live daemon in both modes (every cell answers every sample, saved cells are reused)."""

from __future__ import annotations

import json
import os
import pathlib
import random
import re
import sys

import pytest

from conftest import ROOT
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


def test_a_name_is_right_only_with_its_first_name_and_surname_in_order(paragraphs):
    sample = ruler.make_samples("name", 1000, 1, 4, paragraphs)[0]
    first, surname = sample["answers"][0].split()
    assert first in ruler.FIRST_NAMES and surname in ruler.SURNAMES
    assert ruler.is_correct(sample, f"The manager is {first} {surname}.")
    assert not ruler.is_correct(sample, f"The manager is {first}.")
    assert not ruler.is_correct(sample, f"{surname} {first}")


def test_a_policy_may_name_its_own_budgets():
    assert ruler.policy_entries("none,snapkv,winnowkv@0.05/0.3", [0.1, 0.2]) == [
        ("none", 1.0), ("snapkv", 0.1), ("snapkv", 0.2), ("winnowkv", 0.05), ("winnowkv", 0.3)]


def test_a_phrase_is_correct_only_whole_and_in_order():
    phrase = {"answers": ["meadow copper falcon"], "match": "phrase"}
    assert ruler.is_correct(phrase, "The passphrase is Meadow, copper, falcon.")
    assert ruler.is_correct(phrase, "It is meadow-copper-falcon")
    assert not ruler.is_correct(phrase, "It is meadow copper.")
    assert not ruler.is_correct(phrase, "It is copper meadow falcon.")
    assert not ruler.is_correct(phrase, "It is meadow, copper and falcon.")
    assert not ruler.is_correct(phrase, "It is meadowcopper falcon.")


def test_a_sample_is_correct_only_with_every_value():
    codes = {"answers": ["1234567", "7654321"], "match": "number"}
    assert ruler.is_correct(codes, "They are 1,234,567 and 7654321.")
    assert not ruler.is_correct(codes, "It is 1234567.")
    assert not ruler.is_correct(codes, "They are 12345678 and 7654321.")
    names = {"answers": ["QWERT", "ASDFG"], "match": "word"}
    assert ruler.is_correct(names, "qwert and ASDFG")
    assert not ruler.is_correct(names, "QWERTY and ASDFG")


def test_a_completion_is_scored_up_to_the_next_question_the_model_writes():
    sample = {"answers": ["1360217"], "match": "number"}
    reply = " 1360.\n\nQuestion: What is the code?\nAnswer: 1360217"
    assert ruler.completion_answer(reply) == " 1360.\n\n"
    assert not ruler.is_correct(sample, ruler.completion_answer(reply))
    assert ruler.is_correct(sample, ruler.completion_answer("\n\nThe code is 1360217.\n"))
    assert ruler.shared_prefix([1, 2, 3, 4], [1, 2, 5]) == 2


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


def test_the_digits_table_counts_each_replys_leading_digits():
    samples = [{"match": "number", "answers": ["4829163"]},
               {"match": "number", "answers": ["7051234"]}]
    cells = {"number|4000|aware|snapkv|0.1": [{"reply": "The code is 4821."},
                                               {"reply": "It is 9, or 7051234."}],
             "multiquery|4000|aware|snapkv|0.1": [{"reply": "1"}]}
    text = ruler.digits_table(cells, {("number", 4000): samples, ("multiquery", 4000): [
        {"match": "number", "answers": ["1", "2"]}]}, ["number", "multiquery"], [4000],
        ["aware"], [("snapkv", 0.1)])
    assert "| number, ~4000, aware, snapkv @ 0.1 | 5.0 | 2 | 2 | 2 |" in text
    assert "multiquery" not in text  # two numbers asked: no single value's digits


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


def test_a_base_model_is_asked_as_a_completion_and_its_document_compressed_alone(tmp_path):
    """Gemma 3 270M (a base model): the full cache finds the code; agnostic compression keeps a
    part of the document's tokens only (the question's are computed after the plan)."""
    gemma = (pathlib.Path(os.environ.get("WINNOW_MODEL_DIR", ROOT / "models"))
             / "gemma-3-270m-q4_k_m.gguf")
    if not binary_path().exists() or not gemma.exists():
        pytest.fail(f"need {binary_path()} and {gemma} (make build gemma3-model)")
    out = tmp_path / "ruler.json"
    argv = ["--bin", str(binary_path()), "--model", str(gemma), "--format", "completion",
            "--tasks", "number", "--lengths", "500", "--samples", "2", "--policies",
            "none,snapkv", "--budgets", "0.5", "--modes", "agnostic", "--parallel", "2",
            "--seed", "1", "--json", str(out)]
    assert ruler.main(argv) == 0
    saved = json.loads(out.read_text())
    assert saved["setting"]["format"] == "completion"
    full, compressed = (saved["cells"][f"number|500|agnostic|{p}"] for p in ("none|-", "snapkv|0.5"))
    assert all(r["correct"] for r in full)
    for r in compressed:
        # Half of the document's slots per layer (Gemma 3 270M has 18); the whole prompt's half
        # would be prompt_tokens / 2, the question's dozen tokens more.
        per_layer = r["kv_kept"] / 18
        assert r["kv_evicted"] > 0 and 0.4 * r["prompt_tokens"] < per_layer, r
        assert per_layer < 0.5 * r["prompt_tokens"] - 4, r
