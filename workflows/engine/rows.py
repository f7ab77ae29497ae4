"""A run's rows under its lock: the run, the steps a transition may touch, and their writes.

A transition locks the run row, then reads in one statement the steps it may change or must
look at: the run's frontier (open, hard-failed and newly ready steps), the step it acts on,
that step's dependents, and the first ready steps beyond those. It changes them in memory;
`flush` writes what changed when the transaction ends (one statement on PostgreSQL). So a
transition costs the same in a run of five steps and in one of five thousand: two reads, a
write and the commit, whatever it does.
"""

from __future__ import annotations

from contextlib import contextmanager
from datetime import UTC

from django.db import connection, transaction
from django.db.models import Max

from workflows.audit import chain
from workflows.engine import sql
from workflows.engine.rules import PENDING_READY, in_frontier, is_ready, settled
from workflows.engine.signals import transition_recording
from workflows.errors import NotFound
from workflows.models import (
    DONE_STEP_STATUSES,
    STEP_FRONTIER,
    Checkpoint,
    Compensation,
    GoalTally,
    Run,
    RunDay,
    RunStatus,
    Step,
    StepKind,
    StepStatus,
)
from workflows.timing import clock

# Evidence (a command's output) is written by transitions, never read by them.
STEP = sql.Table(Step, skip=("last_evidence",))
# The run search's text is the pages'; a transition neither reads nor writes it.
RUN = sql.Table(Run, skip=("search_text",))
CHECKPOINT = sql.Table(Checkpoint)
TALLY = sql.Table(GoalTally)
TALLY_COLUMNS = ("goal_id", "runs_completed", "runs_failed", "steps_total", "steps_done",
                 "folded")
DAY = sql.Table(RunDay)
DAY_COLUMNS = ("day", "spec_name", "goal_id", "completed", "failed", "folded")
CHECKPOINT_COLUMNS = (*chain.FIELDS, "prev_hash", "hash")
# The step columns a transition may change; a flush writes only those that did.
STEP_COLUMNS = tuple(name for name in STEP.attnames if name != "updated_at") + ("last_evidence",)
RUN_COLUMNS = tuple(f.attname for f in RUN.fields
                    if f.attname not in ("id", "updated_at") and not f.generated)
# The first ready steps beyond the acted one and its dependents that a transaction loads: a
# worker that completes a step may go on with one of them, and still know if more remain.
READY_AHEAD = 2


def actor_of(actor) -> tuple[object | None, str]:
    """(user or None, the name the timeline shows) for a user, a system name or None."""
    if actor is None:
        return None, "system"
    if isinstance(actor, str):
        return None, actor
    return actor, actor.get_username()


def _snapshot(step: Step) -> None:
    loaded = step.as_loaded = dict(step.__dict__)  # values are replaced, never changed in place
    loaded.pop("as_loaded", None)
    step.settled_when_loaded = settled(step)


