from django.core.management.base import BaseCommand, CommandError

from workflows.audit import head
from workflows.audit.verify import verify
from workflows.recovery import presence


class Command(BaseCommand):
    help = ("Check every run's audit chain: name the first run and seq whose checkpoints were "
            "changed, deleted or re-ordered behind the application's back.")

    def add_arguments(self, parser):
        parser.add_argument("runs", nargs="*", type=int, metavar="RUN",
                            help="only these runs (every run by default)")

    def handle(self, *args, **options):
        if options["runs"]:
            return self.verify_runs(options["runs"])
        # A whole check is kept as a periodic task's run: the workers page and the metrics
        # (tollgate_periodic_failed{task="verify_audit"}) say when it ran and what it found.
        with presence.periodic("verify_audit"):
            self.verify_runs(None)

    # Not `check`: BaseCommand.check is the system check every command runs first.
    def verify_runs(self, runs):
        verdict = verify(runs)
        if runs is None:  # a whole check: the seal chain is never shorter than last time
            verdict.problems += head.problems()
        for run_id, seq, what in verdict.problems:
            self.stderr.write(f"run {run_id} seq {seq}: {what}")
        summary = (f"{verdict.runs} run(s), {verdict.checkpoints} checkpoint(s), "
                   f"{verdict.decisions} decision(s)"
                   + (f" ({verdict.uncovered} recorded before decisions were chained, "
                      "not covered)" if verdict.uncovered else "") + ", "
                   f"{verdict.seals} seal(s), {verdict.timestamps} timestamp(s)")
        if not verdict.ok:
            first = verdict.problems[0]
            raise CommandError(f"{len(verdict.problems)} problem(s), the first: run {first[0]} "
                               f"seq {first[1]}: {first[2]}; {summary}.")
        if runs is None:
            head.keep()
        self.stdout.write(f"Verified {summary}: every chain, decision, seal and timestamp holds.")
