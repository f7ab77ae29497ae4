"""Huey's `run_huey`, refusing to start a consumer whose command steps could read the audit's
signing key (docs/evidence.md, "Decisions as evidence")."""

from django.core.management import CommandError
from huey.contrib.djhuey.management.commands import run_huey

from workflows.ops.checks import key_exposed_to_commands


class Command(run_huey.Command):
    def handle(self, *args, **options):
        if problem := key_exposed_to_commands():
            raise CommandError(problem)
        super().handle(*args, **options)
