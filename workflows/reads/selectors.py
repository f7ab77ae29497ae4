"""Reads shared by pages, the API and commands: run lists, timelines, where a run stands."""

from __future__ import annotations

from datetime import timedelta

from django.db import connection
from django.db.models import Count, F, Q, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce

from workflows.audit import chain, seals
from workflows.engine import InvalidInput, NotFound
from workflows.engine.rules import next_move, ready_steps
from workflows.engine.sql import CompiledQuery
from workflows.models import (
    OPEN_RUN_STATUSES,
    Approval,
    AuditSeal,
    Checkpoint,
    Decision,
    Run,
    RunStatus,
    SpecStatus,
    WorkflowSpec,
)
from workflows.people.permissions import acting_for, decidable_by
from workflows.specs.validation import masked
from workflows.specs.values import label, pretty_json
from workflows.timing.timezones import day_starts


def _decidable_by_user_id(user):
    from django.contrib.auth import get_user_model

    return decidable_by(get_user_model()(pk=user, is_active=True), people=[]).order_by()


_INBOX_COUNT = CompiledQuery(_decidable_by_user_id, "user")


def inbox_count(user) -> int:
    """How many gates wait on the user (the header's count): `decidable_by`, compiled once."""
    if not (user.is_authenticated and user.is_active):
        return 0
    if acting_for(user):  # deciding for someone away: their gates count too
        return decidable_by(user).count()
    return _INBOX_COUNT.count(user=user.pk)


def runs(*, status: str | list[str] = "", spec: str = "", goal: int | None = None,
         q: str = "", requester: str = "", opened_from=None, opened_to=None,
         finished_from=None, finished_to=None, open_only: bool = False, kind: str = "",
         ref: str = "", parent: int | None = None, schedule: int | None = None,
         sort: str = "created") -> QuerySet[Run]:
    """Runs, newest first (`sort` "activity": the latest moved first; stable for paging),
    filtered and searched as the runs page and
    `GET /api/runs` ask. `status` is one or several; `open_only` keeps the runs not yet
    ended; `parent` the runs a run's steps opened, `schedule` the runs a schedule started.
    `q` matches title, idempotency key, outside reference, spec name or requester;
    `ref` is an outside reference exactly; the dates are inclusive days."""
    # By activity is a top-N sort of the filtered runs, on no index: an index on the column
    # every transition writes would cost every step an index write of its own.
    found = Run.objects.select_related("spec", "goal", "requested_by", "opened_by",
                                       "parent_step").order_by(
        *(("-updated_at", "-id") if sort == "activity" else ("-created_at", "-id")))
    if kind:
        found = found.filter(kind=kind)
    if ref:
        found = found.filter(ref=ref)
    statuses = [status] if isinstance(status, str) else list(status)
    statuses = [name for name in statuses if name in RunStatus.values]
    if statuses:
        found = found.filter(status__in=statuses)
    if open_only:
        found = found.filter(status__in=OPEN_RUN_STATUSES)
    if spec:
        found = found.filter(spec_name=spec)
    if goal is not None:
        found = found.filter(goal_id=goal)
    if parent is not None:
        found = found.filter(parent_step__run_id=parent)
    if schedule is not None:
        found = found.filter(schedule_id=schedule)  # every slot's run, retries included
    if q := q.strip():
        # One indexed column (trigram on PostgreSQL, FTS5 trigram on SQLite) or the
        # requester, looked up once.
        users = Run._meta.get_field("requested_by").related_model.objects
        requester_id = users.filter(username__iexact=q).values("pk")[:1]
        found = found.filter(_text_matches(q.lower())
                             | Q(requested_by_id=Subquery(requester_id)))
    if requester:
        found = found.filter(requested_by__username=requester)
    for field, start, end in (("created_at", opened_from, opened_to),
                              ("finished_at", finished_from, finished_to)):
        if start:
            found = found.filter(**{f"{field}__gte": day_starts(start)})
        if end:
            found = found.filter(**{f"{field}__lt": day_starts(end + timedelta(days=1))})
    return found


def parse_day(value: str):
    """A YYYY-MM-DD from a query string, or None when it is not one."""
    from datetime import date

    try:
        return date.fromisoformat(value) if value else None
    except ValueError:
        return None


