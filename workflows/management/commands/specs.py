from django.core.management.base import BaseCommand, CommandError

from workflows.reads import selectors


class Command(BaseCommand):
    help = "List the specs (the active ones unless --status says otherwise)."

    def add_arguments(self, parser):
        parser.add_argument("--status", choices=["active", "archived", "any"], default="active")
        parser.add_argument("--limit", type=int, default=None)

    def handle(self, *args, **options):
        if options["limit"] is not None and options["limit"] < 1:
            raise CommandError("--limit must be at least 1")
        status = "" if options["status"] == "any" else options["status"]
        specs = selectors.active_specs(status, options["limit"])
        self.stdout.write(f"{'NAME':<24}  {'VERSION':>7}  {'STATUS':<8}  {'VERSIONS':>8}  "
                          f"{'RUNS':>6}  DESCRIPTION")
        for spec in specs:
            self.stdout.write(f"{spec['name']:<24}  v{spec['version']:<6}  {spec['status']:<8}  "
                              f"{spec['versions']:>8}  {spec['runs']:>6}  {spec['description']}")
        if not specs:
            self.stdout.write(f"(no {options['status']} specs)" if status else "(no specs)")
