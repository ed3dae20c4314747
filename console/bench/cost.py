"""cost: what each queue operation costs the database per message, in units no noisy machine can
blur, for Courier and pgmq (the peer) side by side in one database, and PgQ beside them where the
server has its extension (console/bench/pgq.py; in each row's notes, for context).

Per message, for every operation:
- WAL bytes: pg_current_wal_insert_lsn() before and after the operation's transactions, commit
  records and commit-time triggers included. This is what sizes a user's replication and disk.
- WAL records and full-page images, and shared buffers touched (hit + read): EXPLAIN (ANALYZE,
  BUFFERS, WAL) of each statement, which counts everything the statement ran, the functions it
  called and their triggers included, but not work deferred to commit.
- statements executed (nested ones included), where pg_stat_statements is loaded.
- instructions, where valgrind and PostgreSQL's server binaries are installed (and not turned
  off with --no-instructions): CPU work as a count no machine's speed or load can change. A
  private throwaway cluster (console/bench/instructions.py) runs under callgrind; the statements
  run plainly there, without EXPLAIN, and a backend that ran the warm-up and the measured units
  counts the instructions of one that ran only the warm-up less. It takes a few minutes.

As in a deployment with `courier worker` running, the maintenance leader's estimate of the active
count is kept fresh during the measurement (courier.estimate_active_messages(), once a second),
so sends far below max_queue_size compare with it rather than read every depth counter.

Each operation is warmed up first (plans cached, the pages it touches read in), and its queue
filled after a CHECKPOINT where the role may run one, so full-page images do not depend on when
the server's last checkpoint happened. The counts then repeat run after run: one run is enough,
which is why this scenario ignores --seconds and --rounds.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import psycopg

from sqlkit import migrate
from sqlkit.connection import connect
from sqlkit.errors import CourierError

from . import instructions as callgrind
from . import pgmq, pgq
from .result import Measurement, ScenarioResult
from .scratch import backpressure_out_of_reach, leader_estimates, stage_lapsed

ENDPOINT = "bench-cost"
TOPIC = "bench-cost-topic"
# receive's consumers have a topic of their own, as a topic consumed by receive alone has no lease
# to look for (endpoints.leases, migration 0059); TOPIC's consumers dequeue, and it is marked so.
RECEIVE_TOPIC = "bench-cost-receive"
PAYLOAD = json.dumps({"order_id": 1, "amount": 99.99, "customer": "c-789"})
WARMUP_UNITS = 20


@dataclass
class Counts:
    """What a run of statements cost, summed."""

    wal_bytes: int = 0
    wal_records: int = 0
    wal_fpi: int = 0
    buffers: int = 0
    statements: int = 0
    messages: int = 0

    def per_message(self, name: str) -> float:
        return getattr(self, name) / max(self.messages, 1)


class Runner(Protocol):
    """What an operation's unit runs its statements through."""

    def run(self, statement: str, params: tuple = ()) -> None: ...

    def fetch(self, statement: str, params: tuple = ()) -> list[tuple]: ...

    def uncounted(self, statement: str, params: tuple = ()) -> None: ...


@dataclass
class Meter:
    """Runs statements, each in a transaction of its own, under EXPLAIN, adding up their counts."""

    conn: psycopg.Connection
    counts: Counts = field(default_factory=Counts)
    uncounted_wal: int = 0

    def run(self, statement: str, params: tuple = ()) -> None:
        plan = self.conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, WAL, COSTS OFF, TIMING OFF, FORMAT JSON) {statement}",
                                 params).fetchone()[0]
        self.conn.commit()
        top = plan[0]["Plan"]
        self.counts.buffers += top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)
        self.counts.wal_records += top.get("WAL Records", 0)
        self.counts.wal_fpi += top.get("WAL FPI", 0)

    def fetch(self, statement: str, params: tuple = ()) -> list[tuple]:
        """Not counted: what the harness needs to know between measured statements."""
        rows = self.conn.execute(f"/* bench harness */ {statement}", params).fetchall()
        self.conn.commit()
        return rows

    def uncounted(self, statement: str, params: tuple = ()) -> None:
        """Not counted: what a worker would do between measured statements; the WAL it writes
        is taken out of the window's."""
        lsn = "/* bench harness */ SELECT pg_current_wal_insert_lsn()"
        before = self.conn.execute(lsn).fetchone()[0]
        self.conn.execute(f"/* bench harness */ {statement}", params)
        self.conn.commit()
        self.uncounted_wal += int(self.conn.execute(f"{lsn} - %s::pg_lsn", (before,)).fetchone()[0])
        self.conn.commit()


