"""Request bodies checked where they enter: a JSON object of known fields, each of its type and
range, no deeper than the SQL API accepts; an error names the field."""

from __future__ import annotations

import asyncio
import base64
import binascii
import math
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any

from aiohttp import web

from sqlkit import exact_json
from sqlkit.exact_json import JsonNumber

from .problems import ApiError, bad_request

MAX_DEPTH = 32
"""Nesting a body may have, as metadata may in the SQL API."""

BODY_SECONDS = 15.0
"""How long a client may take to send a body, by default (`courier serve --client-timeout`): a
slow client is answered 408 and holds nothing longer."""
BODY_TIMEOUT = web.AppKey("body_timeout", float)

Check = Callable[[str, Any], Any]
"""A field's checker: (field name, JSON value) to the checked value, or a 400 naming the field.
Each carries `schema`, the field's JSON Schema, from which /api/openapi.json is made."""


def described(schema: dict[str, Any]) -> Callable[[Check], Check]:
    """Attach the JSON Schema of the values a checker accepts."""
    def attach(check: Check) -> Check:
        check.schema = schema  # type: ignore[attr-defined]
        return check
    return attach


async def json_object(request: web.Request, fields: dict[str, Callable[[str, Any], Any]],
                      required: tuple[str, ...] = ()) -> dict[str, Any]:
    """The body as {field: checked value} for the fields given (absent or null: None)."""
    raw = await _read(request)
    try:
        body = exact_json.fast_loads(raw or b"{}")
    except (ValueError, RecursionError):
        raise ApiError(400, "invalid", "the body is not valid JSON") from None
    _check_depth(body)
    if MAY_NOT_STORE.search(raw) and (found := exact_json.unstorable(body)):
        raise bad_request(found[0] or "body", found[1])
    return checked_object("", body, fields, required)


async def discard_body(request: web.Request) -> None:
    """Read and drop the body of a route that takes none. Left unread, aiohttp drains it after
    the answer, and a body that cannot be decoded (a corrupt Content-Encoding) failed there
    with a traceback in the log; read here, it is a 400 like any other bad body."""
    if request.body_exists:
        await _read(request)


async def _read(request: web.Request) -> bytes:
    limit = request.app[BODY_TIMEOUT]
    try:
        if request.content.is_eof():  # all of it has arrived (a small body comes with the headers): no wait to time
            return await request.read()
        async with asyncio.timeout(limit):
            return await request.read()
    except TimeoutError:
        raise ApiError(408, "timeout", f"the body did not arrive within {limit:g} s") from None
    except web.HTTPRequestEntityTooLarge:
        raise ApiError(413, "payload_too_large",
                       f"the request body is larger than the server takes ({request.client_max_size} bytes; "
                       "`courier serve --max-body`)") from None
    except web.RequestPayloadError as error:
        raise unreadable_body(request, error) from None


def unreadable_body(request: web.Request, error: web.RequestPayloadError) -> ApiError:
    """A body that cannot be read to its end (a corrupt deflate, gzip or br stream, a broken
    chunked encoding): a 400 that tells the client to close the connection, since where a next
    request would begin is unknown (the parser stops at the error). The body is marked read, so
    that the server does not drain what is left after the answer: that read failed again, with
    a traceback in the log, and reset the connection before the client had read the answer."""
    request.content.feed_eof()
    reason = " ".join(str(error).split()).removeprefix("400, message: ") or "it is malformed"
    return ApiError(400, "invalid", f"the body cannot be read: {reason}", headers={"Connection": "close"})


def checked_object(where: str, item: Any, fields: dict[str, Callable[[str, Any], Any]],
                   required: tuple[str, ...] = ()) -> dict[str, Any]:
    """{field: checked value} of a JSON object (absent or null: None); `where` prefixes the
    field names errors give, as messages[3].topic."""
    if not isinstance(item, dict):
        raise bad_request(where or "body", "must be a JSON object")
    unknown = sorted(set(item) - set(fields))
    if unknown:
        raise bad_request(where + unknown[0], f"unknown field (known: {', '.join(sorted(fields))})")
    checked = {}
    for name, check in fields.items():
        value = item.get(name)
        if value is None:
            if name in required:
                raise bad_request(where + name, "required")
            checked[name] = None
        else:
            try:
                checked[name] = check(where + name, value)
            except (ValueError, TypeError, OverflowError):
                # A checker surprised by a value (int() of a digit that is not 0-9): still the input.
                raise bad_request(where + name, "is not a valid value for this field") from None
    return checked


MAY_NOT_STORE = re.compile(rb"\\u0000|\\u[dD][89a-fA-F]")
"""What a body holds, escaped, before it may hold a string PostgreSQL cannot store
(exact_json.unstorable): a NUL character, or half of a surrogate pair (\\ud83d\\ude00 is one
emoji; \\ud83d alone, or \\udc00 alone, is no character). Unescaped, neither is JSON."""


