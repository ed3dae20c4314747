"""Whole databases on a server, managed from a connection to another database on it: the
demo's database of its own, and `courier db reset`."""

from __future__ import annotations

from psycopg import sql

from .connection import connect
from .errors import Conflict, translated

PROTECTED = ("postgres", "template0", "template1")
"""Databases a server needs: Courier never drops one."""


def current_database(dsn: str) -> str:
    """The database dsn connects to (libpq may take it from PGDATABASE or the user name)."""
    with translated(), connect(dsn) as conn:
        row = conn.execute("SELECT current_database()").fetchone()
    assert row is not None
    return str(row[0])


def exists(admin_dsn: str, name: str) -> bool:
    with translated(), connect(admin_dsn) as conn:
        return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is not None


def sessions(admin_dsn: str, name: str) -> list[int]:
    """Backend pids connected to database name, other than admin_dsn's own session."""
    with translated(), connect(admin_dsn) as conn:
        rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid() "
                            "ORDER BY pid", (name,)).fetchall()
    return [int(pid) for (pid,) in rows]


def create(admin_dsn: str, name: str) -> None:
    with translated(), connect(admin_dsn) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def drop(admin_dsn: str, name: str, *, force: bool = False) -> bool:
    """Drop database name; False if there was none. Without force, refuses (Conflict) while
    other sessions use it, naming them; with force, ends them first (`WITH (FORCE)`)."""
    if name in PROTECTED:
        raise Conflict(f"database {name} is one the server needs; Courier never drops it")
    if not force:
        busy = sessions(admin_dsn, name)
        if busy:
            raise Conflict(f"{len(busy)} session(s) are connected to database {name} (pids "
                           f"{', '.join(map(str, busy[:10]))})",
                           hint="stop the workers, consoles, servers or demo using it first")
    with translated(), connect(admin_dsn) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is not None
        statement = sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name))
        if force:
            statement += sql.SQL(" WITH (FORCE)")
        conn.execute(statement)
    return found


def drop_courier_schema(dsn: str, *, lock_timeout: str = "10s") -> None:
    """Drop schema courier with everything in it (Courier keeps nothing outside it but its
    roles, which the server shares with other databases and the next migrate reuses)."""
    with translated(), connect(dsn) as conn:
        conn.execute("SELECT set_config('lock_timeout', %s, false)", (lock_timeout,))
        conn.execute("DROP SCHEMA IF EXISTS courier CASCADE")