@dataclass
class Plain:
    """Runs statements as a client does, each in a transaction of its own, without EXPLAIN (which
    costs instructions of its own), for the instructions count. What the harness needs to know
    in between is asked on another connection, so that it stays out of the count."""

    conn: psycopg.Connection
    harness: psycopg.Connection

    def run(self, statement: str, params: tuple = ()) -> None:
        self.conn.execute(statement, params)
        self.conn.commit()

    def fetch(self, statement: str, params: tuple = ()) -> list[tuple]:
        rows = self.harness.execute(f"/* bench harness */ {statement}", params).fetchall()
        self.harness.commit()
        return rows

    def uncounted(self, statement: str, params: tuple = ()) -> None:
        self.harness.execute(f"/* bench harness */ {statement}", params)
        self.harness.commit()


Unit = Callable[[Runner], None]


@dataclass(frozen=True)
class Operation:
    name: str
    messages: int                       # per unit
    units: int                          # measured units
    courier: Unit
    pgmq: Unit
    pgq: Unit                           # PgQ's nearest operation, where the server has it
    preload: int = 0                    # messages each side holds before it starts
    counted: int = 300                  # measured units for the instructions count, under callgrind
    topic: str = TOPIC                  # the pull topic the preload fills

    def unit(self, side: str) -> Unit:
        return {"courier": self.courier, "pgmq": self.pgmq, "pgq": self.pgq}[side]


def _pgq_insert_event(m: Runner) -> None:
    m.run("SELECT pgq.insert_event(%s, 'bench', %s)", (pgq.QUEUE, PAYLOAD))


def _pgq_insert_events(size: int) -> Unit:
    return lambda m: m.run("SELECT pgq.insert_event(%s, 'bench', p) FROM unnest(%s::text[]) p",
                           (pgq.QUEUE, _batch(size)))


def _pgq_take_batch(m: Runner) -> None:
    """One tick's batch, whose size the fill made the operation's (pgq.fill)."""
    m.run("SELECT public.bench_pgq_take(%s, %s)", (pgq.QUEUE, pgq.CONSUMER))


def _courier_send(endpoint: str) -> Unit:
    return lambda m: m.run("SELECT courier.send(%s, %s::jsonb)", (endpoint, PAYLOAD))


def _courier_enqueue(m: Runner, topic: str = TOPIC) -> None:
    m.run("SELECT courier.enqueue(%s, %s::jsonb)", (topic, PAYLOAD))


def _pgmq_send(m: Runner) -> None:
    m.run("SELECT pgmq.send(%s, %s::jsonb)", (pgmq.QUEUE, PAYLOAD))


def _batch(size: int) -> list[str]:
    return [json.dumps({"order_id": n, "amount": 99.99}) for n in range(size)]


def _courier_send_batch(size: int) -> Unit:
    def unit(m: Runner) -> None:
        m.run("SELECT courier.send_batch(%s, %s::jsonb[])", (ENDPOINT, _batch(size)))
        # A running worker's claims take the staged batch, and the next one stages too (a batch
        # stages only while claims take the stage: migration 0055). Their work is the claim's.
        m.uncounted("DELETE FROM courier.send_stage")
    return unit


def _courier_enqueue_batch(size: int) -> Unit:
    def unit(m: Runner) -> None:
        m.run("SELECT courier.enqueue_batch(%s, %s::jsonb[])", (TOPIC, _batch(size)))
        m.uncounted("DELETE FROM courier.send_stage")  # a consumer's dequeues take it, as for send_batch
    return unit


def _pgmq_send_batch(size: int) -> Unit:
    return lambda m: m.run("SELECT pgmq.send_batch(%s, %s::jsonb[])", (pgmq.QUEUE, _batch(size)))


Settle = Callable[[Runner, list[tuple]], None]  # what a unit does with the messages it took


def _courier_settle(call: str) -> Settle:
    """`call`: courier.<function>(ids, leases, ...) with placeholders for the ids and leases."""
    return lambda m, leased: m.run(f"SELECT * FROM courier.{call}", ([r[0] for r in leased], [r[1] for r in leased]))


ACK = _courier_settle("ack(%s::bigint[], %s::integer[])")


