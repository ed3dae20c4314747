"""`courier demo`: a database of its own (courier_demo) on the embedded PostgreSQL or the given
server, demo endpoints on a local webhook sink, a producer and the worker pool
(console.demo.DemoRuntime), watched in the console or, with --headless, through a status line
every 5 seconds."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import click

from console.demo import DEMO_DATABASE, DEMO_ENDPOINTS, DemoRuntime
from sqlkit import observability
from sqlkit.connection import connect
from sqlkit.dsn import resolve_dsn, without_password
from sqlkit.errors import CourierError

from .context import FiniteFloatRange, common_options, console, emit, error_console, machine_output

STATUS_EVERY = 5.0
"""Seconds between two headless status lines."""


@click.command("demo")
@click.option("--rate", type=FiniteFloatRange(0, 5_000), default=40, show_default=True,
              help="Messages per second the demo producer sends, spread over the endpoints.")
@click.option("--seconds", type=FiniteFloatRange(0, 86_400), default=0,
              help="Stop after this long (default: run until Ctrl-C).")
@click.option("--workers", type=click.IntRange(1, 1_000), default=16, show_default=True,
              help="Messages in flight at once in the demo's worker pool.")
@click.option("--headless", is_flag=True,
              help="No console: print a status line every 5 seconds (for scripts, CI and dumb terminals).")
@click.option("--keep", is_flag=True,
              help="Carry on with the demo database of an earlier --keep run, and keep it at exit to look "
                   "around in (default: made afresh, dropped at exit).")
@click.option("--database", metavar="NAME", default=DEMO_DATABASE, show_default=True,
              envvar="COURIER_DEMO_DATABASE",
              help="The demo's own database, made beside yours on the same server (env: COURIER_DEMO_DATABASE).")
@common_options
def demo(rate: float, seconds: float, workers: int, headless: bool, keep: bool, database: str) -> None:
    """Demo endpoints, traffic and workers in a database of their own, and watch.

    The demo runs in database courier_demo (--database) on the embedded PostgreSQL, or, given
    --dsn / COURIER_DSN, on that server beside the database the DSN names, which it never
    writes to. It is made afresh at start and dropped at exit, so your own database never sees
    the demo's endpoints, open circuits or backlog; --keep keeps it (and carries on with it
    next time). If this command started the embedded PostgreSQL, quitting stops it; a server
    that was already running is left running."""
    choice = resolve_dsn(click.get_current_context().meta.get("courier.dsn"))
    runtime = DemoRuntime(None if choice.is_embedded else (choice.dsn or ""), rate=rate, workers=workers,
                          database=database, keep=keep)
    began: float | None = None
    # Until the loop takes over signals, SIGTERM interrupts like Ctrl-C, so that the cleanup
    # below runs even for a demo stopped while it starts.
    previous_term = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with _status("starting the demo (embedded PostgreSQL, sink, producer, workers)..."):
            baseline = _delivered_total(runtime.start())
        began = time.monotonic()
        if headless or not _interactive():
            _run_headless(runtime, seconds)
        else:
            _run_console(runtime, seconds)
    finally:
        # Signals are held off while stopping, which is bounded: a second Ctrl-C must not
        # leave the embedded PostgreSQL or the worker child behind.
        with _stop_signals(), _status("stopping the workers (in-flight messages finish)..."):
            try:
                outcome = _finish(runtime, baseline, began) if began is not None else None
            finally:
                runtime.close()
                signal.signal(signal.SIGTERM, previous_term)
    assert outcome is not None
    outcome.embedded_stopped = runtime.started_embedded
    _summary(runtime, outcome)
    if outcome.worker_exit_code not in (0, None) or outcome.pool_died:
        sys.exit(1)


@dataclass
class Snapshot:
    """One status line's worth: this run's deliveries and the queue's state."""

    delivered: int
    pending: int
    processing: int
    dlq: int
    circuits: dict[str, str]

    def line(self, elapsed: float) -> str:
        opened = [f"{name}={state}" for name, state in self.circuits.items() if state != "closed"]
        return (f"{elapsed:.0f}s  delivered {self.delivered}  pending {self.pending}  dlq {self.dlq}  "
                f"circuits: {', '.join(opened) or 'all closed'}")


@dataclass
class DemoOutcome:
    dsn: str
    seconds: float
    final: Snapshot | None
    worker_exit_code: int | None
    pool_died: bool
    """The worker child ended before the demo stopped it."""
    embedded_stopped: bool = False


# Where the console plugs in ---------------------------------------------------------------

def _interactive() -> bool:
    """A terminal to draw the console in; piped or captured output gets the headless demo."""
    return sys.stdin.isatty() and sys.stdout.isatty()


def _run_console(runtime: DemoRuntime, seconds: float) -> None:
    """The console on the started runtime (its Workers pane drives runtime.pool) until the
    operator quits, SIGTERM arrives or `seconds` pass (0: no limit); demo() stops the rest."""
    from .console import run_console

    run_console(runtime.url or "", runtime.pool, seconds)


