"""The transition engine: every status change of a run or step goes through these functions.

Each public transition is one database transaction that locks the run row, checks that the
actor may make the move and that it is legal now, applies it and appends exactly one
checkpoint (`commit`). The run row lock serialises every transition of a run, so two workers,
two clicks or two API calls cannot both win, and the checkpoint sequence stays gapless. What
must follow a commit (ringing the queue, compensation, mail) is announced with the
`transition_committed` signal once the transaction commits; the dispatcher listens.

Modules: `errors`, `rules` (settled, ready, run status, next move: shared by Python and SQL),
`rows` (locking and frontier rows), `moves` (what a transition does to a step), `commit`,
`runs`, `steps` (work steps and leases), `gates` (approvals and deadlines).
"""

from .commit import Announcement, mark_rung, transition_committed
from .errors import IllegalTransition, InvalidInput, NotFound, NotPermitted, WorkflowError
from .gates import approve, expire_gate, reject
from .rules import RUN_HAS_HARD_FAILURE, next_move, ready_filter, ready_steps, retry_delay
from .runs import Opened, cancel_run, open_run
from .steps import (
    AGENT_STATUSES,
    claim_step,
    complete_step,
    expire_lease,
    fail_step,
    record_compensation,
    record_transition,
    renew_lease,
    retry_step,
    skip_step,
    start_step,
)

__all__ = [
    "AGENT_STATUSES", "RUN_HAS_HARD_FAILURE", "Announcement", "IllegalTransition",
    "InvalidInput", "NotFound", "NotPermitted", "Opened", "WorkflowError", "approve",
    "cancel_run", "claim_step", "complete_step", "expire_gate", "expire_lease", "fail_step",
    "mark_rung", "next_move", "open_run", "ready_filter", "ready_steps", "record_compensation",
    "record_transition", "reject", "renew_lease", "retry_delay", "retry_step", "skip_step",
    "start_step", "transition_committed",
]