def _courier_dequeue(size: int, *settles: Settle) -> Unit:
    def unit(m: Runner) -> None:
        m.run("SELECT * FROM courier.dequeue(%s, %s, 60)", (TOPIC, size))
        # Leased in the queue, or in the stage (migration 0057).
        leased = m.fetch("SELECT id, lease FROM courier.queue WHERE status = 'processing' AND visible_at IS NOT NULL "
                         "UNION ALL SELECT id, lease FROM courier.send_stage WHERE visible_until IS NOT NULL")
        for settle in settles:
            settle(m, leased)
    return unit


def _courier_dequeue_ack(size: int) -> Unit:
    return _courier_dequeue(size, ACK)


def _pgmq_set_vt(seconds: int) -> Settle:
    def settle(m: Runner, read: list[tuple]) -> None:
        for (msg_id,) in read:
            m.run("SELECT * FROM pgmq.set_vt(%s, %s::bigint, %s::integer)", (pgmq.QUEUE, msg_id, seconds))
    return settle


def _pgmq_delete(m: Runner, read: list[tuple]) -> None:
    m.run("SELECT * FROM pgmq.delete(%s, %s::bigint[])", (pgmq.QUEUE, [r[0] for r in read]))


def _pgmq_read(size: int, *settles: Settle) -> Unit:
    """Held: under the read's visibility timeout (a message set visible again keeps its read_ct)."""
    def unit(m: Runner) -> None:
        m.run("SELECT * FROM pgmq.read(%s, 60, %s)", (pgmq.QUEUE, size))
        read = m.fetch(f"SELECT msg_id FROM pgmq.q_{pgmq.QUEUE} WHERE vt > clock_timestamp()")
        for settle in settles:
            settle(m, read)
    return unit


def _pgmq_read_delete(size: int) -> Unit:
    return _pgmq_read(size, _pgmq_delete)


def _courier_push_delivery(size: int) -> Unit:
    """A worker's cycle, as its pool runs it: `size` sends to a push endpoint, then one
    report_and_claim that reports the batch it holds delivered and claims the one just sent."""
    def unit(m: Runner) -> None:
        for _ in range(size):
            m.run("SELECT courier.send(%s, %s::jsonb)", (ENDPOINT, PAYLOAD))
        # Claimed in the queue, or in the stage (migration 0058).
        held = m.fetch("SELECT id, lease FROM courier.queue WHERE status = 'processing' AND visible_at IS NULL "
                       "UNION ALL SELECT id, lease FROM courier.send_stage WHERE worker_id IS NOT NULL")
        m.run("SELECT * FROM courier.report_and_claim('bench-cost', %s, (SELECT id FROM courier.endpoints "
              "WHERE name = %s), %s::bigint[], %s::integer[], %s::text[], %s::text[])",
              (size, ENDPOINT, [r[0] for r in held], [r[1] for r in held], ["success"] * len(held), [None] * len(held)))
    return unit


def _courier_push_drain(size: int) -> Unit:
    """A worker draining a backlog in the queue, as drain-noop's: one report_and_claim that reports
    the `size` messages it holds delivered (to the archive) and claims the next `size`."""
    def unit(m: Runner) -> None:
        held = m.fetch("SELECT id, lease FROM courier.queue WHERE status = 'processing' AND visible_at IS NULL")
        m.run("SELECT * FROM courier.report_and_claim('bench-cost', %s, (SELECT id FROM courier.endpoints "
              "WHERE name = %s), %s::bigint[], %s::integer[], %s::text[], %s::text[])",
              (size, ENDPOINT, [r[0] for r in held], [r[1] for r in held], ["success"] * len(held), [None] * len(held)))
    return unit


def _pgmq_archive(m: Runner, read: list[tuple]) -> None:
    m.run("SELECT * FROM pgmq.archive(%s, %s::bigint[])", (pgmq.QUEUE, [r[0] for r in read]))


def _courier_pull_delivery(size: int, take: Unit, topic: str = TOPIC) -> Unit:
    """A pull topic's messages from producer to consumer: `size` enqueues, each in its own
    transaction, then `take` (a dequeue and ack, or a receive) of the lot."""
    def unit(m: Runner) -> None:
        for _ in range(size):
            _courier_enqueue(m, topic)
        take(m)
    return unit


def _pgmq_send_pop(size: int) -> Unit:
    def unit(m: Runner) -> None:
        for _ in range(size):
            _pgmq_send(m)
        _pgmq_pop(size)(m)
    return unit


