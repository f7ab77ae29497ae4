import os
import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from workflows.ops import retention


class Command(BaseCommand):
    help = ("Export the runs that ended more than DAYS ago (with their checkpoints and "
            "decisions, as JSON lines in the audit export's shape), then delete them. Open "
            "runs are never touched.")

    def add_arguments(self, parser):
        parser.add_argument("--older-than", type=float, required=True, metavar="DAYS")
        parser.add_argument("--out", metavar="FILE", default="",
                            help="where the export goes (appended to; default: "
                                 "var/pruned-runs-<date>.jsonl)")
        parser.add_argument("--batch", type=int, default=200,
                            help="runs per transaction (default 200)")
        parser.add_argument("--dry-run", action="store_true",
                            help="only say how many runs would go")

    def handle(self, *args, **options):
        from django.conf import settings
        from django.utils import timezone

        days = options["older_than"]
        if not days >= 0:
            raise CommandError("--older-than: give a number of days, 0 or more.")
        if options["batch"] < 1:
            raise CommandError("--batch: 1 or more.")
        if options["dry_run"]:
            count = retention.finished_runs(days).count()
            self.stdout.write(f"{count} finished run(s) ended more than {days:g} days ago.")
            return
        path = Path(options["out"] or settings.VAR_DIR
                    / f"pruned-runs-{timezone.now():%Y-%m-%d}.jsonl")
        path.parent.mkdir(parents=True, exist_ok=True)
        # The export holds the runs' params, state and outputs: its owner's alone.
        descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.fchmod(descriptor, 0o600)
        with os.fdopen(descriptor, "a") as out:
            deleted = retention.prune_runs(days, out, batch=options["batch"])
        self.stdout.write(f"Exported and deleted {deleted} run(s); the export is in {path}.")
        if deleted == 0:
            print("(nothing to prune)", file=sys.stderr)
