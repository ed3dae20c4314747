"""`courier doctor`: what this install and its database are missing, and how to fix each."""

from __future__ import annotations

import sys

import click
from rich.text import Text

from ..doctor import FAIL, OK, SKIP, WARN, Check, run_all
from ..literal import literal
from .context import common_options, console, emit

MARK = {OK: ("ok", "green"), WARN: ("warn", "yellow"), FAIL: ("FAIL", "bold red"), SKIP: ("skip", "dim")}


@click.command("doctor")
@common_options
@click.pass_context
def doctor(ctx: click.Context) -> None:
    """Check the database (reachable, version, migrations, roles), workers, the brokers the
    endpoints use, and Java for Spark; print what to fix. Exits 1 if a check failed."""
    checks = run_all(ctx.meta.get("courier.dsn"))
    emit({"ok": not any(c.status == FAIL for c in checks), "checks": checks}, lambda: _render(checks))
    if any(check.status == FAIL for check in checks):
        sys.exit(1)


def _render(checks: list[Check]) -> None:
    width = max(len(f"{c.area} {c.name}") for c in checks)
    for check in checks:
        label, style = MARK[check.status]
        # Details quote what the database and brokers said: shown literally.
        line = Text.assemble((f"{label:>4}", style), "  ", literal(f"{check.area} {check.name}".ljust(width)), "  ",
                             literal(check.detail))
        console.print(line, highlight=False, soft_wrap=True)
        if check.fix and check.status != OK:
            console.print(Text.assemble(" " * (8 + width), ("fix: ", "bold"), literal(check.fix)), highlight=False,
                          soft_wrap=True)
    failed = sum(c.status == FAIL for c in checks)
    warned = sum(c.status == WARN for c in checks)
    skipped = sum(c.status == SKIP for c in checks)
    summary = ("all checks passed" if not failed and not warned else f"{failed} failed, {warned} warning(s)") \
        + (f", {skipped} skipped" if skipped else "")
    console.print(Text(summary, style="bold red" if failed else "bold yellow" if warned else "bold green"))


COMMANDS = [doctor]
