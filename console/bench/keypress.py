"""Keypress-to-repaint latency of the console in a real pseudo-terminal (80x24), while its
embedded worker pool drains a preloaded queue at full speed.

The console runs as `courier console --workers N` would, in a process of its own; each
sample writes one key to the terminal and waits for the bytes of the repaint it causes
to arrive. This is what an operator feels, terminal I/O included. Two kinds of key are
measured: a pane switch (1/2, the heaviest repaint: a whole new pane) and a cursor move
in a table (the commonest key).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
import time

from sqlkit.connection import connect

PRELOAD = 300_000
WORKERS = 32
PRESSES = 60
PANE_KEYS = ((b"2", b"Endpoints"), (b"1", b"Overview"))
CURSOR_KEYS = (b"\x1b[B", b"\x1b[A")
LAUNCH = "from console.cli import main; main()"


class Terminal:
    """A pseudo-terminal whose output is read all the time (a program writing to a full
    pty blocks), with a way to wait for bytes that arrive after a given moment."""

    def __init__(self, columns: int = 80, rows: int = 24) -> None:
        self.leader, self.follower = pty.openpty()
        fcntl.ioctl(self.follower, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        self._output = bytearray()
        self._changed = threading.Condition()
        self._closed = False
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while not self._closed:
            if not select.select([self.leader], [], [], 0.05)[0]:
                continue
            try:
                chunk = os.read(self.leader, 65536)
            except OSError:
                return
            with self._changed:
                self._output += chunk
                self._changed.notify_all()

    def mark(self) -> int:
        with self._changed:
            return len(self._output)

    def wait_for(self, needle: bytes | None, since: int, timeout: float) -> bool:
        """Until needle (or, with None, any byte) arrives after offset since."""
        deadline = time.perf_counter() + timeout
        with self._changed:
            while True:
                fresh = bytes(self._output[since:])
                if (needle is None and fresh) or (needle is not None and needle in fresh):
                    return True
                left = deadline - time.perf_counter()
                if left <= 0:
                    return False
                self._changed.wait(left)

    def press(self, key: bytes, needle: bytes | None, timeout: float = 5.0) -> float | None:
        since = self.mark()
        started = time.perf_counter()
        os.write(self.leader, key)
        if self.wait_for(needle, since, timeout):
            return (time.perf_counter() - started) * 1000
        return None

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            os.close(self.leader)


def _pending(dsn: str) -> int:
    with connect(dsn) as conn:
        row = conn.execute("SELECT coalesce(sum(messages), 0) FROM courier.queue_depth "
                           "WHERE status = 'pending'").fetchone()
    return int(row[0])


def measure(dsn: str, *, preload: int = PRELOAD, presses: int = PRESSES,
            workers: int = WORKERS) -> dict[str, object]:
    """Latencies (ms) of pane switches and cursor moves, and how many messages the pool
    delivered while they were measured."""
    with connect(dsn) as conn:
        conn.execute("SELECT courier.set_setting('max_queue_size', '0')")
        conn.execute("SELECT courier.create_endpoint('keypress-noop', 'noop', '{}')")
        if preload:
            conn.execute("SELECT courier.send_batch('keypress-noop', ARRAY(SELECT jsonb_build_object('n', g) "
                         "FROM generate_series(1, %s) g))", (preload,))
    terminal = Terminal()
    env = {**os.environ, "TERM": "xterm-256color", "COURIER_DSN": dsn}
    command = [sys.executable, "-P", "-c", LAUNCH, "console", "--workers", str(workers)]
    process = subprocess.Popen(command, stdin=terminal.follower, stdout=terminal.follower,
                               stderr=terminal.follower, env=env, start_new_session=True)
    os.close(terminal.follower)
    switches: list[float] = []
    cursor: list[float] = []
    try:
        if not terminal.wait_for(b"Overview", 0, 60):
            raise RuntimeError("the console did not start")
        time.sleep(3.0)  # let the pool reach full speed
        before = _pending(dsn)
        started = time.perf_counter()
        for n in range(presses):
            key, title = PANE_KEYS[n % 2]
            if (ms := terminal.press(key, title)) is not None:
                switches.append(ms)
            time.sleep(0.15)
        terminal.press(b"6", b"Events")  # a table with rows to move through
        time.sleep(0.5)
        for n in range(presses):
            if (ms := terminal.press(CURSOR_KEYS[n % 2], None)) is not None:
                cursor.append(ms)
            time.sleep(0.15)
        seconds = time.perf_counter() - started
        delivered = before - _pending(dsn)
        os.write(terminal.leader, b"q")
        process.wait(timeout=90)
    finally:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        terminal.close()
        with connect(dsn) as conn:
            conn.execute("SELECT courier.drop_endpoint('keypress-noop', true)")
    return {"switch_ms": switches, "cursor_ms": cursor, "delivered": delivered,
            "delivered_per_second": delivered / seconds if seconds else 0.0}