class RunState:
    """A locked run and the steps of it that the transaction has read, changed in memory."""

    def __init__(self, run: Run, fairer_waiting: bool = False):
        self.run = run
        self.steps: dict[int, Step] = {}
        self.fairer_waiting = fairer_waiting  # another run waits longer for a worker
        self.checkpoints: list[Checkpoint] = []
        self.owes_compensations = False  # the transition being committed failed the run
        self.owing = None  # its announcement, until its compensations are planned
        self.announced: list = []  # transitions recorded since the rows were last written
        # gate id -> (group, person id) of each rule, where a transition read them already:
        # whose inboxes it changes, not read again when it is announced
        self.audiences: dict[int, list[tuple[str, int | None]]] = {}
        self.run_loaded = {name: getattr(run, name) for name in RUN_COLUMNS}

    # reading ------------------------------------------------------------------------------
    def add(self, step: Step) -> Step:
        step._state.fields_cache["run"] = self.run
        _snapshot(step)
        self.steps[step.pk] = step
        return step

    def step(self, key: str) -> Step:
        for step in self.steps.values():
            if step.key == key:
                return step
        raise NotFound(f"Run {self.run.pk} has no step {key!r}.")

    def find(self, pk: int) -> Step | None:
        return self.steps.get(pk)

    def frontier(self) -> list[Step]:
        """What decides the run's status and next move, in step order (see STEP_FRONTIER).

        Exact without a query: a row's membership depends on its own columns only, and every
        row a transaction changes is loaded."""
        return sorted((s for s in self.steps.values() if in_frontier(s)),
                      key=lambda s: s.index)

    def hard_failure(self) -> Step | None:
        return next((s for s in self.frontier() if s.status == StepStatus.FAILED
                     and not s.continue_on_failure), None)

    def first_ready(self, now) -> Step | None:
        """The first worker step that may start now, short of the run's own state. Every
        ready step that may come first is loaded: the frontier holds the newly ready ones,
        and the load holds the first ready steps beyond the ones a transition changes."""
        ready = [s for s in self.steps.values() if is_ready(s, now)]
        return min(ready, key=lambda s: s.index) if ready else None

    def running_count(self) -> int:
        return sum(1 for s in self.steps.values()
                   if s.status == StepStatus.RUNNING and s.kind == StepKind.RUN)

    def ensure_dependents(self, step: Step) -> list[Step]:
        """The loaded dependents of a step, reading any that are not loaded yet."""
        missing = set(step.dependents) - {s.key for s in self.steps.values()}
        if missing:
            self.flush()
            for found in _read_steps(f"run_id = %s AND {sql.qn('key')} IN "
                                     f"({', '.join(['%s'] * len(missing))})",
                                     [self.run.pk, *sorted(missing)]):
                self.add(found)
        wanted = set(step.dependents)
        return [s for s in self.steps.values() if s.key in wanted]

    def refresh(self) -> None:
        """Write what changed, then read the run's steps again (after a bulk change)."""
        self.flush()
        loaded = list(self.steps)
        self.steps = {}
        for step in _read_steps(f"run_id = %s AND ({_frontier_sql()})", [self.run.pk]):
            self.add(step)
        others = [pk for pk in loaded if pk not in self.steps]
        if others:
            for step in _read_steps(f"id IN ({', '.join(['%s'] * len(others))})", others):
                self.add(step)
        for step in _read_steps(f"run_id = %s AND ({_ready_sql()}) ORDER BY "
                                f"{sql.qn('index')} LIMIT {READY_AHEAD}", [self.run.pk]):
            if step.pk not in self.steps:
                self.add(step)

    def exists_unsettled(self) -> bool:
        """Is any step of the run not yet settled (loaded or not)?"""
        if any(not settled(s) for s in self.steps.values()):
            return True
        self.flush()
        with sql.cursor() as cursor:
            cursor.execute(
                f"SELECT 1 FROM {STEP.name} WHERE run_id = %s AND NOT ("
                f"status IN (%s, %s) OR (status = %s AND continue_on_failure)) LIMIT 1",
                [self.run.pk, StepStatus.COMPLETED, StepStatus.SKIPPED, StepStatus.FAILED])
            return cursor.fetchone() is not None

    # writing ------------------------------------------------------------------------------
    def append(self, *, kind, step, run_status, step_status, actor, actor_name, summary,
               evidence, state_patch, at, label: str = "") -> Checkpoint:
        """The run's next checkpoint, written when the transaction's rows are."""
        checkpoint = CHECKPOINT.new(
            id=None, run_id=self.run.pk, seq=self.run.checkpoint_seq, kind=kind,
            step_id=step.pk if step else None, run_status=run_status, step_status=step_status,
            actor_id=actor.pk if actor else None, actor_name=actor_name, label=label,
            summary=summary, evidence=evidence, state_patch=state_patch, at=at)
        checkpoint.prev_hash = self.run.chain_head
        checkpoint.hash = self.run.chain_head = chain.link(
            checkpoint.prev_hash, {name: getattr(checkpoint, name) for name in chain.FIELDS})
        cache = checkpoint._state.fields_cache
        cache["run"], cache["step"], cache["actor"] = self.run, step, actor
        self.checkpoints.append(checkpoint)
        return checkpoint

    def flush(self) -> None:
        """Write the changed steps and run row and the new checkpoints."""
        flush_all([self])

    def writes(self) -> tuple[list[tuple[str, list]], list[Checkpoint]]:
        """The statements that write what changed, and the new checkpoints (to insert);
        the rows count as written from here on."""
        now = clock.now()
        groups: dict[tuple, list] = {}
        run = self.run
        for step in self.steps.values():
            changed = _changed(step)
            if "status" in changed:
                run.steps_done += ((step.status in DONE_STEP_STATUSES)
                                   - (step.as_loaded["status"] in DONE_STEP_STATUSES))
            if changed:
                names = (*changed, "updated_at")
                groups.setdefault(names, []).append(
                    (step.pk, *(step.__dict__[n] for n in changed), now))
                step.updated_at = now
                _snapshot(step)
        statements = [STEP.update_many(names, rows) for names, rows in groups.items()]
        run_changes = {name: getattr(run, name) for name in RUN_COLUMNS
                       if getattr(run, name) != self.run_loaded[name]}
        if run_changes or self.checkpoints:
            run.updated_at = now
            statements.append(RUN.update(run.pk, {**run_changes, "updated_at": now}))
            statements.extend(_tally_change(self.run_loaded, run))
            statements.extend(_day_change(self.run_loaded, run))
            self.run_loaded.update(run_changes)
        checkpoints, self.checkpoints = self.checkpoints, []
        return statements, checkpoints


