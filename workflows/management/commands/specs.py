from django.core.management.base import BaseCommand

from workflows import selectors


class Command(BaseCommand):
    help = "List the active specs, with their versions and runs."

    def handle(self, *args, **options):
        specs = selectors.active_specs()
        self.stdout.write(f"{'NAME':<24}  {'ACTIVE':>6}  {'VERSIONS':>8}  {'RUNS':>6}  DESCRIPTION")
        for spec in specs:
            self.stdout.write(f"{spec['name']:<24}  v{spec['version']:<5}  {spec['versions']:>8}  "
                              f"{spec['runs']:>6}  {spec['description']}")
        if not specs:
            self.stdout.write("(no active specs)")
