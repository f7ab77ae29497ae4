import json

from django.core.management.base import BaseCommand, CommandError

from goals.models import Priority
from workflows import engine


class Command(BaseCommand):
    help = "Open a run of a workflow spec and print its id."

    def add_arguments(self, parser):
        parser.add_argument("spec", metavar="SPEC_NAME")
        parser.add_argument("--goal", metavar="GOAL_ID")
        parser.add_argument("--idempotency-key", default="", metavar="KEY")
        parser.add_argument("--state", default="", metavar="JSON",
                            help="initial shared state, a JSON object")
        parser.add_argument("--title", default="")
        parser.add_argument("--priority", choices=Priority.values,
                            help="workers serve higher priorities first (default: the goal's, "
                                 "else normal)")
        parser.add_argument("--reuse", choices=["open", "any", "none"], default="open",
                            help="a key already used: its open run (default), its latest run "
                                 "whatever its status, or refuse it")
        parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                            help="a run parameter the spec declares (repeat for more)")

    def handle(self, *args, **options):
        state = None
        if options["state"]:
            try:
                state = json.loads(options["state"])
            except json.JSONDecodeError as exc:
                raise CommandError(f"--state is not valid JSON: {exc}") from None
        params = {}
        for item in options["param"]:
            name, sep, value = item.partition("=")
            if not sep or not name:
                raise CommandError(f"--param {item!r}: give NAME=VALUE")
            params[name] = value
        try:
            opened = engine.open_run(
                options["spec"], actor="manage.py start_run", goal=options["goal"],
                idempotency_key=options["idempotency_key"], shared_state=state,
                title=options["title"], params=params if options["param"] else None,
                priority=options["priority"], reuse=options["reuse"],
            )
        except engine.WorkflowError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(str(opened.run.pk))
        if opened.reused:
            self.stderr.write(f"Reused run {opened.run.pk} for idempotency key "
                              f"{options['idempotency_key']!r}.")
