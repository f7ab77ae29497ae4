"""Which database errors mean "the database is away", not "this request is wrong".

A restart, a cut connection or a pooler (PgBouncer) losing its server connection surface
as OperationalError or InterfaceError, and sometimes as InternalError: psycopg raises it
when a pooled connection's server died between statements ("received 2 results from
command 'COMMIT'"), and PostgreSQL's class XX is its own failure. Such an error is worth
retrying on a fresh connection (the worker's reports carry their lease token, so a repeat
is harmless) or answering with 503; IntegrityError, DataError and ProgrammingError are
not, because the same statement would fail the same way.
"""

from django.db import InterfaceError, InternalError, OperationalError

AWAY = (OperationalError, InterfaceError, InternalError)
