from django.core.management.base import BaseCommand, CommandError

from workflows import engine
from workflows.recovery.recover import recover_run


class Command(BaseCommand):
    help = "Check each running step of a run now and reclaim those whose worker is gone."

    def add_arguments(self, parser):
        parser.add_argument("run", type=int, metavar="RUN")

    def handle(self, *args, **options):
        try:
            verdicts = recover_run(options["run"], actor="manage.py recover")
        except engine.WorkflowError as exc:
            raise CommandError(str(exc)) from None
        for verdict in verdicts:
            self.stdout.write(f"{verdict.step}: holder {verdict.holder}; {verdict.action}")
        if not verdicts:
            self.stdout.write(f"Run {options['run']} has no running step.")
