"""Hand-written SQL for the engine's statements, with Django's own conversions both ways.

A transition runs a handful of statements; building each through the ORM cost more than the
database did. Here a statement's text is built once per shape and cached, rows become model
instances through the fields' own converters (`from_db`), and values are prepared by the
fields (`get_db_prep_save`), so what is read and written is exactly what the ORM would do.

On PostgreSQL, a transaction's writes go out as one statement (data-modifying `WITH`), so a
transition is a read, a write and the commit: three round trips whatever it changes.
"""

from __future__ import annotations

import datetime
import functools
import json
from collections.abc import Iterable, Sequence

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections, models
from django.db.models import Model, Q
from django.db.models.base import ModelState
from django.db.models.sql import Query


def qn(name: str) -> str:
    return connection.ops.quote_name(name)


def is_postgres() -> bool:
    return connection.vendor == "postgresql"


# psycopg prepares a statement the second time a connection runs it; not behind a pooler
# that cannot keep prepared statements (TOLLGATE_PGBOUNCER, or TOLLGATE_PG_PREPARE=0).
def prepare_threshold() -> int | None:
    return 1 if settings.TOLLGATE_PG_PREPARE else None


def cursor():
    """A cursor for the engine's statements, straight on the driver: the engine's statements
    are few and fixed, and Django's cursor wrapper cost more than SQLite ran them in. Errors
    still become Django's; with an execute wrapper installed or queries logged (the debug
    toolbar, tests counting queries) Django's own cursor is used, so nothing goes unseen.

    On PostgreSQL it binds parameters on the server, so psycopg prepares a statement run
    often: the planner's work is done once per connection, not per transition."""
    db = connections[DEFAULT_DB_ALIAS]
    db.ensure_connection()
    if db.vendor == "postgresql":
        import psycopg

        # Django turns preparing off for poolers' sake; only these server-bound cursors do.
        db.connection.prepare_threshold = prepare_threshold()
        if db.execute_wrappers or db.queries_logged:
            return db._prepare_cursor(psycopg.Cursor(db.connection))
        # $1 placeholders, converted once per statement: psycopg parses a long statement's
        # %s placeholders on every call.
        return EngineCursor(db, psycopg.RawCursor(db.connection), _dollars)
    if db.execute_wrappers or db.queries_logged:
        return db.cursor()
    return EngineCursor(db, db.connection.cursor(), _qmark)


@functools.lru_cache(maxsize=512)
def _qmark(sql: str) -> str:
    return sql.replace("%s", "?")


@functools.lru_cache(maxsize=512)
def _dollars(sql: str) -> str:
    parts = sql.split("%s")
    return "".join(part + (f"${i + 1}" if i < len(parts) - 1 else "")
                   for i, part in enumerate(parts))


class EngineCursor:
    """The driver's cursor, raising Django's database errors."""

    def __init__(self, db, raw, convert):
        self.db, self.raw, self.convert = db, raw, convert

    def execute(self, sql: str, params=()):
        with self.db.wrap_database_errors:
            self.raw.execute(self.convert(sql), params)
        return self

    def fetchone(self):
        with self.db.wrap_database_errors:
            return self.raw.fetchone()

    def fetchall(self):
        with self.db.wrap_database_errors:
            return self.raw.fetchall()

    @property
    def rowcount(self) -> int:
        return self.raw.rowcount

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.raw.close()


def in_list(expression: str, subquery: str, negate: bool = False) -> str:
    """`expression` (NOT) IN the rows of an uncorrelated subquery, in the form each planner
    turns into index lookups (PostgreSQL: an array computed once)."""
    if is_postgres():
        return f"{expression} {'<> ALL' if negate else '= ANY'}(ARRAY({subquery}))"
    return f"{expression} {'NOT IN' if negate else 'IN'} ({subquery})"


