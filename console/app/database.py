"""The console's one door to PostgreSQL: a small pool used only from background threads.

Panes call typed sqlkit functions through `read` and `write`; every failure leaves as a
CourierError, and the app learns whether the database is reachable from the outcome.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import psycopg

from sqlkit.connection import Database
from sqlkit.errors import CourierError, DatabaseUnavailable

T = TypeVar("T")
# A console that waits 30 s for a dead server is a frozen console: fail fast, retry often.
CONNECT_TIMEOUT = 3.0


class ConsoleDatabase:
    def __init__(self, dsn: str, on_state: Callable[[CourierError | None], None] | None = None) -> None:
        self.dsn = dsn
        self._pool = Database(dsn, min_size=1, max_size=4, application_name="courier-console",
                              timeout=CONNECT_TIMEOUT, check_connections=True)
        self._on_state = on_state
        self._lock = threading.Lock()
        self._opened = False
        self.last_error: CourierError | None = None

    def open(self) -> None:
        with self._lock:
            if not self._opened:
                self._pool.open(wait=False)
                self._opened = True

    def close(self) -> None:
        with self._lock:
            if self._opened:
                self._pool.close()
                self._opened = False

    def run(self, action: Callable[[psycopg.Connection], T]) -> T:
        """Run action(conn) on a pooled connection; call from a worker thread, never the UI."""
        self.open()
        try:
            with self._pool.connection() as conn:
                result = action(conn)
        except CourierError as error:
            if _is_connection_error(error):
                self._report(error)
            raise
        self._report(None)
        return result

    def _report(self, error: CourierError | None) -> None:
        changed = (error is None) != (self.last_error is None)
        self.last_error = error
        if changed and self._on_state is not None:
            self._on_state(error)


def _is_connection_error(error: CourierError) -> bool:
    return isinstance(error, DatabaseUnavailable) or (error.sqlstate or "").startswith(("08", "57P"))
