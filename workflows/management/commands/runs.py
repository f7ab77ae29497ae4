from django.core.management.base import BaseCommand, CommandError

from goals.models import Goal
from workflows.models import RunStatus, WorkflowSpec
from workflows.reads import selectors


class Command(BaseCommand):
    help = "List runs, newest first."

    def add_arguments(self, parser):
        parser.add_argument("--status", choices=RunStatus.values, action="append",
                            help="one status (repeat for several)")
        parser.add_argument("--open", action="store_true", help="only runs not yet ended")
        parser.add_argument("--ref", default="", help="an outside reference, exactly")
        parser.add_argument("--kind", default="")
        parser.add_argument("--spec", metavar="SPEC_NAME")
        parser.add_argument("--goal", type=int, metavar="GOAL_ID")
        parser.add_argument("--parent", type=int, metavar="RUN_ID",
                            help="the runs this run's steps opened")
        parser.add_argument("--schedule", type=int, metavar="SCHEDULE_ID",
                            help="the runs this schedule started")
        parser.add_argument("--sort", choices=["created", "activity"], default="created",
                            help="newest opened first (default), or latest activity first")
        parser.add_argument("--limit", type=int, default=50)

    def handle(self, *args, **options):
        if options["spec"] and not WorkflowSpec.objects.filter(name=options["spec"]).exists():
            raise CommandError(f"No spec named {options['spec']!r}.")
        if options["goal"] is not None and not Goal.objects.filter(pk=options["goal"]).exists():
            raise CommandError(f"Goal {options['goal']} does not exist.")
        runs = selectors.runs(status=options["status"] or [], spec=options["spec"] or "",
                              goal=options["goal"], open_only=options["open"],
                              ref=options["ref"], kind=options["kind"],
                              parent=options["parent"], schedule=options["schedule"],
                              sort=options["sort"])
        rows = list(runs[: max(options["limit"], 1)])
        self.stdout.write(f"{'ID':>6}  {'STATUS':<16}  {'SPEC':<20}  {'CREATED':<16}  "
                          f"{'ACTIVE':<16}  NEXT")
        for run in rows:
            self.stdout.write(f"{run.pk:>6}  {run.status:<16}  {str(run.spec):<20}  "
                              f"{run.created_at:%Y-%m-%d %H:%M}  "
                              f"{run.updated_at:%Y-%m-%d %H:%M}  {run.what_next}")
        if not rows:
            self.stdout.write("(no runs)")