class Table:
    """One model's table: its columns for SELECT, UPDATE and INSERT, converted as Django does.

    Statement texts are cached by shape; values go through the fields' own preparation and
    conversion, with the thread's connection looked up once per call."""

    def __init__(self, model: type[Model], *, skip: Sequence[str] = ()):
        self.model = model
        self.table = model._meta.db_table
        self.fields = [f for f in model._meta.concrete_fields if f.attname not in skip]
        self.attnames = [f.attname for f in self.fields]
        self.by_attname = {f.attname: f for f in model._meta.concrete_fields}
        self._texts: dict[tuple, str] = {}

    @functools.cached_property
    def name(self) -> str:
        return qn(self.table)

    def column(self, attname: str) -> str:
        return qn(self.by_attname[attname].column)

    def columns(self, alias: str = "") -> str:
        prefix = f"{alias}." if alias else ""
        return ", ".join(prefix + qn(field.column) for field in self.fields)

    @functools.cached_property
    def _converters(self) -> list[tuple[int, object]]:
        """(column index, value -> Python value) for the columns that need converting."""
        found = []
        for i, field in enumerate(self.fields):
            fast = _from_db(field)
            if fast is None:
                col = field.get_col(self.table)
                converters = (connection.ops.get_db_converters(col)
                              + col.get_db_converters(connection))
                if converters:
                    fast = functools.partial(_apply, converters, col)
            if fast is not None:
                found.append((i, fast))
        return found

    def instance(self, row: Sequence, offset: int = 0) -> Model:
        """A model instance from a row holding this table's columns at `offset`."""
        values = list(row[offset:offset + len(self.fields)])
        for i, convert in self._converters:
            if values[i] is not None:
                values[i] = convert(values[i])
        return self._make(zip(self.attnames, values, strict=True), adding=False)

    def new(self, **values) -> Model:
        """An unsaved instance of every column's value, made as `instance` makes one."""
        return self._make(values.items(), adding=True)

    def _make(self, items, *, adding: bool) -> Model:
        # What Model.from_db makes, without running __init__ over every field.
        instance = self.model.__new__(self.model)
        instance.__dict__.update(items)
        state = instance._state = ModelState()
        state.adding, state.db = adding, DEFAULT_DB_ALIAS
        return instance

    @functools.cached_property
    def _preppers(self) -> dict:
        return {name: _to_db(field) for name, field in self.by_attname.items()}

    def _prep(self, names: Sequence[str], values: Iterable, db) -> list:
        preppers = self._preppers
        return [value if value is None else preppers[name](value, db)
                for name, value in zip(names, values, strict=True)]

    def update(self, pk, changes: dict) -> tuple[str, list]:
        """UPDATE one row's changed columns."""
        names = tuple(changes)
        text = self._texts.get(("update", names))
        if text is None:
            sets = ", ".join(f"{self.column(name)} = %s" for name in names)
            text = self._texts[("update", names)] = f"UPDATE {self.name} SET {sets} WHERE id = %s"
        return text, [*self._prep(names, changes.values(), connections[DEFAULT_DB_ALIAS]), pk]

    def update_many(self, names: Sequence[str], rows: Sequence[tuple]) -> tuple[str, list]:
        """UPDATE many rows' `names` columns from (pk, value, ...) tuples, in one statement."""
        if len(rows) == 1:
            return self.update(rows[0][0], dict(zip(names, rows[0][1:], strict=True)))
        db = connections[DEFAULT_DB_ALIAS]
        width = len(names) + 1
        values = ", ".join("(" + ", ".join(["%s"] * width) + ")" for _ in rows)
        sets = ", ".join(f"{self.column(name)} = {self._cast(f'v.column{i + 2}', name)}"
                         for i, name in enumerate(names))
        params = [p for row in rows for p in (row[0], *self._prep(names, row[1:], db))]
        return (f"UPDATE {self.name} SET {sets} FROM (VALUES {values}) AS v "
                f"WHERE {self.name}.id = {self._cast('v.column1', 'id')}", params)

    def _cast(self, sql: str, attname: str) -> str:
        # PostgreSQL types VALUES columns from their literals (a column of NULLs is text);
        # SQLite's CAST would mangle dates, and it needs no cast.
        if not is_postgres():
            return sql
        return f"CAST({sql} AS {self.by_attname[attname].cast_db_type(connection)})"

    def insert(self, names: Sequence[str], rows: Iterable[Sequence],
               returning: Sequence[str] = ()) -> tuple[str, list]:
        """INSERT rows of `names` values, optionally RETURNING columns."""
        db = connections[DEFAULT_DB_ALIAS]
        rows = list(rows)
        key = ("insert", tuple(names), len(rows), tuple(returning))
        text = self._texts.get(key)
        if text is None:
            columns = ", ".join(self.column(name) for name in names)
            values = ", ".join("(" + ", ".join(["%s"] * len(names)) + ")" for _ in rows)
            text = f"INSERT INTO {self.name} ({columns}) VALUES {values}"
            if returning:
                text += " RETURNING " + ", ".join(self.column(name) for name in returning)
            self._texts[key] = text
        return text, [p for row in rows for p in self._prep(names, row, db)]


# Converting values the way Django's fields do, without its per-value machinery. Fields of
# other types go through Django's own converters and preparation.