def timeline(run: Run, *, first_seq: int = 1, after: int | None = None,
             before: int | None = None, newest_first: bool = False,
             limit: int | None = None) -> list[Checkpoint]:
    """A run's checkpoints from `first_seq` (and after / before a seq), oldest first or
    newest first, at most `limit` of them, each with its step's `step_key`."""
    found = run.checkpoints.filter(seq__gte=first_seq)
    if after is not None:
        found = found.filter(seq__gt=after)
    if before is not None:
        found = found.filter(seq__lt=before)
    found = (found.annotate(step_key=Coalesce(F("step__key"), Value("")))
             .order_by("-seq" if newest_first else "seq"))
    return list(found[:limit] if limit is not None else found)


def chain_warning(run: Run, checkpoints=None, approvals=None) -> str:
    """What a person is told when the run's latest record does not verify ("" when it
    does): the checkpoints and decisions a page already holds, else the latest 50 read."""
    if checkpoints is None:
        checkpoints = list(reversed(run.checkpoints.order_by("-seq")[:50]))
    if approvals is None:
        approvals = list(Approval.objects.filter(step__run=run))
    rows = [{**{name: getattr(c, name) for name in chain.FIELDS}, "prev_hash": c.prev_hash,
             "hash": c.hash} for c in checkpoints]
    decisions = [{name: getattr(a, name) for name in chain.DECISION_FIELDS}
                 for a in approvals]
    problem = chain.window_problem(rows, run.chain_head, decisions)
    return (f"This run's record does not verify: {problem}. It was changed behind "
            "Tollgate's back; what the page shows may not be what happened." if problem else "")


def timeline_for_page(run: Run, *, first_seq: int = 1,
                      before: int | None = None) -> list[Checkpoint]:
    """The timeline with what the run page shows of each checkpoint worked out here, once:
    a template filter per field of hundreds of checkpoints was most of the page's time."""
    from django.utils import timezone

    entries = timeline(run, first_seq=first_seq, before=before)
    for c in entries:
        at = timezone.localtime(c.at)
        c.iso, c.clock = at.isoformat(), at.strftime("%d %b %H:%M:%S %Z")
        c.kind_label, c.run_status_label = label(c.kind), label(c.run_status)
        c.step_status_label = label(c.step_status)
        evidence = c.evidence if isinstance(c.evidence, dict) else {}
        c.stdout, c.stderr = evidence.get("stdout"), evidence.get("stderr")
        c.exit_code = evidence.get("exit_code")
        rest = {k: v for k, v in evidence.items() if k not in ("stdout", "stderr")}
        c.details = pretty_json(rest) if rest else ""
        c.patch = pretty_json(c.state_patch) if c.state_patch else ""
    return entries


def resume_state(run) -> dict:
    """Where a run stands and what would move it on, for scripts and agents.

    The move is the engine's own `next_move`, the rule behind the run's next action.
    """
    run_id = run.pk if isinstance(run, Run) else run
    run = Run.objects.filter(pk=run_id).first() if str(run_id).isdigit() else None
    if run is None:
        raise NotFound(f"Run {run_id} does not exist.")

    def answer(state, can, step=None, message=""):
        return {"resume_state": state, "can_resume": can,
                "next_step": step.key if step else None, "message": message}

    if run.status in (RunStatus.COMPLETED, RunStatus.CANCELLED):
        return answer(run.status, False, None, f"Run {run.pk} is {run.status}.")
    steps = list(run.steps.order_by("index"))
    ready = ready_steps(run, steps)
    move, step = next_move(steps, ready[0] if ready else None)
    if move == "retry_available":
        return answer(move, True, step, f"{step.title} failed ({step.last_summary or 'no '
                      'reason given'}); retry it to resume the run.")
    if move == "waiting_approval":
        count = Approval.objects.filter(step=step, attempt=step.attempt,
                                        decision=Decision.APPROVE).count()
        return answer(move, False, step, f"{step.title} waits for "
                      f"{step.approval_required - count} more approval(s) from the "
                      f"{step.approval_group} group.")
    if move == "running":
        return answer(move, False, step, f"{step.title} is running (attempt {step.attempt}).")
    if move == "retrying":
        return answer("running", False, step,
                      f"{step.title} retries at {step.retry_after:%Y-%m-%d %H:%M:%S}.")
    if move == "blocked":
        return answer(move, True, step, f"{step.title} is blocked: "
                      f"{step.last_summary or 'no reason given'}.")
    if move == "awaiting_report":
        return answer(move, True, step, f"{step.title} waits for a report: POST "
                      f"/api/runs/{run.pk}/transition with step {step.key!r}.")
    if move == "ready":
        return answer(move, True, step, f"{step.title} is ready to start.")
    return answer(run.status, False, None, f"Run {run.pk} is {run.status}.")


