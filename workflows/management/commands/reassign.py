from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from workflows import engine


class Command(BaseCommand):
    help = ("Point a waiting gate at another group or person, with a reason (a checkpoint; "
            "the new approvers are told).")

    def add_arguments(self, parser):
        parser.add_argument("run", metavar="RUN")
        parser.add_argument("step", metavar="STEP_KEY")
        target = parser.add_mutually_exclusive_group(required=True)
        target.add_argument("--group", default="", help="the group that decides it now")
        target.add_argument("--person", default="", help="the username that decides it now")
        parser.add_argument("--reason", required=True, help="why (kept on the timeline)")
        parser.add_argument("--rule", default="",
                            help="which waiting rule, by its label, when the gate waits on "
                                 "several")
        parser.add_argument("--as", dest="actor", metavar="USERNAME", default="",
                            help="the operator the timeline names (default: the command)")

    def handle(self, *args, **options):
        actor = "manage.py reassign"
        if options["actor"]:
            actor = get_user_model().objects.filter(username=options["actor"]).first()
            if actor is None:
                raise CommandError(f"No user named {options['actor']!r}.")
        try:
            checkpoint = engine.reassign_gate(
                options["run"], options["step"], actor=actor, reason=options["reason"],
                group=options["group"], person=options["person"], rule=options["rule"])
        except engine.WorkflowError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"{checkpoint.step.title}: {checkpoint.summary}")
