from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from workflows.models import ApiToken


class Command(BaseCommand):
    help = "Print a new API token for a user (shown once; stored hashed)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="", help="what the token is for")

    def handle(self, *args, **options):
        user = get_user_model().objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"No user named {options['username']!r}.")
        _, raw = ApiToken.objects.issue(user, options["name"] or "manage.py create_token")
        self.stdout.write(raw)
