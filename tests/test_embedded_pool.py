"""The console's embedded worker pool as a real child process: delivery and heartbeats, live
scaling, a bounded graceful stop, and no orphan when its parent is killed with SIGKILL."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import psutil
import pytest

from console.sink import WebhookSink
from console.workers.supervisor import EmbeddedPool
from tests.helpers import archived, scalar
from tests.workers import wait_for


def alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie waiting for its reaper."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def descendants(pid: int) -> set[int]:
    try:
        return {child.pid for child in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def survivors(pids: Iterable[int]) -> list[int]:
    return [pid for pid in pids if alive(pid)]


def heartbeat(conn, worker_id: str) -> dict | None:
    row = conn.execute("SELECT pid, concurrency, state FROM courier.workers WHERE worker_id = %s",
                       (worker_id,)).fetchone()
    return None if row is None else {"pid": row[0], "concurrency": row[1], "state": row[2]}


def send(conn, endpoint: str, n: int) -> list[int]:
    return scalar(conn, "SELECT courier.send_batch(%s, ARRAY(SELECT jsonb_build_object('n', g) "
                        "FROM generate_series(1, %s) g))", (endpoint, n))


def processing(conn) -> int:
    return scalar(conn, "SELECT count(*) FROM courier.queue WHERE status = 'processing'")


@pytest.fixture
def pool(dsn: str, tmp_path: Path) -> Iterator[EmbeddedPool]:
    embedded = EmbeddedPool(dsn, concurrency=4, worker_id=f"test-embedded-{uuid.uuid4().hex[:8]}",
                            drain_timeout=5, log_path=tmp_path / "pool.log")
    try:
        yield embedded
    finally:
        embedded.stop(timeout=5)


@pytest.fixture
def sink() -> Iterator[WebhookSink]:
    with WebhookSink() as running:
        yield running


def slow_endpoint(conn, sink: WebhookSink, ms: int, timeout: float = 30) -> str:
    conn.execute("SELECT courier.create_endpoint('slow', 'http', %s::jsonb)",
                 (json.dumps({"url": f"{sink.url}/sleep/{ms}", "allow_internal": True, "timeout": timeout}),))
    return "slow"


def test_child_delivers_and_reports_its_heartbeat(conn, pool):
    conn.execute("SELECT courier.create_endpoint('hook', 'noop', '{}')")
    ids = send(conn, "hook", 300)
    pool.start()
    state = pool.state
    assert state.running and state.pid is not None and state.exit_code is None
    wait_for(lambda: archived(conn) == len(ids))
    wait_for(lambda: (heartbeat(conn, pool.worker_id) or {}).get("pid") == state.pid)
    assert heartbeat(conn, pool.worker_id)["concurrency"] == 4
    pool.start()  # already running: nothing happens
    assert pool.state.pid == state.pid
    pool.stop()
    stopped = pool.state
    assert (stopped.running, stopped.pid, stopped.exit_code) == (False, None, 0)
    assert not alive(state.pid)
    assert heartbeat(conn, pool.worker_id)["state"] == "stopped"
    log = [json.loads(line) for line in (pool.state.log_path or Path()).read_text().splitlines()]
    assert {"worker started", "draining", "worker stopped"} <= {entry["msg"] for entry in log}


def test_default_worker_id_names_the_console_and_its_pid(dsn):
    import os
    import socket

    assert EmbeddedPool(dsn).state.worker_id == f"console:{socket.gethostname()}:{os.getpid()}"


def test_scale_changes_concurrency_live_in_the_same_process(conn, pool, sink):
    slow_endpoint(conn, sink, 300)
    send(conn, "slow", 400)
    pool.start(concurrency=8)
    pid = pool.state.pid
    # A webhook holds up to four times its limit claimed ahead of its requests in flight, so
    # the queue shows up to five times the pool's concurrency in processing.
    wait_for(lambda: processing(conn) > 8)
    pool.scale(2)
    # Sent at once, not at the next 5-second heartbeat.
    wait_for(lambda: heartbeat(conn, pool.worker_id)["concurrency"] == 2, timeout=2.5)
    # In-flight deliveries finish and what was claimed ahead is delivered; no new claim until
    # the pool is under its new limit and prefetch.
    wait_for(lambda: processing(conn) <= 2 + 8, timeout=10)
    samples = []
    for _ in range(30):
        samples.append(processing(conn))
        time.sleep(0.05)
    # A finished delivery stays 'processing' until its outcome is reported, some milliseconds
    # after the pool already claimed the next one: so the table may show a little more.
    assert sorted(samples)[len(samples) // 2] <= 10 and max(samples) <= 12, samples
    pool.scale(6)
    wait_for(lambda: processing(conn) > 10, timeout=5)
    assert max(processing(conn) for _ in range(10)) <= 6 + 24 + 6
    assert heartbeat(conn, pool.worker_id) == {"pid": pid, "concurrency": 6, "state": "running"}
    assert pool.state.pid == pid and pool.state.concurrency == 6


def test_scale_validates_and_is_remembered_while_stopped(conn, pool):
    for bad in (0, 10_001, -3, True, 2.5):
        with pytest.raises(ValueError, match="concurrency"):
            pool.scale(bad)  # type: ignore[arg-type]
    pool.scale(3)
    assert pool.state.concurrency == 3 and not pool.state.running
    pool.start()
    wait_for(lambda: (heartbeat(conn, pool.worker_id) or {}).get("concurrency") == 3)


def test_stop_drains_in_flight_messages_and_ends_the_process(conn, pool, sink):
    slow_endpoint(conn, sink, 500)
    send(conn, "slow", 40)
    pool.start()
    pid = pool.state.pid
    wait_for(lambda: processing(conn) >= 4)  # in flight, and more claimed ahead
    began = time.monotonic()
    pool.stop()
    took = time.monotonic() - began
    assert took < 5 + 5, "a drain is bounded by the drain timeout plus 5 s"
    assert not alive(pid) and pool.state.exit_code == 0
    assert processing(conn) == 0
    assert archived(conn) >= 4 and archived(conn) == sink.count("/sleep")
    pool.stop()  # idempotent
    print(f"drain of 4 in-flight 500 ms deliveries took {took:.2f}s")


def test_stop_is_bounded_when_a_delivery_outlasts_the_drain(conn, dsn, sink, tmp_path):
    slow_endpoint(conn, sink, 60_000, timeout=120)
    send(conn, "slow", 3)
    pool = EmbeddedPool(dsn, concurrency=3, worker_id="test-stuck", drain_timeout=1,
                        log_path=tmp_path / "pool.log")
    pool.start()
    try:
        wait_for(lambda: processing(conn) == 3)
        began = time.monotonic()
        pool.stop()
        assert time.monotonic() - began < 1 + 5
    finally:
        pool.stop(timeout=1)
    assert pool.state.exit_code == 0
    # Released for another worker, not left to stale recovery.
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE status = 'pending'") == 3


def test_a_child_that_dies_shows_its_exit_code(conn, pool):
    pool.start()
    pid = pool.state.pid
    assert pid is not None
    wait_for(lambda: heartbeat(conn, pool.worker_id) is not None)
    psutil.Process(pid).kill()
    wait_for(lambda: not pool.state.running, timeout=5)
    assert pool.state.exit_code == -9 and pool.state.pid is None
    pool.start()  # and it can be started again
    assert pool.state.running and pool.state.pid != pid


PARENT = textwrap.dedent("""
    import sys, time
    from console.workers.supervisor import EmbeddedPool
    pool = EmbeddedPool(sys.argv[1], concurrency=2, worker_id=sys.argv[2], drain_timeout=5)
    pool.start()
    print(pool.state.pid, flush=True)
    time.sleep(600)
""")


def test_child_drains_and_exits_when_its_parent_is_killed(conn, dsn, sink):
    slow_endpoint(conn, sink, 500)
    send(conn, "slow", 20)
    worker_id = f"test-orphan-{uuid.uuid4().hex[:8]}"
    family: set[int] = set()
    parent = subprocess.Popen([sys.executable, "-c", PARENT, dsn, worker_id], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        wait_for(lambda: processing(conn) == 2)
        family = descendants(parent.pid) | {child}
        assert child in family
        parent.kill()
        parent.wait(5)
        # End of its stdin tells the child; it drains (in-flight deliveries finish) and exits.
        wait_for(lambda: not survivors(family), timeout=15)
    finally:
        if parent.poll() is None:
            parent.kill()
        for pid in survivors(family):
            psutil.Process(pid).kill()
    assert heartbeat(conn, worker_id)["state"] == "stopped"
    assert processing(conn) == 0
