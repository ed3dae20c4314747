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
from pathlib import Path

import psutil

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


def test_demo_in_a_terminal_delivers_opens_the_down_circuit_and_leaves_nothing_behind(dsn, conn):
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COURIER_DSN", "DATABASE_URL")}
    env.update(TERM="xterm-256color", COLUMNS="80", LINES="24")
    courier = str(Path(sys.executable).with_name("courier"))
    process = subprocess.Popen([courier, "demo", "--dsn", dsn], stdin=follower,
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
    assert scalar(conn, "SELECT circuit_state FROM courier.endpoints WHERE name = 'demo-down'") == "open"
    assert scalar(conn, "SELECT coalesce(sum(total), 0) FROM courier.delivery_totals WHERE outcome = 'delivered'") > 0
