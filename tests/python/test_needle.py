"""bench/quality/needle.py: its scoring and interval arithmetic, and a smoke run of the chat-API
needle benchmark against a live daemon (the full cache finds the code; every cell answers every
sample)."""

from __future__ import annotations

import json
import pathlib
import re
import sys

import pytest

from daemon_harness import binary_path, model_path

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench" / "quality"))
import needle  # noqa: E402


def test_wilson_interval_matches_the_textbook_values():
    lo, hi = needle.wilson(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-3) and hi == pytest.approx(0.7634, abs=1e-3)
    assert needle.wilson(0, 10)[0] == 0.0 and needle.wilson(0, 10)[1] == pytest.approx(0.2775,
                                                                                       abs=1e-3)
    assert needle.wilson(10, 10)[1] == 1.0


def test_a_reply_is_scored_on_the_whole_code_and_its_leading_digits():
    code = "1784961"
    assert needle.is_correct("The code is 1,784,961.", code)
    assert needle.is_correct("It is 1 784 961", code)
    assert not needle.is_correct("The access code is 17849611.", code)  # a digit too many
    assert needle.correct_prefix("The access code is 51959999.", "5197691") == 3
    assert needle.correct_prefix("It is 26.", "2627740") == 2
    assert needle.correct_prefix("No digits here", code) == 0


def test_policy_entries_carry_params_and_options():
    assert needle.compression_for("none", 0.1) is None
    assert needle.compression_for("winnowkv+neighbours=4+pooling=max", 0.2) == {
        "policy": "winnowkv", "budget": 0.2, "params": {"neighbours": 4.0},
        "options": {"pooling": "max"}}


def test_a_needle_sits_once_in_real_prose():
    import random
    sample = needle.make_sample(random.Random(3), needle.prose_paragraphs(), 4000)
    assert sample["content"].count(sample["code"]) == 1
    assert sample["content"].startswith("Read the document below.")
    assert sample["content"].rstrip().endswith("office?")


def test_multikey_states_four_codes_and_asks_for_one():
    import random
    sample = needle.make_sample(random.Random(3), needle.prose_paragraphs(), 4000, "multikey")
    stated = re.findall(r"The access code for the (\w+) office is (\d+)\.", sample["content"])
    assert len(stated) == 4 and len({place for place, _ in stated}) == 4
    asked = re.search(r"What is the access code for the (\w+) office\?", sample["content"])
    assert (asked.group(1), sample["code"]) in stated


def test_a_word_counts_as_a_whole_word_in_any_case():
    import random
    sample = needle.make_sample(random.Random(3), needle.prose_paragraphs(), 4000, "word")
    word = sample["code"]
    assert word in needle.WORDS and sample["content"].count(f" is {word}.") == 1
    assert needle.is_correct_for(sample, f"The password is {word.capitalize()}.")
    assert not needle.is_correct_for(sample, f"The password is {word}s.")


def test_smoke_run_through_the_daemon(tmp_path):
    if not binary_path().exists() or not model_path().exists():
        pytest.fail(f"need {binary_path()} and {model_path()} (make build model)")
    out = tmp_path / "needle.json"
    rc = needle.main(["--bin", str(binary_path()), "--model", str(model_path()),
                      "--samples", "3", "--tokens", "600", "--policies", "none,snapkv",
                      "--budgets", "0.5", "--parallel", "3", "--seed", "2",
                      "--json-out", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    cells = {(c["policy"], c["budget"]): c["results"] for c in result["cells"]}
    assert set(cells) == {("none", 1.0), ("snapkv", 0.5)}
    assert all(len(r) == 3 for r in cells.values())
    # The full cache finds the code in all three documents of seed 2 (one may flip with another
    # CPU's rounding; more would be a regression).
    assert sum(r["correct"] for r in cells[("none", 1.0)]) >= 2
