from django.core.management.base import BaseCommand, CommandError

from workflows.audit.verify import verify


class Command(BaseCommand):
    help = ("Check every run's audit chain: name the first run and seq whose checkpoints were "
            "changed, deleted or re-ordered behind the application's back.")

    def add_arguments(self, parser):
        parser.add_argument("runs", nargs="*", type=int, metavar="RUN",
                            help="only these runs (every run by default)")

    def handle(self, *args, **options):
        verdict = verify(options["runs"] or None)
        for run_id, seq, what in verdict.problems:
            self.stderr.write(f"run {run_id} seq {seq}: {what}")
        summary = (f"{verdict.runs} run(s), {verdict.checkpoints} checkpoint(s), "
                   f"{verdict.seals} seal(s)")
        if not verdict.ok:
            raise CommandError(f"{len(verdict.problems)} run(s) do not verify; {summary}.")
        self.stdout.write(f"Verified {summary}: every chain and seal holds.")