def _apply(converters, col, value):
    db = connections[DEFAULT_DB_ALIAS]
    for converter in converters:
        value = converter(value, col, db)
    return value


def _sqlite_datetime(value):
    if isinstance(value, datetime.datetime):
        parsed = value
    else:
        parsed = datetime.datetime.fromisoformat(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)


def _from_db(field):
    """A fast converter from the database for a field, None if none is needed, or
    NotImplemented (returned as None after the check) for Django to convert."""
    if isinstance(field, models.JSONField) and field.decoder is None:
        return json.loads
    if is_postgres():
        if isinstance(field, (models.DateTimeField, models.BooleanField, models.CharField,
                              models.TextField, models.IntegerField, models.FloatField)):
            return _noop
    else:
        if isinstance(field, models.DateTimeField):
            return _sqlite_datetime
        if isinstance(field, models.BooleanField):
            return bool
        if isinstance(field, (models.CharField, models.TextField, models.IntegerField,
                              models.FloatField)):
            return _noop
    return None


def _noop(value):
    return value


def _to_db(field):
    """value, connection -> what the database takes, as field.get_db_prep_save gives."""
    if isinstance(field, models.JSONField) and field.encoder is None:
        return lambda value, db: db.ops.adapt_json_value(value, None)
    if isinstance(field, models.DateTimeField) and not is_postgres():
        return _sqlite_datetime_to_db
    if isinstance(field, (models.CharField, models.TextField, models.IntegerField,
                          models.FloatField, models.BooleanField, models.DateTimeField)):
        return lambda value, db: value
    return lambda value, db: field.get_db_prep_save(value, db)


def _sqlite_datetime_to_db(value, db):
    if value.tzinfo is not None:
        value = value.astimezone(datetime.UTC).replace(tzinfo=None)
    return str(value)


class Slot:
    """A named parameter of a statement built once, bound at each call."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name


def bind(params: list, values: dict) -> list:
    """`params` with each Slot replaced by its value in `values`."""
    return [values[p.name] if isinstance(p, Slot) else p for p in params]


class CompiledQuery:
    """A queryset compiled to SQL once per database, then run with new values: for the
    querysets every page runs (the inbox count), whose building cost more than running.

    `build(**sentinels)` must return the queryset for sentinel values (distinct negative
    ints standing in for ids); each call binds the real values in their places."""

    def __init__(self, build, *names: str):
        self.build, self.names = build, names
        self._compiled: dict[str, tuple[str, list]] = {}

    def _sql(self) -> tuple[str, list]:
        if connection.vendor not in self._compiled:
            sentinels = {-2_000_000_011 - i: Slot(name) for i, name in enumerate(self.names)}
            queryset = self.build(**{slot.name: value for value, slot in sentinels.items()})
            text, params = queryset.values("pk").query.sql_with_params()
            self._compiled[connection.vendor] = (
                text, [sentinels.get(p, p) if type(p) is int else p for p in params])
        return self._compiled[connection.vendor]

    def count(self, **values) -> int:
        text, params = self._sql()
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT COUNT(*) FROM ({text}) AS counted", bind(params, values))
            return cursor.fetchone()[0]


def where(model: type[Model], q: Q) -> str:
    """The SQL of a Q of constants on `model`'s table (columns qualified by the table name),
    the constants written in: a planner matches a partial index only on literal values."""
    query = Query(model)
    clause = query.build_where(q)
    text, params = clause.as_sql(query.get_compiler(connection=connection), connection)
    return text % tuple(_literal(value) for value in params)


def _literal(value) -> str:
    if isinstance(value, bool):
        return ("true" if value else "false") if is_postgres() else str(int(value))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    raise TypeError(f"Not a constant for SQL: {value!r}")


def write(statements: list[tuple[str, list]], returning: tuple[str, list] | None = None):
    """Run a transaction's writes; the rows `returning` gives back, if it is given.

    PostgreSQL gets them as one statement (each write a data-modifying WITH query: they touch
    distinct rows), so a batch of writes costs one round trip; SQLite runs them in turn.
    """
    with cursor() as cursor_:
        if is_postgres() and len(statements) + bool(returning) > 1:
            parts = [f"w{i} AS ({sql})" for i, (sql, _) in enumerate(statements)]
            final_sql, final_params = returning or ("SELECT 1", [])
            params = [p for _, ps in statements for p in ps] + list(final_params)
            cursor_.execute(f"WITH {', '.join(parts)} {final_sql}", params)
            return cursor_.fetchall() if returning else None
        for sql, params in statements:
            cursor_.execute(sql, params)
        if returning:
            cursor_.execute(*returning)
            return cursor_.fetchall()
        return None
