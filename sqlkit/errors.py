"""Courier's exceptions, and the one place that maps PostgreSQL errors onto them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg


class CourierError(Exception):
    """An error a user can act on: a readable message, the SQLSTATE, and a hint."""

    def __init__(self, message: str, sqlstate: str | None = None, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.sqlstate = sqlstate
        self.hint = hint or None

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
    "42501": PermissionDenied,
    "3F000": SchemaMissing,
    "42883": SchemaMissing,
    "42P01": SchemaMissing,
}

_BY_CLASS: dict[str, type[CourierError]] = {
    "08": DatabaseUnavailable,
    "22": InvalidInput,
    "23": InvalidInput,
    "54": InvalidInput,
    "57": DatabaseUnavailable,
}

_SCHEMA_HINT = "Install or upgrade the schema with `courier migrate`"


def from_psycopg(error: psycopg.Error) -> CourierError:
    """Translate a driver error into the matching CourierError."""
    sqlstate = error.sqlstate
    diag = error.diag
    message = (diag.message_primary or str(error) or type(error).__name__).strip()
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
    cls = _BY_SQLSTATE.get(sqlstate or "") or _BY_CLASS.get((sqlstate or "")[:2], CourierError)
    if cls is SchemaMissing and "courier" in message:
        hint = _SCHEMA_HINT  # PostgreSQL's own hint (add explicit casts) misleads here
    elif cls is SchemaMissing:
        cls = CourierError
    return cls(message, sqlstate, hint)


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """Re-raise psycopg errors inside the block as CourierError subclasses."""
    try:
        yield
    except psycopg.Error as error:
        raise from_psycopg(error) from error