def flush_all(states: list[RunState]) -> None:
    """Write what changed in each of the states (of distinct runs), in one round trip on
    PostgreSQL, and send `transition_recording` once for the transitions recorded in them."""
    statements, checkpoints = [], []
    for state in states:
        writes, new = state.writes()
        statements += writes
        checkpoints += new
    returning = None
    if checkpoints:
        returning = CHECKPOINT.insert(
            CHECKPOINT_COLUMNS,
            ([getattr(c, name) for name in CHECKPOINT_COLUMNS] for c in checkpoints),
            returning=("id", "run_id", "seq"))
    if statements or returning:
        ids = {(run_id, seq): pk
               for pk, run_id, seq in sql.write(statements, returning) or []}
        for checkpoint in checkpoints:
            checkpoint.id = ids[checkpoint.run_id, checkpoint.seq]
            checkpoint._state.adding = False
    _plan_compensations([state for state in states if state.owing is not None])
    # What the transitions owe the outside world is recorded with their rows, in one go.
    announced = [a for state in states for a in state.announced]
    if announced:
        for state in states:
            state.announced = []
        transition_recording.send(sender=Run, announcements=announced)


def _finished_counts(status, steps_total: int, steps_done: int) -> tuple[int, int, int, int]:
    """What a run adds to its goal's tally: a finished run its counts; an open one nothing
    (rollups count open runs live), nor a cancelled one (it counts for nothing)."""
    if status == RunStatus.COMPLETED:
        return 1, 0, steps_total, steps_done
    if status == RunStatus.FAILED:
        return 0, 1, steps_total, steps_done
    return 0, 0, 0, 0


def _tally_change(loaded: dict, run: Run) -> list[tuple[str, list]]:
    """The tally row a run's change owes its goal, if its finished counts moved."""
    if run.goal_id is None:
        return []
    before = _finished_counts(loaded["status"], loaded["steps_total"], loaded["steps_done"])
    after = _finished_counts(run.status, run.steps_total, run.steps_done)
    if before == after:
        return []
    change = tuple(a - b for a, b in zip(after, before, strict=True))
    return [TALLY.insert(TALLY_COLUMNS, [(run.goal_id, *change, False)])]


def _day_change(loaded: dict, run: Run) -> list[tuple[str, list]]:
    """The progress report's day rows a run's change owes: +1 on the UTC day it finished
    (completed or failed), and -1 on the day it had finished if it is reopened or moved."""
    def counted(status, finished_at):
        if status not in (RunStatus.COMPLETED, RunStatus.FAILED) or finished_at is None:
            return None
        return (finished_at.astimezone(UTC).date(), status == RunStatus.COMPLETED,
                status == RunStatus.FAILED)

    before = counted(loaded["status"], loaded["finished_at"])
    after = counted(run.status, run.finished_at)
    if before == after:
        return []
    rows = [(day, run.spec_name, run.goal_id, sign * completed, sign * failed, False)
            for sign, found in ((-1, before), (1, after)) if found is not None
            for day, completed, failed in [found]]
    return [DAY.insert(DAY_COLUMNS, rows)]


def _changed(step: Step) -> list[str]:
    loaded = step.as_loaded
    state = step.__dict__
    return [name for name in STEP_COLUMNS
            if name in state and (name not in loaded or state[name] != loaded[name])]


# statements -------------------------------------------------------------------------------

RUN_ID, NOW, ACTED = sql.Slot("run"), sql.Slot("now"), sql.Slot("acted")
_cache: dict[tuple, tuple[str, list]] = {}


def _cached(name: tuple, build) -> tuple[str, list]:
    """A statement's text and parameter slots, built once per database vendor."""
    key = (connection.vendor, *name)
    if key not in _cache:
        _cache[key] = build()
    return _cache[key]


def _frontier_sql() -> str:
    return _cached(("frontier",), lambda: (sql.where(Step, STEP_FRONTIER), []))[0]


