"""The transition engine: every status change of a run or step goes through these functions.

Each public transition is one database transaction that locks the run row, checks that the
actor may make the move and that it is legal now, applies it and appends exactly one
checkpoint (`commit`). The run row lock serialises every transition of a run, so two workers,
two clicks or two API calls cannot both win, and the checkpoint sequence stays gapless. What
must follow a commit (ringing the queue, compensation, mail) is announced with the
`transition_committed` signal once the transaction commits; the dispatcher listens. A
worker's group commit (`batches`) makes several runs' transitions in one transaction, each
exactly as it would alone.

Modules: `errors`, `rules` (settled, ready, run status, next move: shared by Python and SQL),
`rows` (locking and frontier rows), `moves` (what a transition does to a step), `commit`,
`runs`, `steps` (work steps and leases), `batches` (a worker's group commits: many runs'
transitions in one transaction, each its own), `gates` (approvals and deadlines), `policy`
(a gate's approval rules), `compensations`.
"""

from ..errors import IllegalTransition, InvalidInput, NotFound, NotPermitted, WorkflowError
from . import batches, children, compensations
from .commit import Announcement
from .gates import (
    Signature,
    approve,
    deadline_then,
    decide_many,
    expire_gate,
    form_values,
    reassign_gate,
    reject,
    remind_gate,
    signature_meaning,
)
from .moves import require_operator
from .rows import claimable_exists
from .rules import RUN_HAS_HARD_FAILURE, next_move, ready_filters, ready_steps, retry_delay
from .runs import Opened, add_steps, cancel_run, open_run
from .signals import transition_committed, transition_recording
from .steps import (
    AGENT_STATUSES,
    Chain,
    claim_next,
    claim_step,
    complete_step,
    expire_lease,
    expire_leases,
    expire_wait,
    fail_step,
    mark_began,
    note_lease_overdue,
    note_sweep_failure,
    record_child,
    record_note,
    record_transition,
    release_unstarted,
    renew_leases,
    reschedule,
    retry_step,
    skip_step,
    start_step,
)

release_compensation = compensations.release

__all__ = [
    "AGENT_STATUSES", "RUN_HAS_HARD_FAILURE", "Announcement", "Chain", "IllegalTransition",
    "batches",
    "InvalidInput", "NotFound", "NotPermitted", "Opened", "Signature", "WorkflowError", "add_steps",
    "approve",
    "cancel_run", "children", "claim_next", "claim_step", "claimable_exists", "compensations",
    "deadline_then", "decide_many", "form_values",
    "complete_step", "expire_gate", "expire_lease", "expire_leases", "expire_wait", "fail_step",
    "mark_began", "next_move",
    "note_lease_overdue", "note_sweep_failure", "open_run", "ready_filters", "ready_steps",
    "reassign_gate", "record_child", "record_note", "record_transition", "reject",
    "release_compensation",
    "release_unstarted",
    "remind_gate",
    "renew_leases",
    "require_operator", "reschedule", "retry_delay", "retry_step", "signature_meaning",
    "skip_step", "start_step",
    "transition_committed", "transition_recording",
]
