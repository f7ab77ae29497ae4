import json

from django.core.management.base import BaseCommand, CommandError

from workflows import engine
from workflows.models import Run
from workflows.reads import selectors
from workflows.reads.selectors import resume_state


class Command(BaseCommand):
    help = ("Say where a run stands and what would move it on; with --timeline, its latest "
            "checkpoints (paged by seq, as GET /api/runs/{id}/timeline).")

    def add_arguments(self, parser):
        parser.add_argument("run", metavar="RUN")
        parser.add_argument("--json", action="store_true", help="print the API's JSON")
        parser.add_argument("--timeline", type=int, metavar="N", default=0,
                            help="also print N checkpoints, newest first")
        parser.add_argument("--oldest", action="store_true",
                            help="the timeline oldest first instead")
        parser.add_argument("--before", type=int, metavar="SEQ",
                            help="checkpoints before this seq (page back)")
        parser.add_argument("--after", type=int, metavar="SEQ",
                            help="checkpoints after this seq (page forward)")

    def handle(self, *args, **options):
        try:
            state = resume_state(options["run"])
        except engine.WorkflowError as exc:
            raise CommandError(str(exc)) from None
        if options["timeline"] < 0:
            raise CommandError("--timeline: give how many checkpoints, 1 or more.")
        checkpoints = []
        if options["timeline"]:
            checkpoints = selectors.timeline(
                Run.objects.get(pk=int(options["run"])), after=options["after"],
                before=options["before"], newest_first=not options["oldest"],
                limit=options["timeline"])
        if options["json"]:
            if options["timeline"]:
                state = {**state, "timeline": [
                    {"seq": c.seq, "kind": c.kind, "step": c.step_key or None,
                     "actor": c.actor_name, "at": c.at.isoformat(), "label": c.label,
                     "summary": c.summary} for c in checkpoints]}
            self.stdout.write(json.dumps(state))
            return
        self.stdout.write(f"{state['resume_state']}: {state['message']}")
        if state["next_step"]:
            self.stdout.write(f"next step: {state['next_step']}")
        for c in checkpoints:
            label = f" [{c.label}]" if c.label else ""
            step = f" {c.step_key}" if c.step_key else ""
            self.stdout.write(f"#{c.seq} {c.at:%Y-%m-%d %H:%M:%S} {c.kind}{step}{label} · "
                              f"{c.actor_name}: {c.summary}")
