"""The `courier` command: a click group whose subcommands are thin layers over sqlkit."""

from __future__ import annotations

import json
import sys
from typing import Any

import click
import psycopg
from rich.text import Text

from sqlkit.errors import CourierError, InvalidInput, from_psycopg

from ..literal import printable
from .context import dsn_option, error_console, wants_json


class CourierGroup(click.Group):
    """Turns every Courier error into one readable line and exit code 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CourierError as error:
            self._fail(ctx, error)
        except psycopg.Error as error:  # a query outside sqlkit's translation: still one line
            self._fail(ctx, from_psycopg(error))
        except (UnicodeDecodeError, UnicodeEncodeError) as error:
            if error.encoding.replace("-", "").lower() != "utf8":
                raise  # not the input: writing to a terminal that takes another encoding, say
            self._fail(ctx, InvalidInput(_not_utf8(error)), exit_code=2)
        except KeyboardInterrupt:
            error_console.print("interrupted")
            sys.exit(130)

    @staticmethod
    def _fail(ctx: click.Context, error: CourierError, exit_code: int = 1) -> None:
        if wants_json(ctx):
            sys.stdout.write(json.dumps(error.as_dict()) + "\n")
        else:
            error_console.print(Text.assemble(("error:", "bold red"), " ", printable(error.one_line())),
                                highlight=False, soft_wrap=True)
        sys.exit(exit_code)


def _not_utf8(error: UnicodeDecodeError | UnicodeEncodeError) -> str:
    """Input that is not UTF-8 text: bytes in a file (a decode error), or in an argument or on
    stdin, which Python decodes with surrogates in their place (an encode error at the query)."""
    if isinstance(error, UnicodeDecodeError):
        return f"the input is not UTF-8 text: byte 0x{error.object[error.start]:02x} at position {error.start}"
    try:  # the bytes as given: 'k\xff', not Python's 'k\udcff'
        shown = error.object[:80].encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        shown = error.object[:80].encode("utf-8", "backslashreplace").decode()
    return f"'{shown}' is not UTF-8 text"


@click.group(cls=CourierGroup, invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@dsn_option
@click.version_option(package_name="courier")
@click.pass_context
def main(ctx: click.Context) -> None:
    """Courier: a PostgreSQL-native message queue and outbox dispatcher.

    With no command, opens the operator console on the configured database."""
    if ctx.invoked_subcommand is None:
        from .console import open_console

        open_console(workers=0)


def _register() -> None:
    from . import (
        archive,
        bench,
        config,
        console,
        db,
        demo,
        dlq,
        doctor,
        endpoint,
        events,
        metrics,
        pipeline,
        pubsub,
        pull,
        schedule,
        send,
        serve,
        sink,
        status,
        verbs,
        worker,
    )

    for module in (db, endpoint, send, pubsub, pull, config, worker, status, dlq, archive, metrics, events, bench,
                   demo, console, pipeline, serve, doctor, sink, schedule):
        for command in module.COMMANDS:
            main.add_command(command)
    for command in verbs.COMMANDS:  # `courier message cancel|delete` and `courier purge`
        main.add_command(command)


_register()