def _pgmq_send_read_delete(size: int) -> Unit:
    def unit(m: Runner) -> None:
        for _ in range(size):
            _pgmq_send(m)
        _pgmq_read_delete(size)(m)
    return unit


def _pgq_insert_take(size: int) -> Unit:
    def unit(m: Runner) -> None:
        for _ in range(size):
            _pgq_insert_event(m)
        m.run("SELECT pgq.ticker(%s)", (pgq.QUEUE,))  # pgqd's work, counted: it cuts the batch
        _pgq_take_batch(m)
    return unit


def _courier_receive(size: int) -> Unit:
    return lambda m: m.run("SELECT * FROM courier.receive(%s, %s)", (RECEIVE_TOPIC, size))


def _pgmq_pop(size: int) -> Unit:
    return lambda m: m.run("SELECT * FROM pgmq.pop(%s, %s)", (pgmq.QUEUE, size))


OPERATIONS = (
    Operation("send", 1, 500, _courier_send(ENDPOINT), _pgmq_send, _pgq_insert_event),
    Operation("send to a pull topic", 1, 500, _courier_send(TOPIC), _pgmq_send, _pgq_insert_event),
    Operation("enqueue (pull topic)", 1, 500, _courier_enqueue, _pgmq_send, _pgq_insert_event),
    Operation("send_batch of 100", 100, 20, _courier_send_batch(100), _pgmq_send_batch(100), _pgq_insert_events(100),
              counted=10),
    Operation("enqueue_batch of 100", 100, 20, _courier_enqueue_batch(100), _pgmq_send_batch(100),
              _pgq_insert_events(100), counted=10),
    Operation("dequeue(1) + ack", 1, 300, _courier_dequeue_ack(1), _pgmq_read_delete(1), _pgq_take_batch,
              preload=1, counted=150),
    Operation("dequeue(10) + ack", 10, 50, _courier_dequeue_ack(10), _pgmq_read_delete(10), _pgq_take_batch,
              preload=1, counted=30),
    Operation("dequeue(100) + ack", 100, 20, _courier_dequeue_ack(100), _pgmq_read_delete(100), _pgq_take_batch,
              preload=1, counted=10),
    # A message nacked or released is due again at once, behind the preload (due earlier): each
    # unit takes a message of its own, nacked once, far below max_retries. pgmq's read takes the
    # lowest id, the same message each time.
    Operation("dequeue(1) + nack", 1, 300, _courier_dequeue(1, _courier_settle("nack(%s::bigint[], %s::integer[])")),
              _pgmq_read(1, _pgmq_set_vt(0)), _pgq_take_batch, preload=1, counted=150),
    Operation("dequeue(1) + release", 1, 300,
              _courier_dequeue(1, _courier_settle("release(%s::bigint[], %s::integer[])")),
              _pgmq_read(1, _pgmq_set_vt(0)), _pgq_take_batch, preload=1, counted=150),
    Operation("dequeue(1) + extend + ack", 1, 300,
              _courier_dequeue(1, _courier_settle("extend_lease(%s::bigint[], %s::integer[], 60)"), ACK),
              _pgmq_read(1, _pgmq_set_vt(60), _pgmq_delete), _pgq_take_batch, preload=1, counted=150),
    # A push message's whole life in the database: sent, claimed and reported by a worker.
    Operation("push: send + claim(10) + report", 10, 50, _courier_push_delivery(10), _pgmq_send_read_delete(10),
              _pgq_insert_take(10), counted=30),
    # A backlog in the queue drained as drain-noop's worker drains it, each delivered message kept in
    # the archive: pgmq's read and archive (its move to pgmq.a_<queue>) are its peer.
    Operation("push: claim(100) + report of a backlog", 100, 20, _courier_push_drain(100),
              _pgmq_read(100, _pgmq_archive), _pgq_take_batch, preload=1, counted=10, topic=ENDPOINT),
    # A pull message's whole life, enqueued one at a time and taken ten at a time.
    Operation("pull: enqueue + dequeue(10) + ack", 10, 50, _courier_pull_delivery(10, _courier_dequeue_ack(10)),
              _pgmq_send_read_delete(10), _pgq_insert_take(10), counted=30),
    Operation("pull: enqueue + receive(10)", 10, 50, _courier_pull_delivery(10, _courier_receive(10), RECEIVE_TOPIC),
              _pgmq_send_pop(10), _pgq_insert_take(10), counted=30),
    Operation("receive(1)", 1, 500, _courier_receive(1), _pgmq_pop(1), _pgq_take_batch, preload=1,
              topic=RECEIVE_TOPIC),
    Operation("receive(100)", 100, 20, _courier_receive(100), _pgmq_pop(100), _pgq_take_batch, preload=1,
              counted=10, topic=RECEIVE_TOPIC),
)