def active_specs(status: str = SpecStatus.ACTIVE, limit: int | None = None) -> list[dict]:
    """Spec versions in a status (active by default: one per name; "archived"; or "" for
    every version), by name and newest version first, with how many versions and runs each
    name has (three queries)."""
    chosen = WorkflowSpec.objects.order_by("name", "-version")
    if status:
        chosen = chosen.filter(status=status)
    active = list(chosen[:limit] if limit is not None else chosen)
    names = [spec.name for spec in active]
    versions = dict(WorkflowSpec.objects.filter(name__in=names).values_list("name")
                    .annotate(n=Count("pk")).order_by())
    runs_by_name = dict(Run.objects.filter(spec_name__in=names).values_list("spec_name")
                        .annotate(n=Count("pk")).order_by())
    return [{"name": spec.name, "version": spec.version, "status": spec.status,
             "description": spec.description, "versions": versions.get(spec.name, 0),
             "runs": runs_by_name.get(spec.name, 0)} for spec in active]


def spec_detail(name: str, *, reveal: bool = False) -> dict | None:
    """A spec's versions, newest first, each with its definition and how many runs it has.
    Inline env values are masked unless `reveal` (for those who may change specs)."""
    versions = list(WorkflowSpec.objects.filter(name=name).annotate(run_count=Count("runs"))
                    .order_by("-version"))
    if not versions:
        return None
    active = next((v.version for v in versions if v.status == SpecStatus.ACTIVE), None)
    return {"name": name, "active_version": active, "versions": [
        {"version": v.version, "status": v.status, "created_at": v.created_at,
         "runs": v.run_count, "definition": v.definition if reveal else masked(v.definition)}
        for v in versions]}


TIMELINE_COLUMNS = ["seq", "at", "kind", "step", "actor", "run_status", "step_status",
                    "label", "summary", "evidence", "state_patch", "state", "step_id",
                    "actor_id", "prev_hash", "hash"]
DECISION_COLUMNS = ["at", "run", "run_title", "step", "step_title", "attempt", "user",
                    "decision", "group", "comment", "values", "waited_seconds", "channel",
                    "chat_identity", "for_user", "rule", "signature_meaning", "signer_name",
                    "signature_method", "signature_digest"]


def run_audit(run: Run) -> dict:
    """A run's timeline (each checkpoint with every field it has, and the shared state as
    it stood after it) and decisions, as plain values for JSON and CSV."""
    checkpoints = list(timeline(run))
    timeline_rows = [{"seq": c.seq, "at": c.at.isoformat(), "kind": c.kind,
                      "step": c.step_key or None, "actor": c.actor_name,
                      "run_status": c.run_status, "step_status": c.step_status,
                      "summary": c.summary, "evidence": c.evidence,
                      "state_patch": c.state_patch, "label": c.label,
                      # What the audit chain hashes besides: scripts/verify-audit-export.
                      "step_id": c.step_id, "actor_id": c.actor_id,
                      "prev_hash": c.prev_hash, "hash": c.hash, "state": state}
                     for c, state in zip(checkpoints, states_after(checkpoints), strict=True)]
    return {"run": run.pk, "title": run.title, "spec": run.spec_name,
            "chain_head": run.chain_head, "timeline": timeline_rows,
            "decisions": list(decision_rows(Approval.objects.filter(step__run=run))),
            # Where the deployment's key signed this run's chain, and that key's public half.
            "seals": [{"seq": s.seq, "hash": s.hash, "at": s.at.isoformat(), "prev": s.prev,
                       "digest": s.digest, "signature": s.signature, "key_id": s.key_id}
                      for s in AuditSeal.objects.filter(run_id=run.pk).order_by("pk")],
            "public_key": seals.public_pem()}


def _after(state: dict, checkpoint) -> dict:
    return chain.state_after(state, checkpoint.state_patch, checkpoint.evidence)


