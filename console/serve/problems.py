"""Errors as the API answers them: a JSON body {"error": code, "message": ..., "field": ...}
with the status a client acts on, and never a stack trace."""

from __future__ import annotations

from aiohttp import web

from sqlkit.errors import (
    Backpressure,
    Conflict,
    Contention,
    CourierError,
    DatabaseUnavailable,
    InvalidInput,
    NotFound,
    PermissionDenied,
    SchemaMissing,
    WrongState,
)

RETRY_AFTER_SECONDS = 1


class ApiError(Exception):
    """An answer other than success: the middleware turns it into a JSON response."""

    def __init__(self, status: int, error: str, message: str, *, field: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"error": error, "message": message, **({"field": field} if field else {})}
        self.headers = headers or {}

    def response(self) -> web.Response:
        return web.json_response(self.body, status=self.status, headers=self.headers)


def bad_request(field: str, message: str) -> ApiError:
    """Input refused where it enters, naming the field."""
    return ApiError(400, "invalid", f"{field}: {message}", field=field)


FIELD_BY_SQLSTATE = {"42809": "topic"}
"""The field a refusal is about when the SQL API's error does not name one (its COLUMN):
42809, a push endpoint's name given where a pull topic's belongs (enqueue, dequeue, topic configs)."""


def from_courier_error(error: CourierError) -> ApiError:
    """The database's refusal as an HTTP status, naming the field where the SQL API does; its
    message is the SQL API's own (no internals). Every SQLSTATE the API raises is a 4xx, or a
    503 when the database cannot answer now; a 500 is left for a bug (XX000, an unexpected 42xxx)."""
    message = error.message
    field = error.field or FIELD_BY_SQLSTATE.get(error.sqlstate or "")
    if error.sqlstate == "54000":
        return ApiError(413, "payload_too_large", message, field=field)
    if isinstance(error, Backpressure):
        return ApiError(429, "full", message, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
    if isinstance(error, NotFound):
        return ApiError(404, "not_found", message, field=field)
    if isinstance(error, Conflict):
        return ApiError(409, "conflict", message, field=field)
    if isinstance(error, WrongState):
        return ApiError(409, "wrong_state", message, field=field)
    if isinstance(error, PermissionDenied):
        return ApiError(403, "forbidden", message)
    if isinstance(error, InvalidInput):
        return ApiError(400, "invalid", message, field=field)
    if isinstance(error, Contention):
        return ApiError(503, "contention", "the request lost a race in the database; retry it",
                        headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
    if isinstance(error, DatabaseUnavailable | SchemaMissing):
        return ApiError(503, "unavailable", "the database is not available",
                        headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
    return ApiError(500, "internal", "the request failed; the server's log says why")
