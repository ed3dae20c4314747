"""`courier serve`, the HTTP API, and `courier token`, the tokens it takes."""

from __future__ import annotations

import logging
import os
import ssl
import sys
from pathlib import Path

import click
from rich.table import Table
from rich.text import Text

from console.logs import log_json_lines
from console.serve.children import Supervised
from console.workers.settings import default_concurrency
from sqlkit import tokens

from ..literal import literal
from .context import (
    FiniteFloatRange,
    common_options,
    console,
    database_url,
    dsn_option,
    emit,
    log_level_option,
    open_connection,
    plain,
    print_table,
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
@click.option("--client-timeout", type=FiniteFloatRange(0.1, 3600), default=15.0, show_default=True,
              help="Seconds a client may take to send a request body, and an idle keep-alive connection stays.")
@click.option("--workers", type=click.IntRange(0, 64), default=0, show_default=True,
              help="Worker pool processes to run beside the server, delivering push messages "
                   "(as `courier worker --processes N`); 0: run `courier worker` yourself.")
@click.option("--processes", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Server processes sharing the listening address (SO_REUSEPORT: the kernel spreads "
                   "connections over them); about one per core. Each has its own database pools.")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="PEM certificate (chain) to serve HTTPS with; needs --tls-key.")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="PEM private key of --tls-cert.")
@click.option("--sibling", is_flag=True, hidden=True,
              help="Started by a `serve --processes N`: share its address, start no workers or siblings.")
@log_level_option
@dsn_option
def serve(listen: tuple[str, int], max_body: int, client_timeout: float, workers: int, processes: int,
          tls_cert: Path | None, tls_key: Path | None, sibling: bool) -> None:
    """Serve queue-ti's HTTP API until SIGTERM or SIGINT; in-flight requests finish first."""
    from console.serve.app import make_app, run

    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("HTTPS needs both --tls-cert and --tls-key")
    tls = _tls_context(tls_cert, tls_key) if tls_cert and tls_key else None
    url = database_url()
    require_current_schema(url, "courier serve")
    log_json_lines()
    host, port = listen
    log = logging.getLogger("courier.serve")
    children: list[Supervised] = []

    def serving() -> None:
        # Only once the address is bound: a port in use is one line (CannotListen, a
        # CourierError, exit code 1), and no workers or siblings were started for nothing.
        if not sibling:
            children.extend(_start_siblings(url, processes - 1, listen, max_body, client_timeout, tls_cert, tls_key))
            if workers:
                children.append(_start_workers(url, workers))
        shown = f"[{host}]" if ":" in host else host
        log.info("serving", extra={"listen": f"{'https' if tls else 'http'}://{shown}:{port}", "workers": workers,
                                   **({"processes": processes} if not sibling else {"sibling": True})})

    try:
        run(make_app(url, max_body=max_body, client_timeout=client_timeout), host, port, ssl_context=tls,
            client_timeout=client_timeout, shutdown_timeout=30, serving=serving,
            reuse_port=sibling or processes > 1)
    finally:
        for child in children:  # all at once: each drains in parallel
            child.request_stop()
        for child in children:
            child.stop(WORKERS_STOP_SECONDS)


def _tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as error:
        raise click.BadParameter(f"cannot load {cert} with {key}: {error}", param_hint="'--tls-cert'") from None
    return context


WORKERS_STOP_SECONDS = 60
"""How long a stop waits for the worker pool to drain (its own drain timeout is 30 s)."""


def _start_siblings(url: str, count: int, listen: tuple[str, int], max_body: int, client_timeout: float,
                    tls_cert: Path | None, tls_key: Path | None) -> list[Supervised]:
    """`count` more server processes on the same address (each restarted if it dies)."""
    host, port = listen
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    argv = [sys.executable, "-m", "console", "serve", "--sibling", "--listen", address, "--max-body", str(max_body),
            "--client-timeout", str(client_timeout),
            *(["--tls-cert", str(tls_cert), "--tls-key", str(tls_key)] if tls_cert and tls_key else [])]
    env = {**os.environ, "COURIER_DSN": url} if url else dict(os.environ)
    return [Supervised(f"server process {n + 2}", argv, env).start() for n in range(count)]


def _start_workers(url: str, processes: int) -> Supervised:
    """`courier worker` as a child process, so delivery never competes with the server's loop;
    restarted with back-off if it dies."""
    concurrency = max(processes, default_concurrency())
    # The DSN goes in the environment, not --dsn: any local user can read a command line (`ps`),
    # and a password in it with it. COURIER_DSN comes before DATABASE_URL and PG*, so the worker
    # uses this database whichever way it was given here.
    env = {**os.environ, "COURIER_DSN": url} if url else dict(os.environ)
    return Supervised("worker pool", [sys.executable, "-m", "console", "worker", "--processes", str(processes),
                                      "--concurrency", str(concurrency)], env).start()


@click.group("token")
def token_group() -> None:
    """Bearer tokens for `courier serve`: each scoped to topics, endpoints and actions."""


def _names(ctx: click.Context, param: click.Parameter, value: str | None) -> list[str]:
    return [name.strip() for name in (value or "").split(",") if name.strip()]


@token_group.command("create")
@click.argument("name")
@click.option("--topics", callback=_names, help="Comma-separated topics it may use ('*': every topic).")
@click.option("--endpoints", callback=_names, help="Comma-separated push endpoints it may send to ('*': every one).")
@click.option("--can", "actions", multiple=True, type=click.Choice(tokens.ACTIONS[:-1]),
              help="What it may do; repeat for several.")
@click.option("--admin", is_flag=True, help="Everything, on every topic and endpoint, and topic configuration.")
@common_options
def token_create(name: str, topics: list[str], endpoints: list[str], actions: tuple[str, ...], admin: bool) -> None:
    """Make a token and print its secret, which is shown this once and stored only hashed."""
    chosen = [*actions, *(["admin"] if admin else [])]
    if not chosen:
        raise click.UsageError("say what the token may do: --can enqueue|consume|publish|monitor (repeatable), "
                               "or --admin")
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
        print_table(table)

    emit([plain(token) for token in found], render, columns=tokens.Token)


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
