import json

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from workflows import engine


def _object(text: str, option: str):
    if not text:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CommandError(f"{option}: not JSON ({exc}).") from None
    if not isinstance(value, dict):
        raise CommandError(f"{option}: must be a JSON object.")
    return value


class Command(BaseCommand):
    help = ("Report progress on a wait step a script performs itself (--step), or, without a "
            "step, record a note on the run: a checkpoint that moves no status. As "
            "POST /api/runs/{id}/transition.")

    def add_arguments(self, parser):
        parser.add_argument("run", metavar="RUN")
        parser.add_argument("--step", default="", help="the wait step reported on")
        parser.add_argument("--status", default="", dest="step_status",
                            help="the step's new status (running, completed, failed, blocked)")
        parser.add_argument("--summary", default="")
        parser.add_argument("--label", default="", help="a name for this checkpoint")
        parser.add_argument("--evidence", default="", help="a JSON object")
        parser.add_argument("--state", default="", help="a JSON object: the state patch")
        parser.add_argument("--replace-state", action="store_true",
                            help="the state patch is the whole new shared state")
        parser.add_argument("--next-action", default=None)
        parser.add_argument("--blocker-reason", default="")
        parser.add_argument("--as", dest="actor", metavar="USERNAME", default="",
                            help="the person the timeline names (default: the command)")

    def handle(self, *args, **options):
        actor = "manage.py transition"
        if options["actor"]:
            actor = get_user_model().objects.filter(username=options["actor"]).first()
            if actor is None:
                raise CommandError(f"No user named {options['actor']!r}.")
        report = {"actor": actor, "summary": options["summary"], "label": options["label"],
                  "evidence": _object(options["evidence"], "--evidence"),
                  "state_patch": _object(options["state"], "--state"),
                  "next_action": options["next_action"],
                  "shared_state_mode": "replace" if options["replace_state"] else "merge"}
        try:
            if options["step"]:
                checkpoint = engine.record_transition(
                    options["run"], options["step"], step_status=options["step_status"] or None,
                    blocker_reason=options["blocker_reason"], **report)
            elif options["step_status"] or options["blocker_reason"]:
                raise CommandError("--status and --blocker-reason are a step's: give --step "
                                   "(without one, this is a note on the run).")
            else:
                checkpoint = engine.record_note(options["run"], **report)
        except engine.WorkflowError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"run {checkpoint.run_id} checkpoint {checkpoint.seq}: "
                          f"{checkpoint.summary}")
