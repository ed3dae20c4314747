"""What every subcommand shares: --dsn and --output (--json), the database connection, and output."""

from __future__ import annotations

import base64
import csv
import dataclasses
import io
import json
import math
import os
import sys
import typing
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

import click
import psycopg
from rich.console import Group
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from sqlkit import embedded, exact_json
from sqlkit.connection import connect
from sqlkit.dsn import resolve_dsn
from sqlkit.errors import DatabaseUnavailable, SchemaMissing

from ..literal import LiteralConsole, printable
from ..logs import LEVEL_VARIABLE, LEVELS

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


def _log_level(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value:  # for log_json_lines(), and for the children a command starts (they inherit it)
        os.environ[LEVEL_VARIABLE] = value.lower()


def log_level_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """--log-level (or COURIER_LOG_LEVEL) for the commands that log JSON lines."""
    return click.option(
        "--log-level", type=click.Choice(LEVELS, case_sensitive=False), envvar=LEVEL_VARIABLE,
        expose_value=False, callback=_log_level, is_eager=True, show_envvar=True,
        help="Least severe log lines printed (default: info; warning leaves only failures, circuits "
             "and retries).",
    )(func)


OUTPUTS = ("table", "tsv", "csv", "json")
"""What --output takes: table (for people), tsv (a header row, then one tab-separated row per
record: raw text, for scripts), csv (for spreadsheets: RFC 4180, formula-safe) and json."""


def _remember_output(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    chosen = ("json" if value else None) if param.name == "as_json" else value
    if chosen:
        earlier = ctx.meta.get("courier.output")
        if earlier and earlier != chosen:
            other = earlier if chosen == "json" else chosen
            raise click.UsageError(f"--json is --output json; it cannot be combined with --output {other}", ctx)
        ctx.meta["courier.output"] = chosen
    return value


def json_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """--output/-o table|tsv|json, with --json kept as the alias of --output json."""
    func = click.option(
        "-o", "--output", "output", type=click.Choice(OUTPUTS, case_sensitive=False), expose_value=False,
        callback=_remember_output, is_eager=True,
        help="table (default); tsv (a header row, then one tab-separated row per record, with tabs, newlines "
             "and backslashes escaped as \\t, \\n, \\\\; cells are raw text, for scripts: a spreadsheet may "
             "run one starting with = + - or @ as a formula); csv (for spreadsheets: quoted as RFC 4180, and a "
             "text cell starting with = + - @ is prefixed with ' so it is never run); or json.",
    )(func)
    return click.option(
        "--json", "as_json", is_flag=True, expose_value=False, callback=_remember_output,
        is_eager=True, help="Same as --output json.",
    )(func)



def common_options(func: Callable[..., Any]) -> Callable[..., Any]:
    return dsn_option(json_option(func))


def output_format(ctx: click.Context | None = None) -> str:
    """table, tsv or json: what --output (or --json) asked for."""
    ctx = ctx or click.get_current_context(silent=True)
    return str(ctx.meta.get("courier.output", "table")) if ctx else "table"


def wants_json(ctx: click.Context | None = None) -> bool:
    return output_format(ctx) == "json"


def machine_output(ctx: click.Context | None = None) -> bool:
    """True under --output json or tsv: stdout holds the data alone (no prompts, progress or notes)."""
    return output_format(ctx) != "table"


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


_EXACT_FLOAT = 2 ** 53
"""Whole floats below this are exact integers, printed as such (a count of 5.0 is 5)."""


def plain(value: Any) -> Any:
    """value as JSON's types. A whole number stays an integer: numeric columns (a topic's limits)
    arrive as Decimal and double precision ones (metrics) as float, and 5 must not print as 5.0;
    a fractional one stays a number (2.5). A number read exactly (exact_json.JsonNumber: one no
    float holds, in a stored payload) stays one: the writers here print it as stored."""
    if isinstance(value, exact_json.JsonNumber):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # Field by field, not dataclasses.asdict, which would make a JsonNumber within a payload a dict.
        return {field.name: plain(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, Decimal):
        if value.is_finite() and value == value.to_integral_value():
            return int(value)
        return float(value)
    if isinstance(value, float) and value.is_integer() and abs(value) < _EXACT_FLOAT:
        return int(value)
    if isinstance(value, bytes | memoryview):
        return base64.b64encode(bytes(value)).decode()
    return value


Columns = type | Sequence[str] | None
"""A record's column names for TSV: a dataclass, or the names; needed when a list may be empty."""


def emit(data: Any, render: Callable[[], None] | None = None, *, columns: Columns = None) -> None:
    """Print data as --output asks: JSON, TSV (see tsv()), or a table by calling render (with no
    render, JSON). columns names a list's fields for TSV's header when the list is empty."""
    chosen = output_format()
    if chosen in ("tsv", "csv"):
        sys.stdout.write(tsv(data, columns, row=csv_row if chosen == "csv" else tsv_row))
        return
    if chosen == "json" or render is None:
        sys.stdout.write(exact_json.dumps_like(plain(data), indent=2) + "\n")
        return
    try:
        render()
    except Exception as error:
        # What a command took (a receive deletes, a dequeue leases) must reach the user even
        # if a value will not draw as a table: print it as JSON and say why.
        sys.stdout.write(exact_json.dumps_like(plain(data), indent=2, default=str) + "\n")
        error_console.print(f"warning: could not draw the table ({type(error).__name__}: {error}); "
                            "printed as JSON instead", highlight=False, soft_wrap=True)


def tsv_cell(value: Any) -> str:
    """One value as a TSV field: JSON's spelling for true, false and nested values, empty for null,
    and a backslash, tab, newline, carriage return and every character that would act on a
    terminal escaped (\\\\, \\t, \\n, \\r, \\x1b, \\u202e), so a row is one line and reads back exactly."""
    value = plain(value)
    if value is None:
        return ""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, dict | list):
        text = exact_json.dumps_like(value, ensure_ascii=False, default=str)
    else:
        text = str(value)
    return printable(text.replace("\\", "\\\\"))


def tsv_row(cells: Iterable[Any]) -> str:
    return "\t".join(tsv_cell(cell) for cell in cells) + "\n"


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
"""What makes a spreadsheet read a cell as a formula (OWASP's CSV injection list)."""


def csv_cell(value: Any) -> str:
    """One value as a CSV field's text: as tsv_cell spells it, but with its newlines and tabs
    kept (the quoting holds them), and a text that a spreadsheet would run as a formula
    prefixed with an apostrophe. Numbers stay numbers: -3 is not a formula."""
    value = plain(value)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | Decimal | exact_json.JsonNumber):
        return str(value)
    text = exact_json.dumps_like(value, ensure_ascii=False, default=str) if isinstance(value, dict | list) \
        else str(value)
    text = printable(text, lines=True)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def csv_row(cells: Iterable[Any]) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\r\n").writerow([csv_cell(cell) for cell in cells])
    return out.getvalue()


def text_row(cells: Iterable[Any]) -> str:
    """One row as --output tsv or csv asks (a command that streams its rows)."""
    return csv_row(cells) if output_format() == "csv" else tsv_row(cells)


def field_names(record: type) -> list[str]:
    """A dataclass's field names, for emit's columns when a command adds to them."""
    return [f.name for f in dataclasses.fields(record)]


def _names(columns: Columns) -> list[str] | None:
    if columns is None:
        return None
    return field_names(columns) if isinstance(columns, type) else list(columns)


def _is_record(value: Any) -> bool:
    return isinstance(value, dict) or (dataclasses.is_dataclass(value) and not isinstance(value, type))


def _fields(record: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(record)] if dataclasses.is_dataclass(record) else list(record)


def _field(record: Any, name: str) -> Any:
    return record.get(name) if isinstance(record, dict) else getattr(record, name, None)


def _section(records: Sequence[Any], columns: Columns, row: Callable[[Iterable[Any]], str] = tsv_row) -> str:
    """A header row and one row per record; a list of plain values is one column, "value"."""
    names = _names(columns)
    if names is None:
        names = []
        for record in records:
            for name in _fields(record) if _is_record(record) else ["value"]:
                if name not in names:
                    names.append(name)
    if not names:
        return ""
    return row(names) + "".join(
        row(_field(r, n) for n in names) if _is_record(r) else row([r]) for r in records)


def _tables_in(record: Any) -> dict[str, type | None]:
    """A record's fields that are tables, by name: a dataclass's list[SomeDataclass] fields, and a
    dict's values that are lists of dataclasses (courier doctor's checks)."""
    if isinstance(record, dict):
        return {name: None for name, value in record.items()
                if isinstance(value, list) and value and all(dataclasses.is_dataclass(v) for v in value)}
    try:
        hints = typing.get_type_hints(type(record))
    except Exception:  # an annotation that does not resolve: no sections, one row
        return {}
    found = {}
    for name, hint in hints.items():
        args = typing.get_args(hint)
        if typing.get_origin(hint) is list and args and dataclasses.is_dataclass(args[0]):
            found[name] = args[0]
    return found


def tsv(data: Any, columns: Columns = None, row: Callable[[Iterable[Any]], str] = tsv_row) -> str:
    """data as TSV: a list is one table (a header row, one row per record); a record is a header
    row and one row, with its nested values as JSON. A record holding tables (courier status:
    endpoints, workers, health) prints its other fields as the first table, then each table,
    the tables separated by one empty line, each starting with its header row."""
    if not _is_record(data):
        return _section(data if isinstance(data, list | tuple) else [data], columns, row)
    tables = _tables_in(data)
    if not tables:
        return _section([data], columns, row)
    rest = [name for name in _fields(data) if name not in tables]
    sections = [_section([data], rest, row)] if rest else []
    sections += [_section(_field(data, name), kind, row) for name, kind in tables.items()]
    return ("\r\n" if row is csv_row else "\n").join(sections)


def print_table(*renderables: Any) -> None:
    """Print tables (or a Group of them) for a person. A cell is one line: its tabs and newlines
    are shown as \\t and \\n (a detail grid keeps its newlines: a JSON config is shown indented).
    On a terminal the tables fit its width; piped or redirected, they are as wide as their
    content, so every value is printed whole and without colour (a file has no width to fit,
    and a cut value is lost to whoever reads it)."""
    tables = [table for renderable in renderables for table in _tables(renderable)]
    for table in tables:
        _one_line_cells(table)
    if console.is_terminal:
        console.print(*renderables)
        return
    for table in tables:
        for column in table.columns:
            column.max_width = None
            column.overflow = "fold"
    wide = LiteralConsole(file=console.file, width=1_000_000_000)
    needed = max((Measurement.get(wide, wide.options, r).maximum for r in renderables), default=1)
    wide.width = max(needed, 1)
    wide.print(*renderables)


def _one_line_cells(table: Table) -> None:
    """A tab in a cell was measured as nothing and drawn as spaces, which broke the cell in two;
    a newline split a row. Both are escaped, as printable() does for a table cell."""
    for column in table.columns:
        cells = column._cells  # rich keeps a column's cells here; str ones are drawn as text
        for n, cell in enumerate(cells):
            if isinstance(cell, str):
                cells[n] = Text("\\t".join(printable(part, lines=True) for part in cell.split("\t"))
                                if not table.show_header else printable(cell), end="")


def _tables(renderable: Any) -> Iterable[Table]:
    if isinstance(renderable, Table):
        yield renderable
    elif isinstance(renderable, Group):
        for part in renderable.renderables:
            yield from _tables(part)


class FiniteFloatRange(click.FloatRange):
    """click.FloatRange that also refuses nan and infinity: nan passes every range check (each
    comparison is false) and then broke timedelta() and sleeps with a traceback."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


def parse_json(text: str, what: str) -> Any:
    """JSON as jsonb reads it: numbers kept exactly (see sqlkit.exact_json). What Python's reader
    takes and PostgreSQL refused with an error that named nothing (NaN, the infinities, a NUL
    character, text that is not UTF-8) is refused here, naming where it is."""
    try:
        value = exact_json.loads(text)
    except exact_json.NotJsonNumber as error:
        raise click.BadParameter(f"not valid JSON ({error})", param_hint=what) from None
    except json.JSONDecodeError as error:
        raise click.BadParameter(f"not valid JSON ({error.msg} at line {error.lineno} "
                                 f"column {error.colno})", param_hint=what) from None
    except RecursionError:
        raise click.BadParameter("nested too deeply to read", param_hint=what) from None
    found = exact_json.unstorable(value)
    if found:
        raise click.BadParameter(" ".join(filter(None, found)), param_hint=what)
    return value


def parse_json_object(text: str, what: str) -> dict[str, Any]:
    value = parse_json(text, what)
    if not isinstance(value, dict):
        raise click.BadParameter("must be a JSON object", param_hint=what)
    return value


def when(value: datetime | None) -> str:
    return "-" if value is None else value.astimezone().strftime("%Y-%m-%d %H:%M:%S")


# Ids and cursors, bounded as their columns are -----------------------------------------------
# Out of range, click names the argument in one line (exit 2), rather than PostgreSQL failing
# on a numeric that no function takes or a bigint or integer overflow.

BIGINT_MAX = 9_223_372_036_854_775_807
ROW_ID = click.IntRange(1, BIGINT_MAX)
"""A message, DLQ entry, archive or event id: a bigint from a sequence, so 1 or more."""
CURSOR = click.IntRange(0, BIGINT_MAX)
"""An --after ID cursor: an id, or 0 for "from the first"."""


# Listings that stop at --limit -------------------------------------------------------------

PAGE_SIZE = 1000
"""Rows per read when --all walks a listing: page after page by id, so none is read twice."""

ENVELOPE_HELP = ("With --json: print one object {items, count, more, next_after} instead of the bare list, so a "
                 "script can tell a full page from the whole: more is true when rows matching the filters were "
                 "left out, and next_after is the --after value that prints the next page (null when nothing "
                 "follows).")


def paging_options(after_help: str, default_limit: int = 50) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--limit, --all, --after ID and --envelope, for a listing that stops at a page. --limit's
    default is applied by page_limit, so that --all can refuse a --limit given with it."""
    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed((
            click.option("--limit", type=click.IntRange(1, 100_000), default=None,
                         help=f"Print at most this many (default: {default_limit}); a note on stderr says when "
                              "more were left out."),
            click.option("--all", "everything", is_flag=True,
                         help=f"Print every one, read {PAGE_SIZE:,} at a time (instead of --limit)."),
            click.option("--after", type=CURSOR, metavar="ID", help=after_help),
            click.option("--envelope", is_flag=True, help=ENVELOPE_HELP),
        )):
            func = option(func)
        return func
    return decorate


def page_limit(limit: int | None, everything: bool, envelope: bool, default_limit: int = 50) -> int | None:
    """The rows to print (None: --all), refusing what contradicts itself."""
    if everything and limit is not None:
        raise click.UsageError("--all prints every row; it cannot be combined with --limit")
    if envelope and not wants_json():
        raise click.UsageError("--envelope shapes JSON output; give it with --json (or -o json)")
    return None if everything else (default_limit if limit is None else limit)


def read_pages(read: Callable[[int | None, int], tuple[list[Any], bool]], after: int | None,
               limit: int | None) -> tuple[list[Any], bool]:
    """The rows a listing prints, and whether more matched: read(after, n) returns a page of at
    most n rows following `after` and whether more follow (fetched as n + 1 rows, never by a
    count). With limit None, read page after page, each from the last id of the one before."""
    if limit is not None:
        return read(after, limit)
    rows: list[Any] = []
    while True:
        page, more = read(after, PAGE_SIZE)
        rows += page
        if not more or not page:
            return rows, False
        after = page[-1].id


def stopped_early(noun: str, shown: int, next_after: int | None, *, older: bool = False) -> None:
    """One line on stderr, in every output format (stdout keeps only the data), when a listing
    printed `shown` rows but more matched: how to get the rest."""
    if older:
        error_console.print(
            f"note: showing the newest {shown:,} {noun}; older ones were left out. Every one: --all; a page at a "
            "time from the oldest: --after 0; or a larger --limit.", highlight=False, soft_wrap=True)
        return
    error_console.print(
        f"note: stopped after {shown:,} {noun}; more follow. Next page: --after {next_after}; all the rest: "
        f"--all --after {next_after}; or a larger --limit.", highlight=False, soft_wrap=True)


def page_envelope(rows: Sequence[Any], more: bool, next_after: int | None) -> dict[str, Any]:
    """--envelope's JSON: the rows, how many, whether more matched, and the --after that continues."""
    return {"items": list(rows), "count": len(rows), "more": more, "next_after": next_after}
