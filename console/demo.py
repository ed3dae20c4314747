"""What `courier demo` runs: the embedded PostgreSQL if no DSN is given, a database of the
demo's own on that server (courier_demo), a local webhook sink with demo endpoints on it, a
producer thread and the worker pool child process, and their orderly stop."""

from __future__ import annotations

import contextlib
import logging
import threading
from pathlib import Path

from sqlkit import databases, embedded, endpoints, messages, migrate
from sqlkit.connection import connect
from sqlkit.dsn import with_database
from sqlkit.errors import Conflict, CourierError, InvalidInput, NotFound
from sqlkit.messages import SendOptions

from .sink import WebhookSink
from .workers.supervisor import EmbeddedPool

log = logging.getLogger("courier.demo")

# Paths on the sink (console.sink): healthy, ~30% 503, 0.2-1.5 s; and a port nothing
# listens on, whose circuit opens.
DEMO_ENDPOINTS = {
    "demo-healthy": {"path": "/healthy"},
    # One retry only, so that about 9% of its messages dead-letter: the DLQ fills within seconds.
    "demo-flaky": {"path": "/flaky", "retry_policy": {"max_retries": 1}},
    "demo-slow": {"path": "/slow", "timeout": 5},
    "demo-down": {"url": "http://127.0.0.1:9/down", "timeout": 2},
}
# Short retries, so failures reach the DLQ within a minute instead of an hour.
DEMO_RETRY_POLICY = {"max_retries": 2, "backoff": "fixed", "base_delay_seconds": 2}
DEMO_DATABASE = "courier_demo"
"""The demo's own database, beside the user's on the same server: its endpoints, open circuits
and undrainable backlog never reach the database every other command uses."""


