"""What every subcommand shares: --dsn and --json, the database connection, and output."""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import sys
from collections.abc import Callable
from datetime import datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

import click
import psycopg

from sqlkit import embedded
from sqlkit.connection import connect
from sqlkit.dsn import resolve_dsn
from sqlkit.errors import DatabaseUnavailable, SchemaMissing

from ..literal import LiteralConsole

# Everything printed may hold stored text: both consoles show strings literally.
console = LiteralConsole()
error_console = LiteralConsole(stderr=True)


def _remember(key: str) -> Callable[[click.Context, click.Parameter, Any], Any]:
    def callback(ctx: click.Context, _param: click.Parameter, value: Any) -> Any:
        if value is not None and value is not False:
            ctx.meta[f"courier.{key}"] = value
        return value
    return callback


def dsn_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--dsn", expose_value=False, callback=_remember("dsn"), is_eager=True,
        help="PostgreSQL connection string (default: COURIER_DSN, DATABASE_URL, PG* or the embedded database).",
    )(func)


def json_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--json", "as_json", is_flag=True, expose_value=False, callback=_remember("json"),
        is_eager=True, help="Print machine-readable JSON instead of tables.",
    )(func)


def common_options(func: Callable[..., Any]) -> Callable[..., Any]:
    return dsn_option(json_option(func))


def wants_json(ctx: click.Context | None = None) -> bool:
    ctx = ctx or click.get_current_context(silent=True)
    return bool(ctx and ctx.meta.get("courier.json"))


def database_url(ctx: click.Context | None = None) -> str:
    """The DSN to use, falling back to the running embedded database."""
    ctx = ctx or click.get_current_context()
    choice = resolve_dsn(ctx.meta.get("courier.dsn"))
    if not choice.is_embedded:
        return choice.dsn or ""
    url = embedded.url()
    if url is None:
        raise DatabaseUnavailable(
            "no database configured and the embedded PostgreSQL is not running",
            hint="Run `courier db start`, or pass --dsn / set COURIER_DSN",
        )
    return url


def require_current_schema(url: str, who: str) -> None:
    """One readable line, before anything starts, when the schema is missing or older than
    this Courier (versioned migrations or function files not applied yet)."""
    from sqlkit import migrate

    with connect(url, connect_timeout=10) as conn:
        state = migrate.status(conn)
    if state.pending:
        raise SchemaMissing(f"schema courier is at version {state.installed_version}, {who} needs "
                            f"{state.latest_version}", hint="Run `courier migrate`")
    if state.functions_pending:
        areas = ", ".join(f.area for f in state.functions_pending)
        raise SchemaMissing(f"schema courier's functions are older than {who}'s ({areas})",
                            hint="Run `courier migrate`")


def open_connection(ctx: click.Context | None = None) -> psycopg.Connection:
    return connect(database_url(ctx))


def plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: plain(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, bytes | memoryview):
        return base64.b64encode(bytes(value)).decode()
    return value


def emit(data: Any, render: Callable[[], None] | None = None) -> None:
    """Print data as JSON under --json, otherwise call render (or print data plainly)."""
    if wants_json() or render is None:
        sys.stdout.write(json.dumps(plain(data), indent=2) + "\n")
        return
    try:
        render()
    except Exception as error:
        # What a command took (a receive deletes, a dequeue leases) must reach the user even
        # if a value will not draw as a table: print it as JSON and say why.
        sys.stdout.write(json.dumps(plain(data), indent=2, default=str) + "\n")
        error_console.print(f"warning: could not draw the table ({type(error).__name__}: {error}); "
                            "printed as JSON instead", highlight=False, soft_wrap=True)


class FiniteFloatRange(click.FloatRange):
    """click.FloatRange that also refuses nan and infinity: nan passes every range check (each
    comparison is false) and then broke timedelta() and sleeps with a traceback."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


class _NotJsonNumber(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _NotJsonNumber(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise _NotJsonNumber(f"{text} is too large for a JSON number")
    return number


def parse_json(text: str, what: str) -> Any:
    """Python's reader takes NaN, Infinity and 1e400 (as inf), which PostgreSQL's jsonb then
    refused with an error that named no field; they are refused here, naming it."""
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except _NotJsonNumber as error:
        raise click.BadParameter(f"not valid JSON ({error})", param_hint=what) from None
    except json.JSONDecodeError as error:
        raise click.BadParameter(f"not valid JSON ({error.msg} at line {error.lineno} "
                                 f"column {error.colno})", param_hint=what) from None
    except RecursionError:
        raise click.BadParameter("nested too deeply to read", param_hint=what) from None


def parse_json_object(text: str, what: str) -> dict[str, Any]:
    value = parse_json(text, what)
    if not isinstance(value, dict):
        raise click.BadParameter("must be a JSON object", param_hint=what)
    return value


def when(value: datetime | None) -> str:
    return "-" if value is None else value.astimezone().strftime("%Y-%m-%d %H:%M:%S")
