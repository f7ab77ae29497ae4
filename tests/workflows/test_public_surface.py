"""What other code may import from `workflows`, pinned: a name added or removed is a change
of the public surface, made here on purpose, never by accident (as Temporal's SDK pins its
client's exports)."""

from __future__ import annotations

import inspect

import workflows
from workflows import testing

PUBLIC = [
    "IllegalTransition", "InvalidInput", "NotFound", "NotPermitted", "WorkflowError",
    "add_steps", "approve", "cancel_run", "complete_step", "decide_many", "fail_step",
    "inbox_count", "open_run", "reassign_gate", "record_note", "reject", "resume_state",
    "retry_step", "run_audit", "runs", "seen_by", "skip_step", "start_step", "store_spec",
    "testing", "timeline", "validate_spec", "waiting_on"]

TESTING = ["MovedClock", "RecordingChat", "Sends", "deliver_outbox", "moved_clock",
           "recorded_sends", "run_due", "run_to_next_gate"]


def test_the_public_names_are_these_and_each_is_there():
    assert workflows.__all__ == PUBLIC
    for name in PUBLIC:
        assert getattr(workflows, name) is not None, name
    assert workflows.approve is workflows.engine.approve
    assert workflows.seen_by is workflows.reads.gates.seen_by
    assert issubclass(workflows.NotPermitted, workflows.WorkflowError)


def test_the_testing_helpers_are_these_and_each_is_documented():
    assert testing.__all__ == TESTING
    for name in TESTING:
        assert inspect.getdoc(getattr(testing, name)), name


def test_a_name_not_public_is_not_there():
    try:
        workflows.claim_next  # noqa: B018 (a worker's, not the public's)
    except AttributeError as exc:
        assert "has no attribute 'claim_next'" in str(exc)
    else:
        raise AssertionError("claim_next is not public")