def states_after(checkpoints):
    """The shared state as it stood after each checkpoint (in seq order, from the first)."""
    state: dict = {}
    for checkpoint in checkpoints:
        state = _after(state, checkpoint)
        yield state


def state_at(run: Run, seq: int) -> dict:
    """The run's shared state as it stood after its checkpoint `seq` (NotFound when the run
    has no such checkpoint yet)."""
    if seq < 1:
        raise InvalidInput(f"at: checkpoints are numbered from 1, got {seq}.")
    if seq > run.checkpoint_seq:
        raise NotFound(f"Run {run.pk} has checkpoints 1 to {run.checkpoint_seq}; "
                       f"there is no {seq}.")
    state: dict = {}
    for checkpoint in (Checkpoint.objects.filter(run=run, seq__lte=seq)
                       .only("seq", "state_patch", "evidence").order_by("seq")):
        state = _after(state, checkpoint)
    return state


def audit_rows(audit: dict) -> tuple[list[str], list[list]]:
    """(header, rows) of a run's audit for CSV: its checkpoints, then its decisions."""
    header = ["record", *TIMELINE_COLUMNS, "|", *DECISION_COLUMNS]
    rows = [["timeline", *[c.get(k, "") for k in TIMELINE_COLUMNS]] for c in audit["timeline"]]
    rows += [["decision", *[""] * (len(TIMELINE_COLUMNS) + 1),
              *[d[k] for k in DECISION_COLUMNS]] for d in audit["decisions"]]
    return header, rows


def decisions(start=None, end=None) -> QuerySet[Approval]:
    """Every decision in an inclusive day range, oldest first."""
    found = Approval.objects.order_by("at", "pk")
    if start:
        found = found.filter(at__date__gte=start)
    if end:
        found = found.filter(at__date__lte=end)
    return found


def decision_rows(approvals: QuerySet[Approval]):
    """Decisions as dicts, streamed from the database a chunk at a time."""
    rows = approvals.values_list("at", "step__run_id", "step__run__title", "step__key",
                                 "step__title", "attempt", "user__username", "decision",
                                 "group", "comment", "values", "waited_seconds", "channel",
                                 "chat_identity", "on_behalf_of__username", "rule__label",
                                 "signature_meaning", "signer_name", "signature_method",
                                 "signature_digest", *chain.DECISION_FIELDS)
    width = len(chain.DECISION_FIELDS)
    for row in rows.iterator(chunk_size=2000):
        (at, run_id, title, key, step_title, attempt, user, decision, group, comment, values,
         waited, channel, chat_identity, for_user, rule, *signature) = row[:-width]
        # The row as its checkpoint's digest covers it (ids, not names): verifiable offline.
        record = dict(zip(chain.DECISION_FIELDS, row[-width:], strict=True))
        record["at"] = chain.moment(record["at"])
        yield {"at": at.isoformat(), "run": run_id, "run_title": title, "step": key,
               "step_title": step_title, "attempt": attempt, "user": user,
               "decision": decision, "group": group, "comment": comment,
               "values": values or {}, "waited_seconds": waited, "channel": channel,
               "chat_identity": chat_identity, "for_user": for_user or "", "rule": rule or "",
               **dict(zip(("signature_meaning", "signer_name", "signature_method",
                           "signature_digest"), signature, strict=True)),
               "record": record}


# On SQLite, a word matched by at most this many runs is looked up in the trigram table;
# a commoner one is found by reading the runs newest first until a page is full.
FEW_MATCHES = 2_000
FTS_MATCHES = "SELECT rowid FROM run_search WHERE search_text LIKE %s LIMIT %s"


def _text_matches(text: str) -> Q:
    """Runs whose search_text contains `text`: on PostgreSQL from the column (its trigram
    index). SQLite asks its FTS5 trigram table (migration 0038) first, for text of three
    characters or more without LIKE's wildcards: a rare word is those runs, while a common
    one is left to the ordered read, which stops at the page's end."""
    if (connection.vendor == "sqlite" and len(text) >= 3
            and not any(c in text for c in "%_\\")):
        with connection.cursor() as cursor:
            cursor.execute(FTS_MATCHES, [f"%{text}%", FEW_MATCHES + 1])
            ids = [row[0] for row in cursor.fetchall()]
        if len(ids) <= FEW_MATCHES:
            return Q(pk__in=ids)
    return Q(search_text__contains=text)
