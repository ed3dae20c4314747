"""What `courier demo` runs: the embedded PostgreSQL if no DSN is given, the schema, a local
webhook sink with demo endpoints on it, a producer thread and the worker pool child process,
and their orderly stop."""

from __future__ import annotations

import contextlib
import logging
import threading
from pathlib import Path

from sqlkit import embedded, endpoints, messages, migrate
from sqlkit.connection import connect
from sqlkit.errors import CourierError, NotFound
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


class DemoRuntime:
    """Everything `courier demo` starts, owned in one place so the console and the headless
    loop stop it the same way. `with DemoRuntime(dsn) as demo:` starts it; close() stops it."""

    def __init__(self, dsn: str | None, *, rate: float = 40, workers: int = 16) -> None:
        self._dsn = dsn  # None: the embedded PostgreSQL
        self.rate = rate
        self.workers = workers
        self.url: str | None = None
        """The database, once start() found it."""
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
                url = embedded.start()
            else:
                url = self._dsn
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
        """Stop the producer, drain the pool, stop the sink, then the embedded PostgreSQL if
        start() started it. Bounded (the pool's stop is), idempotent, and safe after a
        start() that failed halfway."""
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
                    if self.started_embedded:
                        embedded.stop()  # the data stays on disk; the next run reuses it

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
