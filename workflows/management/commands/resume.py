import json

from django.core.management.base import BaseCommand, CommandError

from workflows import engine
from workflows.selectors import resume_state


class Command(BaseCommand):
    help = "Say where a run stands and what would move it on."

    def add_arguments(self, parser):
        parser.add_argument("run", metavar="RUN")
        parser.add_argument("--json", action="store_true", help="print the API's JSON")

    def handle(self, *args, **options):
        try:
            state = resume_state(options["run"])
        except engine.WorkflowError as exc:
            raise CommandError(str(exc)) from None
        if options["json"]:
            self.stdout.write(json.dumps(state))
            return
        self.stdout.write(f"{state['resume_state']}: {state['message']}")
        if state["next_step"]:
            self.stdout.write(f"next step: {state['next_step']}")