def _ready_sql() -> str:
    return _cached(("ready",), lambda: (sql.where(Step, PENDING_READY), []))[0]


def _read_steps(condition: str, params: list) -> list[Step]:
    with sql.cursor() as cursor:
        cursor.execute(f"SELECT {STEP.columns()} FROM {STEP.name} WHERE {condition}", params)
        return [STEP.instance(row) for row in cursor.fetchall()]


def _dependents_of(acted: str) -> str:
    """A subquery of the dependents' keys (as `k`) of the step that `acted` selects."""
    if sql.is_postgres():
        return (f"SELECT jsonb_array_elements_text(dependents) AS k FROM {STEP.name} "
                f"WHERE {acted}")
    return (f"SELECT j.value AS k FROM {STEP.name}, json_each({STEP.name}.dependents) AS j "
            f"WHERE {acted}")


def _build_steps(acted_by: str) -> tuple[str, list]:
    """A condition on `s.id`: the steps a transition may touch. The frontier, the acted step
    (`acted_by`: "key", "id" or "") and its dependents, and the first ready steps beyond
    those; each part is an index lookup, gathered once."""
    step, key, index = STEP.name, sql.qn("key"), sql.qn("index")
    frontier, ready = _frontier_sql(), _ready_sql()
    parts = [f"SELECT id FROM {step} WHERE run_id = %s AND ({frontier})"]
    slots = [RUN_ID]
    beyond, beyond_slots = "", []
    if acted_by:
        acted = f"{step}.run_id = %s AND {step}.{key if acted_by == 'key' else 'id'} = %s"
        deps = _dependents_of(acted)
        # Each dependent is one lookup in the (run, key) index. PostgreSQL would rather scan
        # the run's steps (it cannot know how many a new run has): a LATERAL with LIMIT 1,
        # which it cannot flatten, makes it look each one up.
        if sql.is_postgres():
            dependents = (f"SELECT dep.id FROM ({deps}) AS d CROSS JOIN LATERAL (SELECT id "
                          f"FROM {step} WHERE run_id = %s AND {key} = d.k LIMIT 1) AS dep")
        else:
            dependents = (f"SELECT dep.id FROM ({deps}) AS d JOIN {step} AS dep "
                          f"ON dep.run_id = %s AND dep.{key} = d.k")
        parts += [f"SELECT id FROM {step} WHERE {acted}", dependents]
        slots += [RUN_ID, ACTED, RUN_ID, ACTED, RUN_ID]
        beyond = (f" AND {step}.{key if acted_by == 'key' else 'id'} <> %s"
                  f" AND {sql.in_list(key, f'SELECT k FROM ({deps}) AS d', negate=True)}")
        beyond_slots = [ACTED, RUN_ID, ACTED]
    parts.append(f"SELECT id FROM (SELECT id FROM {step} WHERE run_id = %s AND ({ready})"
                 f"{beyond} ORDER BY {index} LIMIT {READY_AHEAD}) AS ahead")
    slots += [RUN_ID, *beyond_slots]
    return sql.in_list("s.id", " UNION ALL ".join(parts)), slots


def _build_load(acted_by: str, fairness: bool, lock: bool = True) -> tuple[str, list]:
    """The statement that locks the run row and reads the steps a transition may touch (with
    `fairness`: whether another run waits longer for a worker), and the run's checkpoint
    count as the statement's snapshot saw it (see `load`)."""
    step, run = STEP.name, RUN.name
    fairer, fairer_slots = "0 = 1", []
    if fairness:
        fairer = (f"EXISTS (SELECT 1 FROM {run} AS other WHERE other.claimable_at <= %s "
                  f"AND other.id <> r.id AND (other.priority_rank > r.priority_rank OR ("
                  f"other.priority_rank = r.priority_rank AND other.served_at < r.served_at)))")
        fairer_slots = [NOW]
    ids, ids_slots = _build_steps(acted_by)
    text = (f"SELECT {RUN.columns('r')}, {fairer}, (SELECT seen.checkpoint_seq FROM {run} "
            f"AS seen WHERE seen.id = %s), {STEP.columns('s')} FROM {run} AS r "
            f"LEFT JOIN {step} AS s ON {ids} WHERE r.id = %s")
    if lock and sql.is_postgres():
        text += " FOR UPDATE OF r"
    return text, [*fairer_slots, RUN_ID, *ids_slots, RUN_ID]


