"""Courier's exceptions, and the one place that maps PostgreSQL errors onto them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg


class CourierError(Exception):
    """An error a user can act on: a readable message, the SQLSTATE, a hint, and the input
    field at fault where the SQL API names one (its error's COLUMN, as "headers.X-Foo")."""

    def __init__(self, message: str, sqlstate: str | None = None, hint: str | None = None,
                 field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.sqlstate = sqlstate
        self.hint = hint or None
        self.field = field or None

    def one_line(self) -> str:
        """The error as one line for a terminal: message, SQLSTATE and the fix."""
        text = self.message
        if self.sqlstate:
            text += f" (SQLSTATE {self.sqlstate})"
        if self.hint:
            text += f". Hint: {self.hint}"
        return text

    def as_dict(self) -> dict[str, str | None]:
        return {
            "error": self.message,
            "sqlstate": self.sqlstate,
            "hint": self.hint,
            "kind": type(self).__name__,
        }


class DatabaseUnavailable(CourierError):
    """The database cannot be reached, or no database is configured."""


class SchemaMissing(CourierError):
    """The database is reachable but Courier's schema is not installed or is outdated."""


class InvalidInput(CourierError):
    """The database rejected a value: bad JSON, a setting out of range, a bad config."""


class NotFound(CourierError):
    """A named object (endpoint, setting, message) does not exist."""


class Conflict(CourierError):
    """The request conflicts with existing state, such as an idempotency key in use."""


class WrongState(CourierError):
    """The object exists but is not in a state that allows the operation."""


class Backpressure(CourierError):
    """The queue is at max_queue_size, or an endpoint at its max_depth; retry with backoff."""


class PermissionDenied(CourierError):
    """The connected role may not do this."""


class Contention(CourierError):
    """A transaction lost a race it may win if retried: a serialization failure or a deadlock."""


class MigrationError(CourierError):
    """The installed schema disagrees with the migrations shipped in this package."""


_BY_SQLSTATE: dict[str, type[CourierError]] = {
    "53400": Backpressure,
    "53401": Backpressure,  # an endpoint's max_depth
    "23505": Conflict,
    "42710": Conflict,
    "P0002": NotFound,
    "42704": NotFound,
    "55000": WrongState,
    "55006": WrongState,
    "25006": DatabaseUnavailable,  # read_only_sql_transaction: a standby, after a failover
    "55P03": WrongState,  # an endpoint held by an uncommitted send (drop_endpoint)
    "42501": PermissionDenied,
    "42809": InvalidInput,  # wrong_object_type: a push endpoint's name where a pull topic's belongs
    "0A000": InvalidInput,  # feature_not_supported: a kafka endpoint
    "3F000": SchemaMissing,
    "42883": SchemaMissing,
    "42P01": SchemaMissing,
}

_BY_CLASS: dict[str, type[CourierError]] = {
    "08": DatabaseUnavailable,  # connection exceptions
    "22": InvalidInput,  # data exceptions
    "23": InvalidInput,  # integrity constraint violations
    "28": DatabaseUnavailable,  # invalid authorization: the server's own login refused
    "3D": DatabaseUnavailable,  # the database does not exist
    "40": Contention,  # serialization failure, deadlock
    "53": DatabaseUnavailable,  # insufficient resources: disk full, out of memory, too many connections
    "54": InvalidInput,  # program limits exceeded
    "55": WrongState,  # object not in prerequisite state
    "57": DatabaseUnavailable,  # operator intervention: shutdown, statement timeout, cancelled
    "58": DatabaseUnavailable,  # system errors (I/O)
}
"""What each SQLSTATE the SQL API raises, or PostgreSQL raises under it, means to a caller.
What is left (XX internal errors, P0001/P0003/P0004, other 42xxx) is a bug, not the input."""

_SCHEMA_HINT = "Install or upgrade the schema with `courier migrate`"


def from_psycopg(error: psycopg.Error) -> CourierError:
    """Translate a driver error into the matching CourierError."""
    sqlstate = error.sqlstate
    diag = error.diag
    message = (diag.message_primary or str(error) or type(error).__name__).strip()
    # The SQL API's own errors name the input at fault as their COLUMN; PostgreSQL's name a table's.
    field = diag.column_name if message.startswith("[courier] ") else None
    message = message.removeprefix("[courier] ")
    hint = diag.message_hint
    if sqlstate is None and isinstance(error, psycopg.OperationalError):
        # libpq spreads one failure over several lines (server address, reason, advice).
        reason = "; ".join(" ".join(line.split()) for line in str(error).splitlines() if line.strip())
        return DatabaseUnavailable(
            f"cannot connect to PostgreSQL: {reason or 'connection failed'}",
            hint="Check --dsn / COURIER_DSN / DATABASE_URL, or start the embedded database "
            "with `courier db start`",
        )
    if sqlstate is None and isinstance(error, psycopg.DataError):
        # psycopg refused to send a value (a NUL character in text): the caller's input.
        return InvalidInput(message)
    cls = _BY_SQLSTATE.get(sqlstate or "") or _BY_CLASS.get((sqlstate or "")[:2], CourierError)
    if cls is SchemaMissing and "courier" in message:
        hint = _SCHEMA_HINT  # PostgreSQL's own hint (add explicit casts) misleads here
    elif cls is SchemaMissing:
        cls = CourierError
    return cls(message, sqlstate, hint, field)


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """Re-raise psycopg errors inside the block as CourierError subclasses."""
    try:
        yield
    except psycopg.Error as error:
        raise from_psycopg(error) from error
