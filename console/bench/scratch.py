"""A throwaway database on the target server, so benchmarks never touch a live queue."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import psycopg
from psycopg import sql

from sqlkit import migrate
from sqlkit.connection import connect


def with_dbname(dsn: str, dbname: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return psycopg.conninfo.make_conninfo("", **params)


@contextlib.contextmanager
def scratch_database(dsn: str) -> Iterator[str]:
    """Create courier_bench_<pid>, migrate it, yield its DSN, and drop it afterwards."""
    name = f"courier_bench_{os.getpid()}"
    with connect(dsn) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    bench_dsn = with_dbname(dsn, name)
    try:
        migrate.migrate(bench_dsn)
        yield bench_dsn
    finally:
        with connect(dsn) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def backpressure_out_of_reach(conn: psycopg.Connection) -> None:
    """Raise max_queue_size to its maximum rather than turn it off (0): a send then checks the
    queue's depth as it does with the default limit, so the figures are those of the code a
    user runs, and a run that sends millions is never refused."""
    conn.execute("SELECT courier.set_setting('max_queue_size', '2147483647')")