class DemoRuntime:
    """Everything `courier demo` starts, owned in one place so the console and the headless
    loop stop it the same way. `with DemoRuntime(dsn) as demo:` starts it; close() stops it."""

    def __init__(self, dsn: str | None, *, rate: float = 40, workers: int = 16,
                 database: str = DEMO_DATABASE, keep: bool = False) -> None:
        self._dsn = dsn  # None: the embedded PostgreSQL
        self.rate = rate
        self.workers = workers
        self.database = database
        self.keep = keep
        """Reuse the demo database if it exists, and leave it at close(); otherwise it is made
        afresh by start() and dropped by close()."""
        self.url: str | None = None
        """The demo's database, once start() made it."""
        self.reused = False
        """Whether start() found the demo database (under keep) and carried on with it."""
        self.dropped = False
        """Whether close() dropped the demo database."""
        self.drop_error: str | None = None
        """Why close() could not drop it."""
        self._admin: str | None = None
        """A DSN on the same server to create and drop the demo database from."""
        self.started_embedded = False
        """Whether start() started the embedded PostgreSQL, and so close() stops it."""
        self.sink: WebhookSink | None = None
        self._pool: EmbeddedPool | None = None
        self._stop = threading.Event()
        self._producer: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False

    @property
    def pool(self) -> EmbeddedPool:
        """The worker pool child, for the console's Workers screen (after start())."""
        if self._pool is None:
            raise RuntimeError("the demo has not been started")
        return self._pool

    @property
    def worker_log(self) -> Path:
        """Where the worker pool child logs: next to the embedded data dir."""
        return embedded.data_dir().parent / "demo-workers.log"

    def start(self) -> str:
        """Start everything (once) and return the DSN. After a failure, call close()."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the demo has been closed")
            if self.url is not None:
                return self.url
            if self._dsn is None:
                self.started_embedded = not embedded.status().running
                url = self._own_database(embedded.start(database=None))
            else:
                url = self._own_database(self._dsn)
            migrate.migrate(url)
            self.sink = WebhookSink().start()
            with connect(url) as conn:
                _create_endpoints(conn, self.sink.url)
                messages.send(conn, "demo-healthy", {"urgent": True}, SendOptions(priority=10))
            self._producer = threading.Thread(target=_produce, args=(url, self.rate, self._stop),
                                              name="demo-producer", daemon=True)
            self._producer.start()
            self._pool = EmbeddedPool(url, concurrency=self.workers, log_path=self.worker_log)
            self._pool.start()
            self.url = url
            return url

    def close(self) -> None:
        """Stop the producer, drain the pool, stop the sink, drop the demo's database (unless
        keep), then stop the embedded PostgreSQL if start() started it. Bounded (the pool's
        stop is), idempotent, and safe after a start() that failed halfway."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._stop.set()
                if self._producer is not None:
                    self._producer.join(5)
                if self._pool is not None:
                    self._pool.stop()
            finally:
                try:
                    if self.sink is not None:
                        self.sink.stop()
                finally:
                    try:
                        self._drop_database()
                    finally:
                        if self.started_embedded:
                            embedded.stop()  # the data stays on disk; the next run reuses it

    def _own_database(self, server: str) -> str:
        """Make the demo's database on server's PostgreSQL (afresh, unless keep finds one) and
        return its DSN. The database server names is only connected to, never written."""
        named = databases.current_database(server)
        if named == self.database:
            raise InvalidInput(f"the DSN names database {named}, which the demo empties and drops",
                               hint=f"point --dsn at another database on that server (postgres, say): the "
                                    f"demo makes {self.database} beside it")
        if self.database in databases.PROTECTED or (self._dsn is None and self.database == embedded.DATABASE_NAME):
            raise InvalidInput(f"the demo cannot use database {self.database}: it empties and drops its database",
                               hint=f"leave --database at its default, {DEMO_DATABASE}")
        if self.keep and databases.exists(server, self.database):
            self.reused = True
        else:
            busy = databases.sessions(server, self.database)
            if busy:
                raise Conflict(f"database {self.database} is in use by {len(busy)} session(s): another "
                               "`courier demo`, or a worker or console pointed at it",
                               hint="stop that first, or give this demo another --database")
            try:
                databases.drop(server, self.database)  # kept by an earlier --keep run: start afresh
                databases.create(server, self.database)
            except CourierError as error:
                if error.sqlstate != "42501":
                    raise
                raise CourierError(f"the demo cannot make its database {self.database} on that server: "
                                   f"{error.message}", error.sqlstate,
                                   hint="it needs the CREATEDB privilege there (ALTER ROLE ... CREATEDB), or run "
                                        "the demo without --dsn, on the embedded PostgreSQL") from error
        self._admin = server  # from here on, close() drops it (unless keep)
        return (embedded.database_url(self.database) if self._dsn is None else None) \
            or with_database(server, self.database)

    def _drop_database(self) -> None:
        """Drop the demo's database unless keep; what ran in it has stopped by now."""
        if self._admin is None or self.keep:
            return
        try:
            databases.drop(self._admin, self.database, force=True)
            self.dropped = True
        except CourierError as error:
            self.drop_error = error.one_line()
            log.warning("could not drop the demo database", extra={"database": self.database,
                                                                   "error": error.one_line()})

    def __enter__(self) -> DemoRuntime:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _create_endpoints(conn, sink_url: str) -> None:
    for name, spec in DEMO_ENDPOINTS.items():
        config = {"url": spec.get("url", sink_url + spec.get("path", "")), "allow_internal": True}
        if "timeout" in spec:
            config["timeout"] = spec["timeout"]
        policy = {**DEMO_RETRY_POLICY, **spec.get("retry_policy", {})}
        try:  # the sink's port changes from run to run
            endpoints.alter(conn, name, config, policy)
        except NotFound:
            endpoints.create(conn, name, "http", config, policy, description="courier demo")


def _produce(url: str, rate: float, stop: threading.Event) -> None:
    """Send rate messages a second, a small batch to each endpoint every tick."""
    tick = 0.25
    per_batch = max(1, round(rate * tick / len(DEMO_ENDPOINTS)))
    n = 0
    try:
        with connect(url) as conn:
            while rate > 0 and not stop.wait(tick):
                for name in DEMO_ENDPOINTS:
                    # Backpressure or a disabled endpoint: the status shows why.
                    with contextlib.suppress(CourierError):
                        messages.send_batch(conn, name, [{"demo": name, "n": n + i} for i in range(per_batch)])
                n += per_batch
    except CourierError as error:  # the database went away: the demo goes on without traffic
        log.warning("demo producer stopped", extra={"error": error.one_line()})
