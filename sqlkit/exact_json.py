"""JSON whose numbers keep the value they were written with, as PostgreSQL's jsonb keeps them.

jsonb stores a number as numeric, exactly. Python's reader turns a number with more digits than
a float holds into the nearest float (12345678901234567.89 became 12345678901234568), orjson's
does that to an integer beyond 64 bits as well, and orjson cannot write such an integer at all:
a producer's message was stored with another number than it sent, and a consumer's dequeue of
it failed. Here such a number is read as a JsonNumber, which keeps its text, and is written
back verbatim. Every other number reads as Python's int or float, as before."""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import orjson
from psycopg.abc import AdaptContext
from psycopg.types.json import Jsonb, set_json_loads

INT64_LOW, UINT64_HIGH = -(2**63), 2**64 - 1
"""The integers orjson reads and writes exactly."""


@dataclass(frozen=True, slots=True)
class JsonNumber:
    """A JSON number no Python float or 64-bit integer holds exactly, kept as its text."""

    text: str

    def __float__(self) -> float:
        return float(self.text)

    def __str__(self) -> str:
        return self.text


class NotJsonNumber(ValueError):
    """NaN, Infinity or -Infinity: Python's reader takes them, JSON and jsonb do not."""


def _refuse_constant(name: str) -> Any:
    raise NotJsonNumber(f"{name} is not a JSON number")


def _integer(text: str) -> int | JsonNumber:
    if len(text) < 19:
        return int(text)
    number = int(text) if len(text) <= 4300 else None  # Python refuses to read longer ones
    return number if number is not None and INT64_LOW <= number <= UINT64_HIGH else JsonNumber(text)


def _fraction(text: str) -> float | JsonNumber:
    number = float(text)
    if math.isfinite(number) and Decimal(repr(number)) == Decimal(text):
        return number
    return JsonNumber(text)


def loads(text: str | bytes) -> Any:
    """Python's JSON reader, with numbers kept exactly; raises NotJsonNumber for NaN and the
    infinities, and ValueError (json.JSONDecodeError) for text that is not JSON. Bytes must be
    UTF-8 (RFC 8259): Python's reader would take the UTF-8 spelling of a lone surrogate
    (b"\\xed\\xb0\\x80") as that surrogate, which PostgreSQL cannot store (UnicodeDecodeError, a
    ValueError, instead)."""
    if isinstance(text, bytes):
        text = text.decode()
    return json.loads(text, parse_int=_integer, parse_float=_fraction, parse_constant=_refuse_constant)


def fast_loads(raw: bytes) -> Any:
    """loads() at orjson's speed where that is exact. orjson reads every number it cannot hold
    exactly as a float (or refuses it), so a document with no float in it, as orjson read it, is
    what loads() would have made; one with a float is read again by loads(). Raises ValueError
    for text that is not JSON, or that holds NaN or an infinity."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return loads(raw)  # 1e400 is JSON, but not a double; anything else fails here too
    return loads(raw) if _holds(value, float) else value


def _holds(value: Any, kinds: type | tuple[type, ...]) -> bool:
    """Whether a value of one of `kinds` is anywhere in the JSON document `value`."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, kinds):
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def unstorable(value: Any, where: str = "") -> tuple[str, str] | None:
    """The first string (or object key) in `value` that PostgreSQL cannot store, as (where it
    is, why), or None. Text and jsonb refuse the NUL character, and a lone surrogate (what Python
    makes of bytes that are not UTF-8, and of an unpaired \\ud83d escape) is not UTF-8: psycopg
    failed to send either with a traceback, or jsonb refused it naming nothing."""
    if isinstance(value, str):
        if "\x00" in value:
            return where, "holds a NUL character (\\u0000), which PostgreSQL cannot store"
        if not value.isascii():
            try:
                value.encode()
            except UnicodeEncodeError:
                return where, "is not UTF-8 text (it holds half of a surrogate pair)"
    elif isinstance(value, dict):
        for key, item in value.items():
            named = f"{where}.{key[:64]}" if where else key[:64]
            found = unstorable(key, named) or unstorable(item, named)
            if found:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = unstorable(item, f"{where}[{index}]")
            if found:
                return found
    return None


def _verbatim(value: Any) -> orjson.Fragment:
    if isinstance(value, JsonNumber):
        return orjson.Fragment(value.text)
    if isinstance(value, Decimal) and value.is_finite():
        return orjson.Fragment(str(value))
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def dumps(value: Any) -> str:
    """JSON text of `value`: Python's writer, as psycopg's own, for plain Python values (NaN
    left for PostgreSQL to refuse); orjson where JsonNumbers or Decimals need writing verbatim."""
    try:
        return json.dumps(value)
    except TypeError:
        return orjson.dumps(value, default=_verbatim,
                            option=orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATACLASS).decode()


def jsonb(value: Any) -> Jsonb:
    """A jsonb parameter of `value`, its JsonNumbers and Decimals written exactly. A document
    with neither is written by the dumps psycopg is set to use (set_json_dumps), as before."""
    return Jsonb(value, dumps=dumps) if _holds(value, (JsonNumber, Decimal)) else Jsonb(value)


def fragment(text: str | None) -> orjson.Fragment | None:
    """JSON text from the database (a jsonb column cast to text), to be put into an orjson
    answer as it is: never parsed, so never rounded."""
    return None if text is None else orjson.Fragment(text)


def _whole(text: str) -> int | JsonNumber:
    return int(text) if len(text) <= 4300 else JsonNumber(text)


def stored_loads(raw: str | bytes) -> Any:
    """A stored json or jsonb value as Python's reader makes it, but with a fraction no float
    holds as a JsonNumber, not the nearest float; integers stay Python's (exact at any size),
    but for one Python refuses to read (over 4,300 digits), a JsonNumber too."""
    return json.loads(raw, parse_int=_whole, parse_float=_fraction)


def read_exactly(context: AdaptContext) -> None:
    """Make `context` (a cursor or connection) read json and jsonb columns with stored_loads,
    for the paths that show a stored payload (a message's or DLQ entry's detail, a dequeue's
    answer): psycopg's own reader turns 0.1000000000000000055511151231257827 into 0.1."""
    set_json_loads(stored_loads, context=context)


def holds_exact_numbers(value: Any) -> bool:
    """Whether a JsonNumber is anywhere in `value`."""
    return _holds(value, JsonNumber)


def dumps_like(value: Any, dump: Callable[..., str] = json.dumps, **options: Any) -> str:
    """dump(value, **options) (json.dumps' spacing, indent and escaping, say) with every
    JsonNumber in `value` written as its text, unquoted: the way to print a value read with
    read_exactly() as any other, never rounded."""
    if not _holds(value, JsonNumber):
        return dump(value, **options)
    marker = f"courier-exact-number-{uuid.uuid4().hex}-"
    numbers: list[str] = []

    def swapped(item: Any) -> Any:
        if isinstance(item, JsonNumber):
            numbers.append(item.text)
            return f"{marker}{len(numbers) - 1}"
        if isinstance(item, dict):
            return {key: swapped(inner) for key, inner in item.items()}
        if isinstance(item, list | tuple):
            return [swapped(inner) for inner in item]
        return item

    text = dump(swapped(value), **options)
    return re.sub(f'"{marker}([0-9]+)"', lambda found: numbers[int(found[1])], text)
