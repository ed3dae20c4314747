"""`courier config get|set`: the runtime settings stored in the database."""

from __future__ import annotations

import click
from rich.table import Table
from rich.text import Text

from sqlkit import settings

from ..literal import literal, printable
from .context import common_options, console, emit, open_connection, output_format, print_table


@click.group("config")
def config_group() -> None:
    """Read and change runtime settings (ulak's GUCs, without the prefix)."""


@config_group.command("get")
@click.argument("name", required=False)
@common_options
def get(name: str | None) -> None:
    """Show one setting, or all of them."""
    with open_connection() as conn:
        found = [settings.get(conn, name)] if name else settings.list_all(conn)
    if name and output_format() == "table":
        click.echo(found[0].value)
        return

    def render() -> None:
        table = Table()
        table.add_column("name", no_wrap=True)
        table.add_column("value", no_wrap=True)
        table.add_column("allowed", no_wrap=True)
        # Descriptions only fit beside the rest on a wide terminal; piped, the table is as wide as it needs.
        wide = console.width >= 120 or not console.is_terminal
        if wide:
            table.add_column("description", ratio=1)
        for s in found:
            value = (Text.assemble(literal(s.value, "bold"), f" (default {printable(s.default_value)})")
                     if s.value != s.default_value else s.value)
            cells = [s.name, value, f"{s.allowed} {s.unit or ''}".strip()]
            table.add_row(*cells, *([s.description] if wide else []))
        print_table(table)

    emit(found[0] if name else found, render, columns=settings.Setting)


@config_group.command("set", context_settings={"ignore_unknown_options": True})
@click.argument("name")
@click.argument("value")
@common_options
def set_command(name: str, value: str) -> None:
    """Change a setting; out-of-range values are rejected."""
    with open_connection() as conn:
        stored = settings.set_value(conn, name, value)
    emit({"name": name, "value": stored}, lambda: console.print(f"{name} = {stored}", highlight=False))


COMMANDS = [config_group]
