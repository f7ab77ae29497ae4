import json

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from goals.models import Priority
from workflows import engine
from workflows.specs.storage import store_one_off
from workflows.specs.validation import SpecError


def _read_steps(path: str) -> list:
    """A JSON list of steps, or a spec file whose steps are taken."""
    try:
        with open(path) as source:
            data = json.load(source)
    except (OSError, json.JSONDecodeError) as exc:
        raise CommandError(f"--steps {path}: {exc}") from None
    return data.get("steps") if isinstance(data, dict) else data


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
        parser.add_argument("--next-action", default="", metavar="TEXT",
                            help="what should happen next, in your words")
        parser.add_argument("--kind", default="", help="what sort of run this is")
        parser.add_argument("--ref", default="", metavar="REF",
                            help="an outside reference (a ticket, a session id) to find it by")
        parser.add_argument("--owner", default="", metavar="USERNAME",
                            help="open it for this person: its requester (four-eyes keeps "
                                 "them from deciding it)")
        parser.add_argument("--steps", default="", metavar="FILE",
                            help="inline steps (a JSON list, or a spec file's steps): a one-off "
                                 "version of SPEC_NAME")

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
        spec = options["spec"]
        try:
            with transaction.atomic():  # inline steps are stored with the run or not at all
                if options["steps"]:
                    spec = store_one_off({"name": spec,
                                          "steps": _read_steps(options["steps"])})
                opened = engine.open_run(
                    spec, actor="manage.py start_run", goal=options["goal"],
                    idempotency_key=options["idempotency_key"], shared_state=state,
                    title=options["title"], params=params if options["param"] else None,
                    priority=options["priority"], reuse=options["reuse"],
                    next_action=options["next_action"], kind=options["kind"],
                    ref=options["ref"], owner=options["owner"] or None,
                )
        except (engine.WorkflowError, SpecError) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(str(opened.run.pk))
        if opened.reused:
            self.stderr.write(f"Reused run {opened.run.pk} for idempotency key "
                              f"{options['idempotency_key']!r}.")