METRICS = (
    ("wal_bytes", "WAL bytes/msg", True),
    ("wal_records", "WAL records/msg", False),
    ("buffers", "shared buffers/msg", True),
    ("statements", "statements/msg", False),
)
INSTRUCTIONS = "instructions/msg"


def _prepare(dsn: str) -> None:
    with connect(dsn) as conn:
        for name, protocol in ((ENDPOINT, "noop"), (TOPIC, "pull"), (RECEIVE_TOPIC, "pull")):
            if not conn.execute("SELECT 1 FROM courier.endpoints WHERE name = %s", (name,)).fetchone():
                conn.execute("SELECT courier.create_endpoint(%s, %s, '{}')", (name, protocol))
        # Its first dequeue marks the topic (once in its life) before any operation is measured.
        conn.execute("SELECT count(*) FROM courier.dequeue(%s)", (TOPIC,))
        backpressure_out_of_reach(conn)
    pgmq.install(dsn)
    with connect(dsn, autocommit=True) as conn:
        # The schema just built left dead catalog rows, which a measured operation's catalog
        # reads would otherwise prune, writing full-page images of catalog pages into its count.
        conn.execute("VACUUM")


def _statements_counted(conn: psycopg.Connection) -> bool:
    """pg_stat_statements, tracking nested statements, where the server preloads it."""
    try:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("SET pg_stat_statements.track = 'all'")
        conn.execute("SELECT pg_stat_statements_reset()")
        conn.commit()
        return True
    except psycopg.Error:
        conn.rollback()
        return False


