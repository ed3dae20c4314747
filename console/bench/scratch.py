"""A throwaway database on the target server, so benchmarks never touch a live queue, and a free
port for the servers a benchmark starts on loopback."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable, Iterator

import psycopg
from psycopg import sql

from sqlkit import migrate
from sqlkit.connection import connect


def free_port() -> int:
    """A TCP port free on loopback now, for a server the benchmark starts."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


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


def stage_lapsed(conn: psycopg.Connection) -> None:
    """A preload goes to the queue, counted there at once, whatever the last worker's leader said:
    it keeps the send stage alive for five seconds after it stops (migrations 0054, 0055), and a
    staged batch is counted only when a claim or the leader moves it."""
    conn.execute("/* bench harness */ SELECT courier._unstage()")
    conn.execute("/* bench harness */ UPDATE courier.send_limits SET stage_until = NULL")


@contextlib.contextmanager
def leader_estimates(dsn: str, *, move_staged: bool = True) -> Iterator[None]:
    """What a running worker's maintenance leader does every second for the sends: writes the
    count of active messages they compare with max_queue_size while the queue is far below it,
    and keeps the send stage alive (moving what is staged into the queue, unless `move_staged` is
    false: the cost scenario measures what the sends write, in windows the moves would enter).
    Scenarios that send without a worker keep both fresh, so that they measure the sends a
    deployment makes."""
    def estimate(stop: threading.Event) -> None:
        with connect(dsn) as conn:
            while True:
                conn.execute("/* bench harness */ SELECT courier.keep_send_stage(%s)", (move_staged,))
                conn.execute("/* bench harness */ SELECT courier.estimate_active_messages()")
                if stop.wait(1.0):
                    return

    with in_background(estimate):
        yield


@contextlib.contextmanager
def in_background(work: Callable[[threading.Event], None]) -> Iterator[None]:
    """`work(stop)` in a thread of its own for as long as the block runs; it returns once `stop`
    is set, which the block's end does, and waits for it."""
    stop = threading.Event()
    thread = threading.Thread(target=work, args=(stop,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
