"""horizon: producers at a fixed offered rate while a consumer drains, and one session holds a
REPEATABLE READ snapshot (the xmin horizon) for a while, as a report, a backup or a stuck
session does in production. Courier (`courier worker` with no flags, a no-op endpoint) and pgmq
(a consumer reading 100 at a time and deleting them) each run the same schedule:

    warm-up | snapshot held for --pinned-seconds | released, recovery

Row versions made while the snapshot is held cannot be pruned; a queue whose send or claim walks
them slows down as they pile up (the "death spiral" of SKIP LOCKED queues). Reported per side:
the producers' rate and how far behind schedule they fell (pgbench -R's lag) while the snapshot
was held, and the backlog when it was released and at the end. The curve (every 10 s) is in the
notes.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass

from sqlkit.connection import connect

from . import pgmq
from .drain import worker_process
from .pgbench import Progress, run_paced
from .result import Measurement, ScenarioResult
from .scratch import backpressure_out_of_reach

ENDPOINT = "bench-horizon"
PRODUCERS = 16
WARM_UP = 10.0
RECOVERY = 20.0
PAYLOAD = json.dumps({"order_id": 1, "amount": 99.99, "customer": "c-789"})


@dataclass(frozen=True)
class Run:
    progress: list[Progress]
    backlog: list[tuple[float, int]]    # (seconds since start, messages waiting)
    pinned_from: float
    pinned_to: float

    def while_pinned(self) -> list[Progress]:
        return [p for p in self.progress if self.pinned_from < p.at <= self.pinned_to]

    def backlog_at(self, at: float) -> int:
        return min(self.backlog, key=lambda sample: abs(sample[0] - at))[1] if self.backlog else 0

    def curve(self) -> str:
        samples = {round(p.at): p for p in self.progress}
        return "; ".join(f"{at} s: {samples[at].transactions_per_second:.0f}/s, lag {samples[at].lag_ms / 1000:.1f} s, "
                         f"backlog {self.backlog_at(at)}" for at in sorted(samples) if at % 10 == 0)


def _hold_snapshot(dsn: str, start: float, seconds: float) -> None:
    with connect(dsn, autocommit=False) as conn:
        time.sleep(max(0.0, start - time.monotonic()))
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT count(*) FROM courier.endpoints")  # takes the snapshot, and holds it
        time.sleep(seconds)
        conn.rollback()


@dataclass(frozen=True)
class Schedule:
    rate: float
    pinned: float
    warm_up: float = WARM_UP
    recovery: float = RECOVERY


def _run(dsn: str, script: str, schedule: Schedule, waiting: str) -> Run:
    """Producers run `script` on the schedule; `waiting` counts the messages not yet consumed."""
    total = schedule.warm_up + schedule.pinned + schedule.recovery
    started = time.monotonic()
    holder = threading.Thread(target=_hold_snapshot, args=(dsn, started + schedule.warm_up, schedule.pinned),
                              daemon=True)
    holder.start()
    backlog: list[tuple[float, int]] = []
    stop = threading.Event()

    def sample() -> None:
        with connect(dsn) as conn:
            while not stop.wait(1.0):
                backlog.append((time.monotonic() - started, int(conn.execute(waiting).fetchone()[0])))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        progress = run_paced(dsn, script, clients=PRODUCERS, seconds=total, rate=schedule.rate)
    finally:
        stop.set()
        sampler.join()
        holder.join()
    return Run(progress, backlog, schedule.warm_up, schedule.warm_up + schedule.pinned)


# The counters count the queue; what waits in the send stage, or is taken there, is counted apart.
COURIER_WAITING = ("SELECT coalesce(sum(messages), 0) + (SELECT count(*) FROM courier.send_stage) "
                   "FROM courier.queue_depth WHERE status IN ('pending', 'processing')")
PGMQ_WAITING = f"SELECT count(*) FROM pgmq.q_{pgmq.QUEUE}"


def _courier(dsn: str, schedule: Schedule) -> Run:
    with connect(dsn) as conn:
        if not conn.execute("SELECT 1 FROM courier.endpoints WHERE name = %s", (ENDPOINT,)).fetchone():
            conn.execute("SELECT courier.create_endpoint(%s, 'noop', '{}')", (ENDPOINT,))
        backpressure_out_of_reach(conn)
        conn.execute("TRUNCATE courier.queue")
    with worker_process(dsn):
        send = f"SELECT courier.send('{ENDPOINT}', '{PAYLOAD}'::jsonb);\n"
        return _run(dsn, send, schedule, COURIER_WAITING)


def _pgmq(dsn: str, schedule: Schedule) -> Run:
    pgmq.install(dsn)
    with pgmq.draining(dsn):
        return _run(dsn, pgmq.send_script(PAYLOAD), schedule, PGMQ_WAITING)


def horizon(dsn: str, *, clients: int, seconds: float, rounds: int, rate: float = 800.0, pinned: float = 60.0,
            warm_up: float = WARM_UP, recovery: float = RECOVERY) -> list[ScenarioResult]:
    del clients, seconds, rounds  # its own schedule: PRODUCERS clients, warm-up + pinned + recovery
    schedule = Schedule(rate, pinned, warm_up, recovery)
    runs = {"courier": _courier(dsn, schedule)}
    if pgmq.available():
        runs["pgmq"] = _pgmq(dsn, schedule)
    mine, theirs = runs["courier"], runs.get("pgmq")

    def rate_while_pinned(run: Run) -> Measurement:
        held = run.while_pinned()
        return Measurement(sum(p.transactions_per_second for p in held) / max(len(held), 1))

    def worst_lag(run: Run) -> Measurement:
        return Measurement(max((p.lag_ms for p in run.while_pinned()), default=0.0) / 1000)

    def backlog(run: Run, at: float) -> Measurement:
        return Measurement(run.backlog_at(at))

    peer = f"; pgmq: {theirs.curve()}" if theirs else ""
    where = f"{rate:g}/s offered by {PRODUCERS} producers, snapshot held {pinned:g} s"
    return [
        ScenarioResult("horizon", f"producers' rate while held, {where}", "msg/s", rate_while_pinned(mine),
                       rate_while_pinned(theirs) if theirs else None, target_ratio=0.95 if theirs else None,
                       notes=f"courier: {mine.curve()}{peer}"),
        ScenarioResult("horizon", "producers' worst lag behind schedule while held", "s", worst_lag(mine),
                       worst_lag(theirs) if theirs else None, lower_is_better=True),
        ScenarioResult("horizon", "backlog when the snapshot was released", "messages",
                       backlog(mine, mine.pinned_to), backlog(theirs, theirs.pinned_to) if theirs else None,
                       lower_is_better=True),
        ScenarioResult("horizon", f"backlog {recovery:g} s later (recovery without VACUUM)", "messages",
                       backlog(mine, mine.pinned_to + recovery - 1),
                       backlog(theirs, theirs.pinned_to + recovery - 1) if theirs else None, lower_is_better=True),
    ]
