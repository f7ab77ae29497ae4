"""What a Huey worker does with a doorbell: claim the step, run it under a lease, report.

One lease keeper thread per consumer process renews the leases of every step and
compensation the process runs. It survives database errors: it reconnects and keeps trying
until a lease would run out, and only then fences the attempt (stops its command), so that a
worker cut off from the database never runs on past its lease. A finished attempt's result
is reported with retries across a dropped connection or a database restart, with its lease
token, so a blink of the database never throws a result away.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from types import SimpleNamespace

from django.conf import settings
from django.db import DatabaseError, connection

from tollgate import dbfaults, logs, tracing
from workflows import engine
from workflows.delivery import dispatch
from workflows.engine import compensations, processes
from workflows.models import Compensation, Schedule, Step
from workflows.timing import schedules
from workflows.workers import groups, spool
from workflows.workers.executors import (
    MissingSecret,
    Outcome,
    execute,
    outcome_of,
    resolved_env,
    secret_values,
)

log = logging.getLogger(__name__)
BLINKS = dbfaults.AWAY


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.current_thread().name}"


class Stop(threading.Event):
    """Set when the attempt must stop; `reason` says why ("stopped" or "fenced").

    It also carries the lease to a command's supervisor: `fence_at()` is the monotonic time
    by which the command must have stopped unless the lease is renewed, a margin before the
    lease ends; each renewal tells the attached lifelines the new time."""

    reason = ""

    def __init__(self, seconds: float, lease_end: float) -> None:
        super().__init__()
        # Stop a little before the lease ends: the database's end is a little earlier than
        # ours (it was set before we heard of it), and stopping a tree takes a moment.
        self.margin = min(max(seconds * 0.2, 0.4), 5.0)
        self.fence_grace = self.margin / 2
        self.lease_end = lease_end
        self.lock = threading.Lock()
        self.lifelines: list = []

    def stop(self, reason: str) -> None:
        if not self.is_set():
            self.reason = reason
            self.set()

    def fence_at(self) -> float:
        return self.lease_end - self.margin

    def renewed(self, lease_end: float) -> None:
        with self.lock:
            self.lease_end = lease_end
            for line in self.lifelines:
                line.fence(self.fence_at())

    def attach(self, line) -> None:
        with self.lock:
            self.lifelines.append(line)

    def detach(self, line) -> None:
        with self.lock:
            self.lifelines.remove(line)


@dataclass
class Lease:
    token: str
    seconds: float
    stop: Stop
    expires: float  # time.monotonic() when the lease runs out, as this process last renewed it
    renew: object = None  # for compensations: renew(id, token, seconds) -> bool
    key: tuple = field(default=())


class LeaseKeeper:
    """One thread per process renewing every lease the process holds, in one round trip."""

    def __init__(self) -> None:
        self.leases: dict[tuple, Lease] = {}
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.pid = os.getpid()
        self.beating_since: float | None = None  # time.monotonic() the current beat began

    def hold(self, kind: str, pk: int, token: str, seconds: float, renew=None,
             since: float | None = None) -> Stop:
        """Keep renewing a lease taken at `since` (time.monotonic() before the claim)."""
        since = time.monotonic() if since is None else since
        stop = Stop(seconds, since + seconds)
        with self.lock:
            if self.thread is None or not self.thread.is_alive() or self.pid != os.getpid() \
                    or self.stuck(seconds):
                self.pid = os.getpid()
                self.beating_since = None
                self.thread = threading.Thread(target=self.run, name="lease-keeper",
                                               daemon=True)
                self.thread.start()
            self.leases[(kind, pk)] = Lease(token, seconds, stop, since + seconds, renew,
                                            (kind, pk))
        return stop

    def close(self, timeout: float | None = None) -> None:
        """Let every lease go and end the thread, once a beat under way has ended."""
        with self.lock:
            self.leases.clear()
            thread, self.thread = self.thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def stuck(self, seconds: float) -> bool:
        """Has the current beat hung for a third of a lease? A connection cut off by a
        network partition can hang for minutes after the network heals (TCP's backoff) while
        a claim, on another thread's connection, has just gone through: the leases taken
        now must not starve behind it. The hung keeper is left to fail and exit."""
        began = self.beating_since
        return began is not None and time.monotonic() - began > seconds / 3

    def fresh(self, kind: str, pk: int) -> bool:
        """May the attempt of this held lease begin? Yes while its fence time is ahead. A
        claim whose answer came late (its connection hung through a network partition)
        holds a lease that, as far as this process can tell, is over: it is renewed now
        (with a lease lost, or the database away, the attempt does not begin and goes
        back unstarted)."""
        with self.lock:
            lease = self.leases.get((kind, pk))
        if lease is None or lease.stop.is_set():
            return False
        if time.monotonic() < lease.stop.fence_at():
            return True
        began = time.monotonic()
        try:
            kept = engine.renew_leases({pk: lease.token}, lease.seconds) if kind == "step" \
                else {pk} if lease.renew(pk, lease.token, lease.seconds) else set()
        except DatabaseError:
            connection.close()
            return False
        if pk not in kept:
            return False
        lease.expires = began + lease.seconds
        lease.stop.renewed(lease.expires)
        return True

    def release(self, kind: str, pk: int) -> None:
        """The attempt is over (recorded, kept in the spool, or never begun)."""
        with self.lock:
            self.leases.pop((kind, pk), None)

    def run(self) -> None:
        idle = False
        while True:
            with self.lock:
                if self.thread is not threading.current_thread():
                    connection.close()
                    return  # replaced while it hung (stuck)
                held = list(self.leases.values())
            now = time.monotonic()
            # Renew a lease once a third of it has gone by (or sooner after a failed beat).
            due = [lease for lease in held if now >= lease.expires - lease.seconds * 2 / 3]
            if due:
                self.beating_since = now
                try:
                    self.beat(due)
                finally:
                    with self.lock:
                        if self.thread is threading.current_thread():
                            self.beating_since = None
            if not held and not idle:
                connection.close()  # hold no database connection while there is no work
            idle = not held
            shortest = min((lease.seconds for lease in held), default=1.0)
            time.sleep(max(min(shortest / 10, 0.5), 0.02))

    def beat(self, held: list[Lease]) -> None:
        steps = {lease.key[1]: lease for lease in held if lease.key[0] == "step"}
        others = [lease for lease in held if lease.key[0] != "step"]
        try:
            now = time.monotonic()
            seconds = max(lease.seconds for lease in held)
            kept = engine.renew_leases({pk: lease.token for pk, lease in steps.items()},
                                       seconds)
            for pk, lease in steps.items():
                if pk in kept:
                    lease.expires = now + seconds
                    lease.stop.renewed(lease.expires)
                else:
                    lease.stop.stop("stopped")  # swept, cancelled, or finished elsewhere
            for lease in others:
                began = time.monotonic()
                if lease.renew(lease.key[1], lease.token, lease.seconds):
                    lease.expires = began + lease.seconds
                    lease.stop.renewed(lease.expires)
                else:
                    lease.stop.stop("stopped")
        except DatabaseError:
            log.warning("Could not renew %s lease(s); retrying", len(held), exc_info=True)
            connection.close()  # this thread's; the next beat opens a fresh one
            now = time.monotonic()
            for lease in held:
                if now >= lease.expires:
                    lease.stop.stop("fenced")  # never run on past the lease


KEEPER = LeaseKeeper()


def report(call, *, what: str):
    """Make a report to the engine, retrying across database blinks for up to
    TOLLGATE_REPORT_RETRY_SECONDS; the lease token makes a repeated report harmless."""
    deadline = time.monotonic() + settings.TOLLGATE_REPORT_RETRY_SECONDS
    delay = 0.05
    while True:
        try:
            return call()
        except BLINKS:
            if time.monotonic() >= deadline:
                raise
            log.warning("Database unavailable reporting %s; retrying in %.2fs", what, delay)
            connection.close()
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


def work(budget: float | None = None) -> int:
    """What a doorbell asks: claim and run steps, each from the run that should be served
    next (engine.claim_next), until no run has work for a worker or the time budget
    (TOLLGATE_WORKER_BATCH_SECONDS) is spent; then, if work remains, ring one doorbell so
    that the queue's other tasks get their turn. Returns how many steps it ran."""
    deadline = time.monotonic() + (settings.TOLLGATE_WORKER_BATCH_SECONDS
                                   if budget is None else budget)
    owner, ran = worker_name(), 0
    record_orphans()
    if settings.TOLLGATE_GROUP_COMMIT_STEPS > 1:
        return _work_in_groups(owner, deadline)
    while True:
        if _out_of_time(deadline):
            return ran
        since = time.monotonic()  # the lease in the database ends no later than this + S
        step = engine.claim_next(owner=owner, holder=processes.this_process(),
                                 lease_seconds=settings.TOLLGATE_LEASE_SECONDS)
        if step is None:
            return ran
        step.claimed_since = since
        ran += len(_execute(step, owner, deadline))


def _out_of_time(deadline: float) -> bool:
    if time.monotonic() < deadline:
        return False
    if engine.claimable_exists():
        dispatch.wake(1)
    return True


@dataclass
class Finished:
    """An attempt run in a batch, its outcome waiting for the batch's group commit."""

    step: Step
    owner: str
    outcome: Outcome


def _work_in_groups(owner: str, deadline: float) -> int:
    """work() with group commits: claim up to TOLLGATE_GROUP_COMMIT_STEPS steps of different
    runs at once, run them in turn, then record their outcomes and claim the next ones in
    one transaction. The batch is as large as the work waiting: a lone chain runs in
    batches of one. No outcome waits for its neighbours longer than
    TOLLGATE_GROUP_COMMIT_HOLD_SECONDS (groups.Group)."""
    size = settings.TOLLGATE_GROUP_COMMIT_STEPS
    chain = engine.Chain(owner, settings.TOLLGATE_LEASE_SECONDS, processes.this_process())
    ran = 0
    with groups.Group(settings.TOLLGATE_GROUP_COMMIT_HOLD_SECONDS, _record_group) as group:
        while not _out_of_time(deadline):
            since = time.monotonic()  # the leases in the database end no later than this + S
            batch = engine.batches.claim_many(chain, size)
            if not batch:
                return ran
            while batch:
                for step in batch:  # every lease is kept from its claim, while it waits too
                    step.stop = KEEPER.hold("step", step.pk, step.lease_token,
                                            settings.TOLLGATE_LEASE_SECONDS, since=since)
                try:
                    for step in batch:
                        _run_in_group(step, owner, group)
                except BaseException:
                    try:
                        _record_group(group.take())  # what finished is still recorded
                        _give_back([s for s in batch if not getattr(s, "began", False)], owner)
                    finally:
                        for step in batch:  # what began is left to its lease
                            KEEPER.release("step", step.pk)
                    raise
                ran += len(batch)
                since = time.monotonic()
                batch = _record_group(group.take(), chain if since < deadline else None, size)
    return ran


def _run_in_group(step: Step, owner: str, group: groups.Group) -> None:
    with logs.about(run=step.run_id, step=step.key, attempt=step.attempt), \
            tracing.attempt_span(step.run_id, step.key, step.attempt):
        if not KEEPER.fresh("step", step.pk):
            # Its lease could not be kept while it waited its turn (the database away), or
            # the claim's answer came too late to trust: it never began, so it is given
            # back if it is still ours, else left to whoever holds it now (its token says).
            KEEPER.release("step", step.pk)
            _give_back([step], owner, why=LET_GO_UNSTARTED)
            return
        if step.began_at is None and not _begin_turn(step):
            KEEPER.release("step", step.pk)  # not ours any more, or no database to say so
            return
        context = _context(step)
        step.began = True
        if "workflow" in step.config["run"]:
            try:
                _start_child(step, owner)
            finally:
                KEEPER.release("step", step.pk)
            return
        outcome = _attempt(step.config["run"], context, step.run.shared_state, step.stop,
                           partial(_spawned, step.pk, step.lease_token))
        group.add(Finished(step, owner, outcome))


def _begin_turn(step: Step) -> bool:
    """Write that a step claimed behind others in the batch begins now, before it does: a
    holder lost before this leaves the step unbegun in the database, given back unspent by
    the sweeper wherever the holder ran. False: it must not begin (its lease is gone, or
    the database cannot take the mark; then its lease runs out and it is given back)."""
    try:
        return engine.mark_began(step.pk, step.lease_token)
    except DatabaseError:
        connection.close()
        log.warning("Could not mark step %s as begun; it is left to its lease", step.pk)
        return False


# What a worker says of a claim whose lease it could not keep while it waited its turn.
LET_GO_UNSTARTED = ("Claimed in a batch; its worker let go of it before its turn (its lease "
                    "could not be kept: the database was away or answered too late): given "
                    "back, no attempt spent")


def _give_back(steps: list[Step], owner: str, why: str = "") -> None:
    """Steps of a batch that never began go back as never run (engine.release_unstarted),
    so a batch cut short spends no attempt on them; if the database cannot take that now,
    their leases run out and the sweeper takes them back."""
    if not steps:
        return
    try:
        engine.release_unstarted({s.pk: s.lease_token for s in steps}, actor=f"worker {owner}",
                                 why=why)
    except DatabaseError:
        connection.close()
        log.warning("Could not give back %d unstarted step(s); their leases will run out",
                    len(steps))


def _record_group(finished: list[Finished], chain=None, limit: int = 0) -> list[Step]:
    """Record a batch's outcomes in one transaction (and, with `chain`, claim up to `limit`
    next steps in it); the steps claimed. If the engine refuses one of them (a state patch
    it cannot store, a run gone), each is recorded on its own; if the database stays away
    past the report window, every outcome is kept in the spool for whoever finds it."""
    reports = [engine.batches.Report(
        f.step.run_id, f.step.key, f.step.lease_token, f"worker {f.owner}", f.outcome.ok,
        f.outcome.summary, f.outcome.evidence, f.outcome.state_patch, f.outcome.retryable)
        for f in finished]
    if not reports and chain is None:
        return []
    claimed: list[Step] = []
    try:
        try:
            _, claimed = report(partial(engine.batches.record_many, reports, chain=chain,
                                        limit=limit), what=f"{len(reports)} step(s)")
        except engine.WorkflowError:
            for f in finished:
                try:
                    _record_step(f.step, f.step.lease_token, f"worker {f.owner}", f.outcome,
                                 call=lambda fn, what: report(fn, what=what))
                except engine.WorkflowError:  # as when it is recorded alone; the others go on
                    log.exception("Could not record the outcome of step %s", f.step.pk)
    except BaseException:
        for f in finished:
            _keep_unrecorded(f.outcome, _lease(f.step))
        raise
    finally:
        for f in finished:
            KEEPER.release("step", f.step.pk)
    for f in finished:
        spool.discard(f.outcome.spooled)
    return claimed


def run_step(step_id: int) -> str:
    """Claim and execute one given step (and the steps its completions hand this worker);
    returns the kind of the last checkpoint, for logs and tests."""
    owner = worker_name()
    since = time.monotonic()
    try:
        step = engine.claim_step(step_id, owner=owner, holder=processes.this_process(),
                                 lease_seconds=settings.TOLLGATE_LEASE_SECONDS)
        step.claimed_since = since
    except engine.NotFound:
        return "missing"
    except engine.WorkflowError as exc:
        # Taken by another worker, not due, or the run moved on: the doorbell was stale.
        log.info("Step %s not started: %s", step_id, exc)
        return "not-ready"
    deadline = time.monotonic() + settings.TOLLGATE_WORKER_BATCH_SECONDS
    return _execute(step, owner, deadline)[-1]


def _execute(step: Step, owner: str, deadline: float) -> list[str]:
    """Run a claimed step, and the steps its completions hand this worker until the
    deadline, each under its lease; report each outcome with its lease token. Returns the
    kinds of the checkpoints that ended them."""
    kinds = []
    while step is not None:
        checkpoint = _execute_one(step, owner, chain=time.monotonic() < deadline)
        kinds.append(checkpoint.kind)
        step = getattr(checkpoint, "next_step", None)
    return kinds


def origin(run) -> dict:
    """Where a run came from, for its commands: its spec, the schedule and slot that started
    it (read from the slot's idempotency key), or its parent run and step."""
    found = {"spec": run.spec_name}
    if slot := schedules.slot_of(run.idempotency_key):
        found.update(schedule=slot[0], slot=slot[1])
        name = Schedule.objects.filter(pk=slot[0]).values_list("name", flat=True).first()
        if name:
            found["schedule_name"] = name
    if run.parent_step_id:
        parent = Step.objects.filter(pk=run.parent_step_id).values_list("run_id", "key").first()
        if parent:
            found.update(parent_run=parent[0], parent_step=parent[1])
    return found


def _execute_one(step: Step, owner: str, chain: bool = True):
    with logs.about(run=step.run_id, step=step.key, attempt=step.attempt), \
            tracing.attempt_span(step.run_id, step.key, step.attempt):
        return _execute_attempt(step, owner, chain)


def _context(step: Step) -> dict:
    return {"run_id": step.run_id, "step_key": step.key, "attempt": step.attempt,
            "params": step.run.params, **origin(step.run),
            "lease": _lease(step)}


def _lease(step: Step) -> dict:
    """A step's attempt as its command and its spool folder name it."""
    return {"kind": "step", "id": step.pk, "token": step.lease_token}


def _start_child(step: Step, owner: str):
    """A run inside a run: open the child and hand the step to it, holding no worker."""
    return report(partial(engine.children.start_child, step.run_id, step.key,
                          lease_token=step.lease_token, actor=f"worker {owner}"),
                  what=f"step {step.pk}")


def _spawned(step_id: int, token: str, pid: int, pgid: int) -> None:
    try:
        engine.record_child(step_id, token, pid, pgid)
    except DatabaseError:
        connection.close()  # shown on the page only; the result carries it too


# What an attempt given back before it began ends with, as _execute counts kinds.
NOT_BEGUN = SimpleNamespace(kind="not_begun")


def _execute_attempt(step: Step, owner: str, chain: bool):
    token = step.lease_token
    context = _context(step)
    stop = KEEPER.hold("step", step.pk, token, settings.TOLLGATE_LEASE_SECONDS,
                       since=getattr(step, "claimed_since", None))
    if not KEEPER.fresh("step", step.pk):  # the claim's answer came too late (fresh)
        KEEPER.release("step", step.pk)
        _give_back([step], owner)
        return NOT_BEGUN
    try:
        if "workflow" in step.config["run"]:
            return _start_child(step, owner)
        outcome = _attempt(step.config["run"], context, step.run.shared_state, stop,
                           partial(_spawned, step.pk, token))
        checkpoint = _keeping(outcome, lambda: _report_outcome(step, token, owner, outcome,
                                                               chain), context["lease"])
    finally:
        KEEPER.release("step", step.pk)
    return checkpoint


def _attempt(action: dict, context: dict, shared_state: dict, stop, on_spawn=None):
    """Run the action; whatever goes wrong here ends the attempt with a clear error rather
    than leaving it running with no one to report it."""
    try:
        return execute(action, context=context, shared_state=shared_state, stop=stop,
                       on_spawn=on_spawn)
    except Exception as exc:
        log.exception("Attempt %s failed in the worker", context)
        return Outcome(False, f"The worker could not run it: {type(exc).__name__}: {exc}")


def _keeping(outcome, record, lease: dict):
    """Record an outcome; its spool folder goes once it is recorded. If recording failed
    for good (the database away past the report window), the result is kept for whoever
    finds it."""
    try:
        recorded = record()
    except BaseException:
        _keep_unrecorded(outcome, lease)
        raise
    spool.discard(outcome.spooled)
    return recorded


def _keep_unrecorded(outcome, lease: dict) -> None:
    """Keep an outcome that could not be recorded: a command's folder is handed over, a
    callable's outcome written to one."""
    if outcome.spooled is not None:
        spool.hand_over(outcome.spooled)
        return
    try:
        spool.keep(lease, {"ok": outcome.ok, "summary": outcome.summary,
                           "evidence": outcome.evidence, "state_patch": outcome.state_patch,
                           "retryable": outcome.retryable})
    except (OSError, TypeError, ValueError):
        log.exception("Could not keep the unrecorded outcome of %s", lease)


ORPHANS_EVERY = 5.0  # seconds between looks at the spool, per process
_orphans_looked = 0.0


def record_orphans(force: bool = False) -> int:
    """Record the results a dead consumer on this machine (or a worker the database left
    waiting too long) finished and could not record, from their spool folders; a folder
    whose lease moved on is dropped. Returns how many results were recorded."""
    global _orphans_looked
    if not force and time.monotonic() - _orphans_looked < ORPHANS_EVERY:
        return 0
    _orphans_looked = time.monotonic()
    recorded = 0
    for kind, pk, token, folder in spool.orphans():
        try:
            recorded += _record_orphan(kind, pk, token, folder)
        except DatabaseError:
            log.warning("Could not record the orphaned result in %s yet", folder, exc_info=True)
            connection.close()
    return recorded


def record_finished(kind: str, pk: int, token: str) -> bool:
    """Record a lease's finished result from this machine's spool, if its command finished,
    even though its holder still holds the folder: the sweeper's move before it reclaims a
    lease whose holder it cannot check (frozen or cut off in another container on a shared
    spool volume), so that a finished command is not run again. The holder, if it comes
    back, finds its report recorded already."""
    folder = spool.folder_of({"kind": kind, "id": pk, "token": token})
    if not token or not spool.finished(folder):
        return False
    return bool(_record_orphan(kind, pk, token, folder, "its worker could not be reached"))


def _record_orphan(kind: str, pk: int, token: str, folder, why: str = "after it stopped") -> int:
    model = Step if kind == "step" else Compensation
    row = model.objects.select_related("run").filter(pk=pk).first()
    if row is None:
        # Not a row of this database: not ours to record, nor to delete.
        log.warning("Spool folder %s names no %s of this database; left as it is",
                    folder.name, kind)
        return 0
    moved_on = row.lease_token != token or row.status != "running"
    if moved_on and (kind != "step" or not spool.finished(folder)):
        spool.discard(folder)  # reclaimed, cancelled or recorded already; nothing finished
        return 0
    if not spool.finished(folder):
        return 0  # nothing finished: the sweeper reclaims the lease
    action = row.config["run"] if kind == "step" else row.step.compensation
    try:
        secrets = secret_values(resolved_env(action))
    except MissingSecret:
        secrets = secret_values({})  # every secret this worker knows is redacted anyway
    kept = spool.kept_outcome(folder)
    outcome = Outcome(**kept) if kept is not None else outcome_of(folder, secrets)
    if kind == "step":
        # A lease that moved on meanwhile (a cut-off longer than the report window) keeps
        # the result as a stale one, with its exit code and output digest; one recorded
        # already is recognised by its token and not recorded twice.
        holder = "a worker whose lease moved on" if moved_on else f"worker {row.lease_owner}"
        _record_step(row, token, f"{holder} (recorded from its spool {why})", outcome)
    elif not outcome.ok and outcome.evidence.get("terminated") in ("owner_gone", "fenced"):
        compensations.release(pk, token)  # cut short with its worker: it runs again
    else:
        compensations.finish(pk, token, ok=outcome.ok, summary=outcome.summary,
                             evidence=outcome.evidence)
    spool.discard(folder)
    log.info("Recorded the result of %s %s from the spool", kind, pk)
    return 1


def _report_outcome(step: Step, token: str, owner: str, outcome, chain: bool):
    chain = engine.Chain(owner, settings.TOLLGATE_LEASE_SECONDS,
                         processes.this_process()) if chain and outcome.ok else None
    since = time.monotonic()  # a step chained onto this report is claimed after this
    checkpoint = _record_step(step, token, f"worker {owner}", outcome, chain=chain,
                              call=lambda fn, what: report(fn, what=what))
    if getattr(checkpoint, "next_step", None) is not None:
        checkpoint.next_step.claimed_since = since
    return checkpoint


def _record_step(step: Step, token: str, actor: str, outcome, *, chain=None,
                 call=lambda fn, what: fn()):
    """Record a step's outcome with its lease token (through `call`, which may retry); a
    result the engine refuses (a state patch it cannot store) fails the step saying why."""
    common = {"actor": actor, "summary": outcome.summary, "evidence": outcome.evidence,
              "lease_token": token}
    if outcome.ok:
        first = partial(engine.complete_step, step.run_id, step.key,
                        state_patch=outcome.state_patch, chain=chain, **common)
    else:
        first = partial(engine.fail_step, step.run_id, step.key,
                        retryable=outcome.retryable, **common)
    try:
        return call(first, f"step {step.pk}")
    except engine.InvalidInput as exc:
        common["summary"] = f"Result refused: {exc}"
        return call(partial(engine.fail_step, step.run_id, step.key, retryable=False,
                            **common), f"step {step.pk}")


def compensate_run(run_id: int) -> list[str]:
    """Run the failed run's compensations one at a time, latest completed step first."""
    done = []
    while True:
        since = time.monotonic()
        row = compensations.claim(run_id, owner=worker_name(), holder=processes.this_process(),
                                  lease_seconds=settings.TOLLGATE_LEASE_SECONDS)
        if row is None:
            return done
        stop = KEEPER.hold("compensation", row.pk, row.lease_token,
                           settings.TOLLGATE_LEASE_SECONDS, renew=compensations.renew,
                           since=since)
        try:
            context = {"run_id": run_id, "step_key": row.step.key, "attempt": row.attempt,
                       "params": row.run.params, **origin(row.run), "compensating": True,
                       "lease": {"kind": "compensation", "id": row.pk,
                                 "token": row.lease_token}}
            with logs.about(run=run_id, step=row.step.key, attempt=row.attempt,
                            compensation=row.pk):
                outcome = _attempt(row.step.compensation, context, row.run.shared_state, stop)
            _keeping(outcome, partial(report, partial(
                compensations.finish, row.pk, row.lease_token, ok=outcome.ok,
                summary=outcome.summary, evidence=outcome.evidence),
                what=f"compensation {row.pk}"), context["lease"])
        finally:
            KEEPER.release("compensation", row.pk)
        done.append(row.step.key)

