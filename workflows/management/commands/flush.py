"""Django's flush, which on SQLite must pass the audit trail's refusal of DELETE (migration
0051): it empties every table, the trail included, as asked. PostgreSQL's flush truncates,
which the row triggers do not see."""

from django.core.management.commands import flush
from django.db import connections


class Command(flush.Command):
    def handle(self, **options):
        connection = connections[options["database"]]
        if connection.vendor != "sqlite" or not _unlockable(connection):
            return super().handle(**options)
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO tollgate_audit_unlock VALUES ('flush')")
        try:
            return super().handle(**options)
        finally:
            with connection.cursor() as cursor:
                cursor.execute("DELETE FROM tollgate_audit_unlock")


def _unlockable(connection) -> bool:
    return "tollgate_audit_unlock" in connection.introspection.table_names()
