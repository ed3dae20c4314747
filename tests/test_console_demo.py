"""`courier demo` as a new user runs it: in a real pseudo-terminal at 80x24, with the console
open, until the operator presses q."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
import uuid
from pathlib import Path

import psutil
import psycopg

from console.bench.scratch import with_dbname
from tests.conftest import drop_database
from tests.helpers import scalar

DEMO_SECONDS = 14


def _read_for(fd: int, seconds: float) -> bytes:
    out = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                out += os.read(fd, 65536)
            except OSError:
                break
    return out


def test_demo_in_a_terminal_delivers_opens_the_down_circuit_and_leaves_nothing_behind(dsn, conn, server_dsn):
    # The demo works in a database of its own beside the one --dsn names; --keep keeps it to look at.
    database = "courier_demo_t_" + uuid.uuid4().hex[:10]
    try:
        _run_the_demo_in_a_terminal(dsn, database)
        assert scalar(conn, "SELECT count(*) FROM courier.endpoints") == 0
        with psycopg.connect(with_dbname(server_dsn, database), autocommit=True) as kept:
            assert scalar(kept, "SELECT circuit_state FROM courier.endpoints WHERE name = 'demo-down'") == "open"
            assert scalar(kept, "SELECT coalesce(sum(total), 0) FROM courier.delivery_totals "
                                "WHERE outcome = 'delivered'") > 0
    finally:
        drop_database(server_dsn, database)


def _run_the_demo_in_a_terminal(dsn: str, database: str) -> None:
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COURIER_DSN", "DATABASE_URL")}
    env.update(TERM="xterm-256color", COLUMNS="80", LINES="24")
    courier = str(Path(sys.executable).with_name("courier"))
    process = subprocess.Popen([courier, "demo", "--keep", "--database", database, "--dsn", dsn], stdin=follower,
                               stdout=follower, stderr=follower, env=env, start_new_session=True)
    os.close(follower)
    seen: set[int] = set()
    try:
        screen = b""
        deadline = time.monotonic() + DEMO_SECONDS
        while time.monotonic() < deadline:
            screen += _read_for(leader, 1.0)
            seen |= {p.pid for p in psutil.Process(process.pid).children(recursive=True)}
        assert b"Overview" in screen, screen[-2000:]
        os.write(leader, b"q")
        _read_for(leader, 0.5)
        process.wait(timeout=60)
        _read_for(leader, 0.5)
    finally:
        if process.poll() is None:
            process.kill()
        os.close(leader)
    assert process.returncode == 0
    assert seen, "the demo should have started a worker child"
    alive = [pid for pid in seen if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert alive == []