def _build_read_many(count: int) -> tuple[str, list]:
    """`count` runs' loads (as a claim reads them) in one statement, without their locks."""
    text, slots = _build_load("", False, lock=False)
    return " UNION ALL ".join([text] * count), [
        sql.Slot(f"run{i}") if slot is RUN_ID else slot for i in range(count) for slot in slots]


def lock_runs(run_ids: list[int]) -> list[int]:
    """Lock these runs, waiting for them, in order of id (as every holder of many runs
    locks them, so none waits on another in a circle); those that exist, in that order.
    On SQLite the transaction's write lock holds them all already."""
    if not run_ids:
        return []
    text = (f"SELECT id FROM {RUN.name} WHERE id IN ({', '.join(['%s'] * len(run_ids))}) "
            "ORDER BY id" + (" FOR UPDATE" if sql.is_postgres() else ""))
    with sql.cursor() as cursor:
        cursor.execute(text, sorted(run_ids))
        return [row[0] for row in cursor.fetchall()]


def read_locked(run_ids: list[int]) -> list[RunState]:
    """The runs this transaction has locked already (`next_claimable_runs`, `lock_runs`),
    read as `load` reads them for a claim, in one statement; in the order of `run_ids`,
    less any that no longer exist."""
    if not run_ids:
        return []
    text, slots = _cached(("read", len(run_ids)), lambda: _build_read_many(len(run_ids)))
    values = {"now": clock.now(), **{f"run{i}": pk for i, pk in enumerate(run_ids)}}
    states: dict[int, RunState] = {}
    width = len(RUN.fields)
    with sql.cursor() as cursor:
        cursor.execute(text, sql.bind(slots, values))
        for row in cursor.fetchall():
            state = states.get(row[0])
            if state is None:
                state = states[row[0]] = RunState(RUN.instance(row))
            if row[width + 2] is not None:
                state.add(STEP.instance(row, width + 2))
    return [states[pk] for pk in run_ids if pk in states]


def load(run_id: int, *, key: str | None = None, step_id: int | None = None,
         fairness: bool = False) -> RunState:
    """Lock the run and read what a transition may touch; NotFound if there is no such run.

    One statement locks the run and reads its steps. On PostgreSQL, a statement that had to
    wait for the lock reads the locked row as it is now but the joined steps as they were
    when it began: if a transition committed meanwhile (the run's checkpoint count moved),
    the steps are read again, under the lock."""
    acted_by = "key" if key is not None else "id" if step_id is not None else ""
    values = {"run": run_id, "now": clock.now(),
              "acted": key if key is not None else step_id}
    text, slots = _cached(("load", acted_by, fairness), lambda: _build_load(acted_by, fairness))
    with sql.cursor() as cursor:
        cursor.execute(text, sql.bind(slots, values))
        rows = cursor.fetchall()
        if not rows:
            raise NotFound(f"Run {run_id} does not exist.")
        width = len(RUN.fields)
        state = RunState(RUN.instance(rows[0]), fairer_waiting=bool(rows[0][width]))
        if rows[0][width + 1] != state.run.checkpoint_seq:
            ids, ids_slots = _cached(("steps", acted_by), lambda: _build_steps(acted_by))
            cursor.execute(f"SELECT {STEP.columns('s')} FROM {STEP.name} AS s WHERE {ids}",
                           sql.bind(ids_slots, values))
            rows = [(None,) * (width + 2) + row for row in cursor.fetchall()]
        for row in rows:
            if row[width + 2] is not None:
                state.add(STEP.instance(row, width + 2))
    return state


INSERT_BATCH = 400  # rows per INSERT: within both databases' limits on parameters


def insert_steps(steps: list[Step]) -> None:
    """Insert new steps (a run's, as it opens) a few hundred rows per statement."""
    names = [name for name in STEP.by_attname if name != "id"]
    now = clock.now()
    for step in steps:
        step.updated_at = now
    with sql.cursor() as cursor:
        for start in range(0, len(steps), INSERT_BATCH):
            batch = steps[start:start + INSERT_BATCH]
            cursor.execute(*STEP.insert(names, ([getattr(step, name) for name in names]
                                                for step in batch)))


