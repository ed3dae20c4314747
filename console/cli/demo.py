"""`courier demo`: the embedded database, demo endpoints on a local webhook sink, a producer
and the worker pool, shown live until Ctrl-C."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time

import click
from rich.live import Live

from console.sink import WebhookSink
from console.workers.pool import PoolSettings, WorkerPool
from sqlkit import embedded, endpoints, messages, migrate, observability
from sqlkit.connection import connect
from sqlkit.dsn import resolve_dsn
from sqlkit.errors import CourierError, NotFound
from sqlkit.messages import SendOptions

from .context import console, dsn_option
from .status import render

# Paths on the sink (console.sink): healthy, ~30% 503, 0.2-1.5 s; and a port nothing
# listens on, whose circuit opens.
DEMO_ENDPOINTS = {
    "demo-healthy": {"path": "/healthy"},
    "demo-flaky": {"path": "/flaky"},
    "demo-slow": {"path": "/slow", "timeout": 5},
    "demo-down": {"url": "http://127.0.0.1:9/down", "timeout": 2},
}
# Short retries, so failures reach the DLQ within a minute instead of an hour.
DEMO_RETRY_POLICY = {"max_retries": 2, "backoff": "fixed", "base_delay_seconds": 2}


@click.command("demo")
@click.option("--rate", type=click.FloatRange(0, 5_000), default=40, show_default=True,
              help="Messages per second the demo producer sends, spread over the endpoints.")
@click.option("--seconds", type=click.FloatRange(0, 86_400), default=0,
              help="Stop after this long (default: run until Ctrl-C).")
@click.option("--workers", type=click.IntRange(1, 1_000), default=16, show_default=True,
              help="Messages in flight at once in the demo's worker pool.")
@dsn_option
def demo(rate: float, seconds: float, workers: int) -> None:
    """Start the embedded PostgreSQL with demo endpoints, traffic and workers, and watch."""
    choice = resolve_dsn(click.get_current_context().meta.get("courier.dsn"))
    with console.status("starting the embedded PostgreSQL..."):
        url = embedded.start() if choice.is_embedded else (choice.dsn or "")
        migrate.migrate(url)
    logging.getLogger("courier").propagate = False  # the live view owns the terminal
    with WebhookSink() as sink:
        with connect(url) as conn:
            _create_endpoints(conn, sink.url)
            messages.send(conn, "demo-healthy", {"urgent": True}, SendOptions(priority=10))
        pool = WorkerPool(url, PoolSettings(concurrency=workers, worker_id="courier-demo"))
        stop = threading.Event()
        threads = [threading.Thread(target=_produce, args=(url, rate, stop), daemon=True),
                   threading.Thread(target=asyncio.run, args=(pool.run(),), daemon=True)]
        for thread in threads:
            thread.start()
        try:
            _watch(url, seconds, threads[1])
        except KeyboardInterrupt:
            pass
        finally:
            stop.set()
            pool.stop_threadsafe()
            with console.status("stopping the workers (in-flight messages finish)..."):
                for thread in threads:
                    thread.join(60)
    console.print(
        f"database: {url}\n"
        "Everything stays in the database: look around with `courier status`, `courier dlq list`, "
        "`courier archive partitions`, `courier events` or psql \"$(courier db url)\"; "
        "run the workers again with `courier worker`.", highlight=False)


def _create_endpoints(conn, sink_url: str) -> None:
    for name, spec in DEMO_ENDPOINTS.items():
        config = {"url": spec.get("url", sink_url + spec.get("path", "")), "allow_internal": True}
        if "timeout" in spec:
            config["timeout"] = spec["timeout"]
        try:  # the sink's port changes from run to run
            endpoints.alter(conn, name, config, DEMO_RETRY_POLICY)
        except NotFound:
            endpoints.create(conn, name, "http", config, DEMO_RETRY_POLICY, description="courier demo")


def _produce(url: str, rate: float, stop: threading.Event) -> None:
    """Send rate messages a second, a small batch to each endpoint every tick."""
    tick = 0.25
    per_batch = max(1, round(rate * tick / len(DEMO_ENDPOINTS)))
    n = 0
    with connect(url) as conn:
        while rate > 0 and not stop.wait(tick):
            for name in DEMO_ENDPOINTS:
                # Backpressure or a disabled endpoint: the live view shows why.
                with contextlib.suppress(CourierError):
                    messages.send_batch(conn, name, [{"demo": name, "n": n + i} for i in range(per_batch)])
            n += per_batch


def _watch(url: str, seconds: float, pool_thread: threading.Thread) -> None:
    deadline = time.monotonic() + seconds if seconds else None
    with connect(url) as conn, Live(console=console, refresh_per_second=2, screen=False) as live:
        while pool_thread.is_alive() and (deadline is None or time.monotonic() < deadline):
            live.update(render(observability.queue_status(conn), title="Courier demo (Ctrl-C stops)",
                               compact=True))
            time.sleep(1.0)


COMMANDS = [demo]