def _run_headless(runtime: DemoRuntime, seconds: float) -> None:
    """A status line every 5 seconds until `seconds` pass, Ctrl-C or SIGTERM, or the worker
    pool dies. Under --json the lines go to stderr: stdout carries only the final summary."""
    began = time.monotonic()
    deadline = began + seconds if seconds else None
    with connect(runtime.url or "") as conn, _stop_signals() as stop:
        baseline = _delivered_total(conn)
        click.echo(_banner(runtime, seconds), err=machine_output())
        while True:
            left = STATUS_EVERY if deadline is None else min(STATUS_EVERY, deadline - time.monotonic())
            if left > 0 and stop.wait(left):
                return
            state = runtime.pool.state
            if not state.running:
                error_console.print(f"the worker pool exited with code {state.exit_code}; "
                                    f"its log: {runtime.worker_log}", highlight=False)
                return
            click.echo(_read(conn, baseline).line(time.monotonic() - began), err=machine_output())
            if deadline is not None and time.monotonic() >= deadline - 0.01:
                return


def _banner(runtime: DemoRuntime, seconds: float) -> str:
    pool = runtime.pool.state
    until = f"for {seconds:g}s, " if seconds else ""
    fate = "kept at exit" if runtime.keep else "dropped at exit"
    return (f"Courier demo ({until}Ctrl-C stops) in database {runtime.database} ({fate}): {runtime.rate:g} "
            f"messages/s to {', '.join(DEMO_ENDPOINTS)} on the sink at {runtime.sink.url if runtime.sink else '?'}; "
            f"{pool.concurrency} workers in process {pool.pid} (log: {pool.log_path})")


def _finish(runtime: DemoRuntime, baseline: int, began: float) -> DemoOutcome:
    """Stop the pool (the rest stops in close()) and read the queue one last time."""
    seconds = time.monotonic() - began
    pool_died = not runtime.pool.state.running
    runtime.pool.stop()
    final = None
    with contextlib.suppress(CourierError), connect(runtime.url or "") as conn:
        final = _read(conn, baseline)
    return DemoOutcome(runtime.url or "", seconds, final, runtime.pool.state.exit_code, pool_died)


# Reading the queue --------------------------------------------------------------------------

def _delivered_total(conn_or_url) -> int:
    """Deliveries to the demo endpoints so far, from the maintained counters in metrics()."""
    if isinstance(conn_or_url, str):
        with connect(conn_or_url) as conn:
            return _delivered_total(conn)
    return int(sum(m.metric_value for m in observability.metrics(conn_or_url)
                   if m.metric_name == "messages_delivered_total" and m.labels.get("endpoint") in DEMO_ENDPOINTS))


def _read(conn, baseline: int) -> Snapshot:
    state = observability.queue_status(conn)
    return Snapshot(delivered=_delivered_total(conn) - baseline, pending=state.queue_depth.get("pending", 0),
                    processing=state.queue_depth.get("processing", 0), dlq=state.dlq_depth,
                    circuits={e.endpoint: e.circuit for e in state.endpoints if e.endpoint in DEMO_ENDPOINTS})


# Plumbing -----------------------------------------------------------------------------------

@contextlib.contextmanager
def _stop_signals() -> Iterator[threading.Event]:
    """An event set by SIGTERM or Ctrl-C, so that either ends the demo through the same
    orderly stop; the previous handlers come back afterwards."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _status(message: str) -> Iterator[None]:
    """A spinner on an interactive terminal, nothing otherwise (scripts read stdout)."""
    if error_console.is_terminal and not machine_output():
        with error_console.status(message):
            yield
    else:
        yield


def _summary(runtime: DemoRuntime, outcome: DemoOutcome) -> None:
    final = outcome.final
    data = {
        "dsn": outcome.dsn, "seconds": round(outcome.seconds, 1),
        "delivered": final.delivered if final else None, "pending": final.pending if final else None,
        "dlq": final.dlq if final else None, "circuits": final.circuits if final else None,
        "worker_exit_code": outcome.worker_exit_code, "worker_log": str(runtime.worker_log),
        "embedded_stopped": outcome.embedded_stopped,
        "database": runtime.database, "database_reused": runtime.reused, "database_kept": runtime.keep,
        "database_dropped": runtime.dropped,
    }

    def render() -> None:
        if final is not None:
            console.print(f"stopped: {final.line(outcome.seconds)}", highlight=False)
        if outcome.embedded_stopped:
            console.print("the embedded PostgreSQL this demo started is stopped"
                          + ("; `courier db start` starts it again" if runtime.keep else ""), highlight=False)
        if runtime.keep:
            shown, password = without_password(outcome.dsn)
            shown = outcome.dsn if not password else shown  # a password is never printed
            console.print(
                f"database {runtime.database} is kept: look around with COURIER_DSN='{shown}' and "
                "`courier status`, `courier dlq list`, `courier archive partitions`, `courier events`, or "
                f"psql '{shown}'{' (with your password)' if password else ''}. `courier demo --keep` carries "
                "on with it; `courier demo` starts afresh and drops it at exit.", highlight=False)
        elif runtime.dropped:
            console.print(f"database {runtime.database}, the demo's own, is dropped; your database was not "
                          "touched. `courier demo --keep` keeps it to look around in.", highlight=False)
        else:
            console.print(f"database {runtime.database} could not be dropped ({runtime.drop_error}): drop it "
                          f"with DROP DATABASE {runtime.database}, or run `courier demo` again", highlight=False)

    emit(data, render)


COMMANDS = [demo]
