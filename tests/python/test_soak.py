"""The soak (bench/soak.py) in short: a few hundred mixed requests against a live daemon with a
small pool and max_seqs 4, then every end-of-run check. And the soak's judge on made-up
outcomes, so that a check that cannot fail would show here."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from daemon_harness import REPO, binary_path, model_path, pb2

sys.path.insert(0, str(REPO / "bench"))
import soak  # noqa: E402


def test_short_soak_leaves_nothing_behind(tmp_path):
    if not binary_path().exists() or not model_path().exists():
        pytest.fail(f"need {binary_path()} and {model_path()} (make build model)")
    out = tmp_path / "soak.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "soak.py"), "--num-requests", "100",
         "--concurrency", "8", "--seed", "11", "--bin", str(binary_path()),
         "--model", str(model_path()), "--daemon-log", str(tmp_path / "daemon.log"),
         "--json-out", str(out)],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(out.read_text())["summary"]
    assert summary["skipped_checks"] == []
    planned = summary["planned"]
    assert all(planned.get(k, 0) > 0 for k in ("ok", "cancel", "deadline", "invalid")), planned
    assert summary["outcomes"].get("CANCELLED", 0) > 0
    assert summary["end_state"]["preemptions_total"] > 0, "the pool was never short"
    assert summary["end_state"]["kv_blocks_free"] == summary["end_state"]["kv_blocks_total"]


# ------------------------------------------------------------------------------------------
# The judge


def _plan(kind="ok", max_tokens=4, **kw):
    return soak.Plan(0, kind, request=None, max_tokens=max_tokens, **kw)


def _outcome(kind="ok", code="OK", tokens=4, reasons=("length",), **kw):
    out = soak.Outcome(0, kind, code=code, tokens=tokens, messages=2,
                       finish_reasons=list(reasons), completion_tokens=tokens, **kw)
    out.finish_at = 1 if reasons else -1
    return out


def test_judge_accepts_clean_outcomes():
    assert soak.check_outcome(_plan(), _outcome()) == []
    assert soak.check_outcome(_plan("cancel", cancel_after=1),
                              _outcome("cancel", "CANCELLED", 1, (),
                                       cancelled_by_client=True)) == []
    assert soak.check_outcome(_plan("deadline"),
                              _outcome("deadline", "DEADLINE_EXCEEDED", 2, ("deadline",))) == []
    assert soak.check_outcome(_plan("invalid", expect_code="INVALID_ARGUMENT", needle="prompt"),
                              _outcome("invalid", "INVALID_ARGUMENT", 0, (),
                                       details="prompt: must not be empty")) == []


@pytest.mark.parametrize("plan, outcome, needle", [
    (_plan(), _outcome(reasons=("length", "length")), "2 finish messages"),
    (_plan(), _outcome(reasons=()), "without a finish reason"),
    (_plan(), _outcome(tokens=3), "length after 3 of 4"),
    (_plan(max_tokens=2), _outcome(tokens=3, reasons=("stop",)), "max_tokens 2"),
    (_plan(), _outcome(code="INTERNAL", reasons=("error",)), "ended INTERNAL"),
    (_plan(), _outcome(code="CANCELLED", reasons=()), "without the client cancelling"),
    (_plan("cancel"), _outcome("cancel", "UNAVAILABLE", 1, ("cancelled",)), "ended UNAVAILABLE"),
    (_plan("invalid", expect_code="INVALID_ARGUMENT", needle="prompt"),
     _outcome("invalid", "RESOURCE_EXHAUSTED", 0, (), details="queue is full"), "expected"),
])
def test_judge_flags_broken_outcomes(plan, outcome, needle):
    violations = soak.check_outcome(plan, outcome)
    assert any(needle in v for v in violations), violations


def _finished(i, reason, tokens=4):
    return {"msg": "request finished", "request_id": f"soak-r-{i}", "reason": reason,
            "completion_tokens": tokens}


def test_log_reconciliation():
    plans = [_plan(), _plan("cancel"), _plan("invalid")]
    for i, p in enumerate(plans):
        p.index = i
    outs = [_outcome(), _outcome("cancel", "CANCELLED", 1, (), cancelled_by_client=True),
            _outcome("invalid", "INVALID_ARGUMENT", 0, ())]
    clean = [_finished(0, "length"), _finished(1, "cancelled", 1)]
    assert soak.reconcile_log(plans, outs, clean, "r") == (
        [], {"reasons": {"length": 1, "cancelled": 1}, "races": 0})
    # The server finished the cancelled one first: allowed, counted as a race.
    assert soak.reconcile_log(plans, outs, [clean[0], _finished(1, "length")], "r")[1][
        "races"] == 1
    for records, needle in [
        ([clean[0]], "0 'request finished' lines"),
        (clean + [clean[0]], "2 'request finished' lines"),
        ([_finished(0, "error"), clean[1]], "server logged error"),
        (clean + [_finished(2, "length")], "refused yet logged"),
        (clean + [_finished(9, "length")], "unknown request"),
        ([_finished(0, "length", 3), clean[1]], "server logged 3 tokens"),
    ]:
        violations, _ = soak.reconcile_log(plans, outs, records, "r")
        assert any(needle in v for v in violations), (needle, violations)


def test_metrics_reconciliation():
    def samples(length, cancelled, invalid):
        return {("winnow_requests_finished_total", frozenset({("reason", "length")})): length,
                ("winnow_requests_finished_total", frozenset({("reason", "cancelled")})):
                    cancelled,
                ("winnow_requests_finished_total", frozenset({("reason", "error")})): 0,
                ("winnow_requests_rejected_total", frozenset({("code", "INVALID_ARGUMENT")})):
                    invalid}
    outs = [_outcome(), _outcome("cancel", "CANCELLED", 1, ()),
            _outcome("invalid", "INVALID_ARGUMENT", 0, ())]
    before = samples(5, 2, 1)
    log = {"length": 1, "cancelled": 1}
    assert soak.reconcile_metrics(before, samples(6, 3, 2), outs, log) == []
    assert soak.reconcile_metrics(before, samples(7, 3, 2), outs, log)  # one finished too many
    assert soak.reconcile_metrics(before, samples(6, 3, 1), outs, log)  # a refusal not counted
    assert soak.reconcile_metrics(before, samples(6, 3, 2), outs, {"length": 2})


def test_reasons_cover_every_finish_reason():
    names = {v.name for v in pb2.FinishReason.DESCRIPTOR.values if v.number}
    assert len(soak.REASONS) == len(names)