def _statement_calls(conn: psycopg.Connection) -> int:
    calls = conn.execute(
        "/* bench harness */ SELECT coalesce(sum(calls), 0) FROM pg_stat_statements "
        "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        "AND query !~* '^(EXPLAIN|/\\* bench harness)' AND query NOT IN ('COMMIT', 'BEGIN')").fetchone()[0]
    conn.commit()
    return int(calls)


def _fill(conn: psycopg.Connection, side: str, messages: int, per_unit: int = 1, topic: str = TOPIC) -> None:
    """Each side's queue holds exactly `messages` messages, due now, made as its send makes them
    (PgQ's in batches of `per_unit`, one tick each: pgq.fill)."""
    if side == "pgq":
        pgq.fill(conn, messages // per_unit, per_unit)
        return
    # The sends' rows, staged ones too, and what earlier operations archived: each side's archive
    # the same for every backend counted.
    conn.execute("TRUNCATE courier.queue, courier.send_stage, courier.archive")
    conn.execute(f"TRUNCATE pgmq.q_{pgmq.QUEUE}, pgmq.a_{pgmq.QUEUE}")
    if side == "courier" and messages:
        # To the queue, whatever the leader's thread said (a batch to a pull topic stages), and
        # the stage as alive after as before, for the sends measured next.
        alive_until = conn.execute("SELECT stage_until FROM courier.send_limits").fetchone()[0]
        # In one transaction: the leader's thread, which keeps the stage alive every second, waits
        # for it. Between two, it could make the stage alive again before the batch, which then
        # staged, and a dequeue that took a staged backlog moved the rest of it into the queue: a
        # random extra of 100 to 400 million instructions in one of the two backends whose
        # difference is the count (dequeue(100) + ack counted 519,349 and -130,602; receive(100)
        # -189,307).
        with conn.transaction():
            stage_lapsed(conn)
            conn.execute("SELECT courier.send_batch(%s, array_agg(jsonb_build_object('n', g))) "
                         "FROM generate_series(1, %s::int) g", (topic, messages))
        conn.execute("UPDATE courier.send_limits SET stage_until = %s", (alive_until,))
        if conn.execute("SELECT count(*) FROM courier.send_stage").fetchone()[0]:
            raise RuntimeError("the bench's fill was staged: its queue is not what it measures")
    elif messages:
        conn.execute("SELECT pgmq.send_batch(%s, array_agg(jsonb_build_object('n', g))) "
                     "FROM generate_series(1, %s::int) g", (pgmq.QUEUE, messages))
    conn.commit()
    conn.execute("VACUUM ANALYZE courier.queue")
    conn.execute(f"VACUUM ANALYZE pgmq.q_{pgmq.QUEUE}")
    conn.execute("VACUUM courier.queue_depth")


def _checkpoint(conn: psycopg.Connection) -> None:
    with contextlib.suppress(psycopg.Error):  # not a superuser nor pg_checkpoint: images may show in the counts
        conn.execute("CHECKPOINT")


def _needed(operation: Operation, units: int) -> int:
    return operation.messages * (units + WARMUP_UNITS) if operation.preload else 0


def measure(dsn: str, operation: Operation, side: str) -> Counts:
    unit = operation.unit(side)
    needed = _needed(operation, operation.units)
    with connect(dsn, autocommit=True) as admin:
        # Before the fill: pages made after a checkpoint are written without full-page images.
        _checkpoint(admin)
        _fill(admin, side, needed, operation.messages, operation.topic)
    with connect(dsn) as conn, leader_estimates(dsn, move_staged=False):
        meter = Meter(conn)
        for _ in range(WARMUP_UNITS):
            unit(meter)
        counted = _statements_counted(conn)
        meter.counts, meter.uncounted_wal = Counts(), 0
        start = conn.execute("/* bench harness */ SELECT pg_current_wal_insert_lsn()").fetchone()[0]
        conn.commit()
        for _ in range(operation.units):
            unit(meter)
        meter.counts.wal_bytes = int(conn.execute("/* bench harness */ SELECT pg_current_wal_insert_lsn() - %s::pg_lsn",
                                                  (start,)).fetchone()[0]) - meter.uncounted_wal
        conn.commit()
        if counted:
            meter.counts.statements = _statement_calls(conn)
        meter.counts.messages = operation.messages * operation.units
        return meter.counts


def _prepare_private(dsn: str) -> None:
    """The private cluster's database, made as the scratch database is."""
    migrate.migrate(dsn)
    _prepare(dsn)
    pgq.install(dsn)


@dataclass
class Counter:
    """The callgrind'd private cluster, and what the harness keeps open on it through the pass: its
    own connections (each backend pays valgrind's translation of the code it runs) and the
    maintenance leader's estimates."""

    cluster: callgrind.Cluster
    admin: psycopg.Connection
    harness: psycopg.Connection


@contextlib.contextmanager
def counter() -> Iterator[Counter]:
    with callgrind.cluster(_prepare_private) as cluster, connect(cluster.dsn) as admin, \
            connect(cluster.dsn) as harness, leader_estimates(cluster.dsn, move_staged=False):
        yield Counter(cluster, admin, harness)


def instructions_per_message(counting: Counter, operation: Operation, side: str, units: int | None = None) -> float:
    """Instructions per message of `operation` on one side: those of a backend that runs the
    warm-up and `units` units (default: operation.counted), less those of one that runs only the
    warm-up, each after the same fill of the queue."""
    unit = operation.unit(side)
    units = operation.counted if units is None else units

    def backend(count: int) -> int:
        _checkpoint(counting.admin)
        _fill(counting.admin, side, _needed(operation, units), operation.messages, operation.topic)
        # Fresh for the first send, whenever the leader's thread next gets to it.
        counting.admin.execute("/* bench harness */ SELECT courier.estimate_active_messages()")
        runner = lambda conn: Plain(conn, counting.harness)  # noqa: E731
        return counting.cluster.instructions(lambda conn: [unit(runner(conn)) for _ in range(count)])

    measured = backend(WARMUP_UNITS + units)
    return (measured - backend(WARMUP_UNITS)) / (units * operation.messages)


@dataclass(frozen=True)
class Instructions:
    """Instructions per message by operation name, (courier, pgmq), and PgQ's where the private
    cluster has it; or why there are none."""

    per_message: dict[str, tuple[float, float]]
    seconds: float = 0.0
    version: str = ""
    missing: str = ""
    pgq: dict[str, float] = field(default_factory=dict)


def count_instructions(operations: tuple[Operation, ...], *, required: bool = False) -> Instructions:
    """Counted on a private callgrind'd cluster; where that cannot run, or fails to, the figures
    are left out with the reason (raised instead when they were asked for)."""
    reason = callgrind.unavailable()
    if reason:
        return Instructions({}, missing=reason)
    started = time.monotonic()
    try:
        with counter() as counting:
            found = {op.name: (instructions_per_message(counting, op, "courier"),
                               instructions_per_message(counting, op, "pgmq")) for op in operations}
            theirs_pgq = ({op.name: instructions_per_message(counting, op, "pgq") for op in operations}
                          if pgq.version(counting.admin) else {})
            return Instructions(found, time.monotonic() - started, counting.cluster.version, pgq=theirs_pgq)
    except (OSError, RuntimeError, TimeoutError, psycopg.Error) as error:
        if required:
            raise CourierError(f"instructions not measured: {error}") from error
        return Instructions({}, missing=f"instructions not measured: {str(error).splitlines()[0]}")


def cost(dsn: str, *, clients: int = 1, seconds: float = 0, rounds: int = 1,
         instructions: bool | None = None) -> list[ScenarioResult]:
    """`instructions`: count them too (True), not (False), or where valgrind is found (None)."""
    del clients, seconds, rounds  # deterministic counts: one single-connection run is enough
    if instructions and (reason := callgrind.unavailable()):
        raise CourierError(reason)
    _prepare(dsn)
    with_pgq = pgq.install(dsn)
    counts = {operation.name: (measure(dsn, operation, "courier"), measure(dsn, operation, "pgmq"))
              for operation in OPERATIONS}
    theirs_pgq = {operation.name: measure(dsn, operation, "pgq") for operation in OPERATIONS} if with_pgq else {}
    counted = (count_instructions(OPERATIONS, required=bool(instructions)) if instructions is not False
               else Instructions({}))
    results = []
    for operation in OPERATIONS:
        mine, theirs = counts[operation.name]
        for name, label, targeted in METRICS:
            if name == "statements" and not mine.statements:
                continue
            notes = _note(operation, name, mine, theirs)
            if operation.name in theirs_pgq:
                notes = "; ".join(filter(None, (notes, _pgq_note(operation, name, theirs_pgq[operation.name]))))
            if name == "wal_bytes" and counted.missing and operation is OPERATIONS[0]:
                notes += f"; {counted.missing}"
            results.append(ScenarioResult(
                scenario="cost", variant=f"{operation.name}: {label}", unit=label,
                courier=Measurement(mine.per_message(name)), ceiling=Measurement(theirs.per_message(name)),
                target_ratio=1.0 if targeted else None, lower_is_better=True, notes=notes))
        if operation.name in counted.per_message:
            courier, peer = counted.per_message[operation.name]
            results.append(ScenarioResult(
                scenario="cost", variant=f"{operation.name}: {INSTRUCTIONS}", unit=INSTRUCTIONS,
                courier=Measurement(courier), ceiling=Measurement(peer), target_ratio=1.0, lower_is_better=True,
                notes="; ".join(filter(None, (
                    f"callgrind, a private PostgreSQL {counted.version} cluster, {operation.counted} x "
                    f"{operation.messages} message(s) less the warm-up; all operations counted in "
                    f"{counted.seconds:.0f} s",
                    _pgq_note(operation, "", counted.pgq[operation.name]) if operation.name in counted.pgq
                    else "")))))
    return results


PGQ_OPERATIONS = {"insert": "pgq.insert_event", "batch": "pgq.insert_event x 100 in one statement",
                  "take": "one tick's batch: next_batch, get_batch_events, finish_batch; the fill's ticks "
                          "not counted"}


def _pgq_note(operation: Operation, metric: str, counts: Counts | float) -> str:
    """PgQ's figure for the row (a metric of its counts, or instructions), with what stood for the
    operation (PgQ has no leases: its consumer takes and finishes a whole batch, so the consuming
    rows compare with that)."""
    kind = "take" if operation.preload else ("batch" if operation.messages > 1 else "insert")
    figure = counts if isinstance(counts, float) else counts.per_message(metric)
    return f"PgQ ({PGQ_OPERATIONS[kind]}): {figure:,.1f}"


def _note(operation: Operation, metric: str, mine: Counts, theirs: Counts) -> str:
    if metric != "wal_bytes":
        return ""
    return (f"against pgmq's matching operation, {operation.units} x {operation.messages} message(s) each; "
            f"full-page images: courier {mine.wal_fpi}, pgmq {theirs.wal_fpi}")
