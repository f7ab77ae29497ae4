"""Group commits: a worker's claims and reports for many runs in one transaction.

Under load a consumer thread takes up to `limit` ready steps of different runs in the
fairness order (`claim_many`) and, once it has run them, records their outcomes and claims
its next steps in one transaction (`record_many`): the round trips that open and close a
transaction, and the commit's flush to disk, are shared by the batch. Each step keeps its
own lease token, checkpoint and fencing, exactly as when it is recorded alone.

No two batches wait on each other: the runs a batch reports on are locked in id order,
and any other run it claims from is one no other transaction holds (skipped otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction

from ..models import Checkpoint, Step
from . import sql
from .rows import RunState, flush_all, load, next_claimable_runs, read_locked
from .steps import (
    Chain,
    chain_start,
    claim_next,
    complete_reported,
    fail_reported,
    startable,
    take_first,
)


@dataclass(frozen=True)
class Report:
    """A worker's finished attempt, as complete_step or fail_step takes it."""

    run_id: int
    key: str
    lease_token: str
    actor: str
    ok: bool
    summary: str = ""
    evidence: dict | None = None
    state_patch: dict | None = None
    retryable: bool = True


def claim_many(chain: Chain, limit: int) -> list[Step]:
    """Claim up to `limit` steps, each the first ready step of a run, for the worker, in the
    fairness order (see claim_next) and in one transaction. On PostgreSQL, when every run
    with work is being claimed from by other workers, waits for one as claim_next does."""
    if limit > 1:
        with transaction.atomic():
            claimed = _claim_others(chain, limit, besides=())
        if claimed or not sql.is_postgres():
            return claimed
    step = claim_next(owner=chain.owner, lease_seconds=chain.lease_seconds,
                      holder=chain.holder)
    return [step] if step is not None else []


def record_many(reports: list[Report], *, chain: Chain | None = None,
                limit: int = 0) -> tuple[list[Checkpoint], list[Step]]:
    """Record finished attempts of any runs in one transaction, each as complete_step or
    fail_step would (a stale report is noted, a repeated one recorded once); with `chain`,
    the same transaction claims up to `limit` steps for the worker: each completed run's
    next step unless another run has waited longer for a worker (as complete_step chains),
    then other runs' in the fairness order. Returns the checkpoints, in the order of
    `reports`, and the steps claimed. An error records nothing (the caller may record
    the reports one at a time to learn which)."""
    checkpoints: list[Checkpoint | None] = [None] * len(reports)
    claimed: list[Step] = []
    with transaction.atomic():
        states: dict[int, RunState] = {}
        chained: dict[int, Checkpoint] = {}  # run -> its completion, announced to chain on
        for i in sorted(range(len(reports)), key=lambda i: (reports[i].run_id, reports[i].key)):
            report = reports[i]
            if report.run_id in states:
                states.pop(report.run_id).flush()  # a second step of one run reads its rows anew
            state = states[report.run_id] = load(report.run_id, key=report.key,
                                                 fairness=chain is not None)
            checkpoints[i], recorded = _record(state, report)
            if recorded and report.ok:
                chained[report.run_id] = checkpoints[i]
            else:
                chained.pop(report.run_id, None)
        if chain is not None:
            for run_id, state in states.items():
                if run_id in chained and len(claimed) < limit and not state.fairer_waiting:
                    step = startable(state)
                    if step is not None:
                        claimed.append(chain_start(state, step, chained[run_id].announcement,
                                                   chain))
        waiting_turns(claimed[1:])
        flush_all(list(states.values()))
        if chain is not None and len(claimed) < limit:
            claimed += _claim_others(chain, limit - len(claimed), besides=tuple(states),
                                     first=not claimed)
    return checkpoints, claimed


def _record(state: RunState, report: Report) -> tuple[Checkpoint, bool]:
    common = {"actor": report.actor, "summary": report.summary, "evidence": report.evidence,
              "lease_token": report.lease_token}
    if report.ok:
        return complete_reported(state, report.key, state_patch=report.state_patch, **common)
    return fail_reported(state, report.key, retryable=report.retryable, **common), True


def _claim_others(chain: Chain, limit: int, besides: tuple[int, ...],
                  first: bool = True) -> list[Step]:
    """In the caller's transaction, claim up to `limit` steps from the runs served next that
    no other transaction holds (see claim_many); `first`: the batch begins with them."""
    states = read_locked(next_claimable_runs(limit, besides=besides))
    claimed = [step for state in states if (step := take_first(state, chain)) is not None]
    waiting_turns(claimed[1:] if first else claimed)
    flush_all(states)
    return claimed


def waiting_turns(steps: list[Step]) -> None:
    """Claimed behind others in a batch, whose steps run in turn: each begins only when its
    turn comes (the worker writes `began_at` then, steps.mark_began). Until then the
    database knows it as not begun, so a holder lost meanwhile costs it no attempt."""
    for step in steps:
        step.began_at = None
