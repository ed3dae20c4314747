"""`courier serve`, the HTTP API, and `courier token`, the tokens it takes."""

from __future__ import annotations

import logging

import click
from rich.table import Table
from rich.text import Text

from console.logs import log_json_lines
from sqlkit import tokens

from ..literal import literal
from .context import (
    common_options,
    console,
    database_url,
    dsn_option,
    emit,
    open_connection,
    plain,
    require_current_schema,
    when,
)


def _listen_address(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise click.BadParameter(f"{value!r} is not HOST:PORT, e.g. 127.0.0.1:8080")
    return host.strip("[]"), int(port)


@click.command("serve")
@click.option("--listen", default="127.0.0.1:8080", show_default=True, callback=_listen_address,
              help="HOST:PORT to accept requests on (0.0.0.0:8080 for every interface).")
@click.option("--max-body", type=click.IntRange(1024, 256 * 1024 * 1024), default=2 * 1024 * 1024,
              show_default=True, help="Largest request body, in bytes.")
@dsn_option
def serve(listen: tuple[str, int], max_body: int) -> None:
    """Serve queue-ti's HTTP API until SIGTERM or SIGINT; in-flight requests finish first."""
    from aiohttp import web

    from console.serve.app import make_app

    url = database_url()
    require_current_schema(url, "courier serve")
    log_json_lines()
    host, port = listen
    logging.getLogger("courier.serve").info("serving", extra={"listen": f"{host}:{port}"})
    web.run_app(make_app(url, max_body=max_body), host=host, port=port, print=None, shutdown_timeout=30,
                access_log=None)


@click.group("token")
def token_group() -> None:
    """Bearer tokens for `courier serve`: each scoped to topics, endpoints and actions."""


def _names(ctx: click.Context, param: click.Parameter, value: str | None) -> list[str]:
    return [name.strip() for name in (value or "").split(",") if name.strip()]


@token_group.command("create")
@click.argument("name")
@click.option("--topics", callback=_names, help="Comma-separated topics it may use ('*': every topic).")
@click.option("--endpoints", callback=_names, help="Comma-separated push endpoints it may send to ('*': every one).")
@click.option("--can", "actions", multiple=True, type=click.Choice(tokens.ACTIONS[:3]),
              help="What it may do; repeat for several.")
@click.option("--admin", is_flag=True, help="Everything, on every topic and endpoint, and topic configuration.")
@common_options
def token_create(name: str, topics: list[str], endpoints: list[str], actions: tuple[str, ...], admin: bool) -> None:
    """Make a token and print its secret, which is shown this once and stored only hashed."""
    chosen = [*actions, *(["admin"] if admin else [])]
    if not chosen:
        raise click.UsageError("say what the token may do: --can enqueue|consume|publish (repeatable), or --admin")
    with open_connection() as conn:
        secret = tokens.create_token(conn, name, topics=topics, endpoints=endpoints, actions=chosen)
    emit({"name": name, "token": secret, "actions": chosen, "topics": topics, "endpoints": endpoints},
         lambda: (console.print(Text.assemble("token ", literal(name, "bold"), " (shown once; keep it secret):")),
                  click.echo(secret)))


@token_group.command("list")
@common_options
def token_list() -> None:
    """Every token, with its scope and when it was last used (never the secrets)."""
    with open_connection() as conn:
        found = tokens.list_tokens(conn)

    def render() -> None:
        table = Table("name", "actions", "topics", "endpoints", "created", "last used", "revoked")
        for token in found:
            table.add_row(literal(token.name), ", ".join(token.actions), literal(", ".join(token.topics) or "-"),
                          literal(", ".join(token.endpoints) or "-"), when(token.created_at),
                          when(token.last_used_at) if token.last_used_at else "-",
                          when(token.revoked_at) if token.revoked_at else "-")
        console.print(table)

    emit([plain(token) for token in found], render)


@token_group.command("revoke")
@click.argument("name")
@common_options
def token_revoke(name: str) -> None:
    """Refuse the token from now on (within a second on a running server)."""
    with open_connection() as conn:
        revoked = tokens.revoke_token(conn, name)
    emit({"name": name, "revoked": revoked},
         lambda: console.print(Text.assemble("revoked ", literal(name, "bold")) if revoked
                               else Text.assemble(literal(name, "bold"), " was revoked already")))


COMMANDS = [serve, token_group]
