from django.core.management.base import BaseCommand, CommandError

from workflows.specs.storage import store_spec
from workflows.specs.validation import SpecError, parse_spec_file


class Command(BaseCommand):
    help = "Validate and store workflow specs (JSON or YAML files)."

    def add_arguments(self, parser):
        parser.add_argument("files", nargs="+", metavar="FILE")
        parser.add_argument("--name", default="",
                            help="store the (one) file's spec under this name instead of its own")

    def handle(self, *args, **options):
        files = options["files"]
        if options["name"] and len(files) != 1:
            raise CommandError(f"--name names one spec: give one file, not {len(files)}.")
        failed = 0
        for path in files:
            try:
                data = parse_spec_file(path)
                if options["name"] and isinstance(data, dict):
                    data = {**data, "name": options["name"]}
                spec, created = store_spec(data)
            except SpecError as exc:
                failed += 1
                self.stderr.write(f"{path}: {exc}" if not str(exc).startswith(path) else str(exc))
                continue
            self.stdout.write(f"{spec.name} v{spec.version}")
            if not created and options["verbosity"] > 1:
                self.stderr.write(f"{spec.name} is unchanged; kept v{spec.version}")
        if failed:
            raise CommandError(f"{failed} of {len(files)} spec file(s) refused; nothing stored "
                               "from those.")