def _plan_compensations(states: list[RunState]) -> None:
    """Compensation rows for the runs that just failed in these states (their rows written
    already): each completed step with a compensation not planned yet, latest first, once.
    A few statements for all of them; each failing transition's announcement is told how
    many its run owes (its doorbell)."""
    if not states:
        return
    now = clock.now()
    owed: dict[int, list[int]] = {state.run.pk: [] for state in states}
    with sql.cursor() as cursor:
        cursor.execute(f"SELECT run_id, id FROM {STEP.name} WHERE run_id IN "
                       f"({', '.join(['%s'] * len(owed))}) AND status = %s AND "
                       "compensation IS NOT NULL AND compensated_at IS NULL ORDER BY run_id, "
                       f"finished_at DESC, {sql.qn('index')} DESC",
                       [*owed, StepStatus.COMPLETED])
        for run_id, step_id in cursor.fetchall():
            owed[run_id].append(step_id)
    planned = [step_id for steps in owed.values() for step_id in steps]
    if planned:
        # A run failed before (and retried) has its earlier compensations: these follow.
        last = dict(Compensation.objects.filter(run_id__in=[r for r in owed if owed[r]])
                    .values("run_id").annotate(last=Max("order"))
                    .values_list("run_id", "last"))
        Compensation.objects.bulk_create(
            Compensation(run_id=run_id, step_id=step_id, order=last.get(run_id, 0) + 1 + i,
                         created_at=now)
            for run_id, steps in owed.items() for i, step_id in enumerate(steps))
        Step.objects.filter(pk__in=planned).update(compensated_at=now)  # never twice
    for state in states:
        state.owing.compensations = len(owed[state.run.pk])
        state.owing = None
        for step_id in owed[state.run.pk]:
            loaded = state.find(step_id)
            if loaded is not None:
                loaded.compensated_at = loaded.as_loaded["compensated_at"] = now


def run_of_step(step_id: int) -> int | None:
    if not isinstance(step_id, int) or not 0 < step_id < 2**63:
        return None
    with sql.cursor() as cursor:
        cursor.execute(f"SELECT run_id FROM {STEP.name} WHERE id = %s", [step_id])
        row = cursor.fetchone()
    return row[0] if row else None


@contextmanager
def locked(run, *, key: str | None = None, step_id: int | None = None,
           fairness: bool = False):
    """A transaction holding the run's lock, with its rows loaded (`RunState`); what changed
    is written when the block ends without an error."""
    run_id = run.pk if isinstance(run, Run) else run
    if step_id is not None and run_id is None:
        run_id = run_of_step(step_id)
        if run_id is None:
            raise NotFound(f"Step {step_id} does not exist.")
    try:
        run_id = int(run_id)
    except (TypeError, ValueError):
        run_id = None
    if run_id is None or not 0 < run_id < 2**63:
        raise NotFound(f"Run {run if not isinstance(run, Run) else run.pk} does not exist.")
    with transaction.atomic():
        state = load(run_id, key=key, step_id=step_id, fairness=fairness)
        yield state
        state.flush()


def next_claimable_run(*, besides: int | None = None, wait: bool = True) -> int | None:
    """The run a claim serves next (see rules.claimable_at): highest priority first, then
    the one a worker served longest ago. On PostgreSQL a run another worker is claiming
    from is skipped, unless no other has work (and `wait`: a caller holding another run's
    lock must not wait for one, or two such callers could wait on each other). `besides`
    leaves out the run the caller holds already."""
    found = next_claimable_runs(1, besides=() if besides is None else (besides,), wait=wait)
    return found[0] if found else None


def next_claimable_runs(limit: int, *, besides=(), wait: bool = False) -> list[int]:
    """Up to `limit` runs a claim serves next, in that order, locked on PostgreSQL (runs
    other workers hold are skipped; with `wait`, when every one is held, the first is
    named, for the caller's load to wait for). `besides` leaves out runs the caller holds
    already."""
    text = f"SELECT id FROM {RUN.name} WHERE claimable_at <= %s"
    params = [clock.now()]
    if besides:
        text += f" AND id NOT IN ({', '.join(['%s'] * len(besides))})"
        params.extend(besides)
    text += " ORDER BY priority_rank DESC, served_at, id LIMIT {}"
    with sql.cursor() as cursor:
        if sql.is_postgres():
            cursor.execute(text.format(int(limit)) + " FOR UPDATE SKIP LOCKED", params)
            found = [row[0] for row in cursor.fetchall()]
            if found or not wait:
                return found
            limit = 1  # the caller's load waits for it
        cursor.execute(text.format(int(limit)), params)
        return [row[0] for row in cursor.fetchall()]


def claimable_exists() -> bool:
    """Does any run have a step a worker may claim now?"""
    with sql.cursor() as cursor:
        cursor.execute(f"SELECT 1 FROM {RUN.name} WHERE claimable_at <= %s LIMIT 1",
                       [clock.now()])
        return cursor.fetchone() is not None
