from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = ("Serve open pages' event streams (tollgate.events) on HOST:PORT with uvicorn; "
            "pages use it when TOLLGATE_LIVE_EVENTS_URL names it.")

    def add_arguments(self, parser):
        parser.add_argument("address", nargs="?", default="127.0.0.1:8001",
                            help="HOST:PORT (default 127.0.0.1:8001)")

    def handle(self, *args, **options):
        import uvicorn

        host, _, port = options["address"].rpartition(":")
        if not host or not port.isdigit():
            raise CommandError(f"Address {options['address']!r} is not HOST:PORT.")
        uvicorn.run("tollgate.events:app", host=host, port=int(port), log_level="warning",
                    access_log=False)
