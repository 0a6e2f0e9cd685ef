"""bench/shared_document_bench.py's configurations: what each asks the daemon for."""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
import shared_document_bench as bench  # noqa: E402


def test_a_policy_entry_compresses_the_document_alone_and_publishes_it():
    label, compression, caching = bench.parse_config("kvzip+probe=repeat+neighbours=8@0.3")
    assert (label, caching) == ("kvzip+probe=repeat+neighbours=8@0.3", True)
    assert compression == {"policy": "kvzip", "budget": 0.3, "params": {"neighbours": 8.0},
                           "options": {}, "probe": "repeat", "scope": "context",
                           "context_messages": 1}


def test_an_aware_entry_compresses_each_whole_prompt_without_caching():
    label, compression, caching = bench.parse_config("aware:winnowkv@0.2")
    assert (label, caching) == ("aware:winnowkv@0.2", False)
    assert compression == {"policy": "winnowkv", "budget": 0.2, "params": {}, "options": {}}


def test_the_baselines_compress_nothing():
    assert bench.parse_config("none") == ("none", None, False)
    assert bench.parse_config("prefix") == ("prefix", None, True)