def _check_depth(value: Any) -> None:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ApiError(400, "invalid", f"the body is nested more than {MAX_DEPTH} levels deep")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)


def text(limit: int = 255) -> Callable[[str, Any], str]:
    @described({"type": "string", "minLength": 1, "maxLength": limit})
    def check(name: str, value: Any) -> str:
        if not isinstance(value, str) or not value:
            raise bad_request(name, "must be a non-empty string")
        if len(value) > limit:
            raise bad_request(name, f"must be at most {limit} characters")
        return value
    return check


@described({"type": "boolean"})
def flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise bad_request(name, "must be true or false")
    return value


def integer(low: int, high: int) -> Callable[[str, Any], int]:
    @described({"type": "integer", "minimum": low, "maximum": high})
    def check(name: str, value: Any) -> int:
        if isinstance(value, JsonNumber) and value.text.lstrip("-").isdigit():
            raise bad_request(name, f"must be between {low} and {high}, got {value}")
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad_request(name, "must be a whole number")
        if not low <= value <= high:
            raise bad_request(name, f"must be between {low} and {high}, got {value}")
        return value
    return check


def number(low: float, high: float, what: str = "a number") -> Callable[[str, Any], float]:
    """A JSON number in range, kept as given (an integer stays one)."""
    @described({"type": "number", "minimum": low, "maximum": high})
    def check(name: str, value: Any) -> float:
        if isinstance(value, JsonNumber):  # more digits than a float holds: out of range, or rounded
            if not low <= float(value) <= high:
                raise bad_request(name, f"must be between {low:g} and {high:g}, got {value}")
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise bad_request(name, f"must be {what}")
        if not low <= value <= high:
            raise bad_request(name, f"must be between {low:g} and {high:g}, got {value:g}")
        return value
    return check


def seconds(low: float, high: float) -> Callable[[str, Any], float]:
    """A number of seconds in range, as a float."""
    check = number(low, high, "a number of seconds")

    @described(check.schema)  # type: ignore[attr-defined]
    def as_float(name: str, value: Any) -> float:
        return float(check(name, value))
    return as_float


@described({"type": "string", "contentEncoding": "base64"})
def base64_bytes(name: str, value: Any) -> bytes:
    if not isinstance(value, str):
        raise bad_request(name, "must be base64-encoded bytes, as a string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(name, "is not valid base64") from None


@described({"type": "object"})
def json_map(name: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise bad_request(name, "must be a JSON object")
    return value


@described({"type": "string", "format": "date-time"})
def timestamp(name: str, value: Any) -> datetime:
    if not isinstance(value, str):
        raise bad_request(name, "must be an ISO 8601 time with a UTC offset, e.g. 2026-11-26T10:00:00Z")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise bad_request(name, "must be an ISO 8601 time with a UTC offset, e.g. 2026-11-26T10:00:00Z") from None
    if parsed.tzinfo is None:
        raise bad_request(name, "needs a UTC offset (Z or +hh:mm)")
    return parsed


def _ascii_digits(value: Any, most: int) -> bool:
    """Whether value is a string of 1 to `most` digits 0-9 (str.isdigit() alone also takes
    superscripts and other scripts' digits, which int() refuses or reads)."""
    return isinstance(value, str) and 0 < len(value) <= most and value.isascii() and value.isdigit()


@described({"type": "string", "pattern": "^[0-9]{1,18}$"})
def digits(name: str, value: Any) -> int:
    """A message id, as the API writes ids: a string of digits."""
    if not _ascii_digits(value, 18):
        raise bad_request(name, "must be a message id (digits, as a string)")
    return int(value)


HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}")
HEADER_VALUE_REFUSED = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
"""What the HTTP dispatcher's client refuses in a header value (RFC 9110: control characters
but tab, and DEL), as courier._check_headers() does at send."""


@described({"type": "object",
            "additionalProperties": {"type": "string", "pattern": "^[^\\x00-\\x08\\x0a-\\x1f\\x7f]*$"},
            "propertyNames": {"pattern": "^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}$"}})
def header_map(name: str, value: Any) -> dict[str, str]:
    """Per-message HTTP headers: a JSON object of strings, each a value HTTP can carry; an error
    names the header ("headers.X-Foo"). The rest (headers Courier sets) is courier.send's to refuse."""
    if not isinstance(value, dict):
        raise bad_request(name, "must be a JSON object of strings")
    for header, text_value in value.items():
        where = f"{name}.{header[:64]}"
        if not HEADER_NAME.fullmatch(header):
            raise bad_request(where, "is not a valid HTTP header name")
        if not isinstance(text_value, str):
            raise bad_request(where, "must be a string")
        if bad := HEADER_VALUE_REFUSED.search(text_value):
            raise bad_request(where, f"has a control character (U+{ord(bad.group()):04X}) in its value, "
                                     "which HTTP cannot carry")
    return value


def message_id(request: web.Request) -> int:
    return digits("id", request.match_info["id"])
