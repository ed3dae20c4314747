"""`courier worker --processes N`: N pools in processes of their own under one supervisor, as a
user runs it; and how the pools split the worker's limits between them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from console.sink import WebhookSink
from console.workers.pool import Share
from tests.helpers import scalar
from tests.workers import COURIER, start_worker_process, wait_for


@pytest.mark.parametrize("total", [0, 1, 2, 3, 7, 64, 1024])
@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_shares_add_up_and_differ_by_at_most_one(total, count):
    parts = [Share(index, count).of(total) for index in range(count)]
    assert sum(parts) == total
    assert max(parts) - min(parts) <= 1
    assert parts == sorted(parts, reverse=True)  # the remainder goes to the first pools


@pytest.mark.parametrize("index, count", [(-1, 2), (2, 2), (0, 0)])
def test_a_share_outside_its_worker_is_refused(index, count):
    with pytest.raises(ValueError, match="share index"):
        Share(index, count)


def _pools(conn) -> list[tuple[str, int, str]]:
    return conn.execute("SELECT worker_id, pid, state FROM courier.workers ORDER BY worker_id").fetchall()


def _webhook_with_messages(conn, name: str, config: dict, messages: int) -> None:
    conn.execute("SELECT courier.create_endpoint(%s, 'http', %s::jsonb)",
                 (name, json.dumps({"allow_internal": True, **config})))
    conn.execute("SELECT courier.send_batch(%s, ARRAY(SELECT jsonb_build_object('n', g) "
                 "FROM generate_series(1, %s) g))", (name, messages))


def _delivered(conn) -> int:
    return scalar(conn, "SELECT count(*) FROM courier.archive WHERE status = 'completed'")


def test_two_pools_share_the_work_and_drain_on_sigterm(dsn, conn):
    conn.execute("SELECT courier.create_endpoint('noop', 'noop', '{}')")
    conn.execute("SELECT courier.send_batch('noop', ARRAY(SELECT jsonb_build_object('n', g) "
                 "FROM generate_series(1, 2000) g))")
    worker = start_worker_process(dsn, "--processes", "2", "--concurrency", "64", "--batch-size", "50",
                                  "--worker-id", "w")
    try:
        wait_for(lambda: _delivered(conn) == 2000, timeout=60)
        pools = _pools(conn)
        assert [name for name, _, _ in pools] == ["w/1", "w/2"]
        assert len({pid for _, pid, _ in pools}) == 2 and worker.pid not in {pid for _, pid, _ in pools}
        # Both pools took part: each records what it delivered in its heartbeat row.
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM courier.workers WHERE delivered > 0") == 2)
        assert scalar(conn, "SELECT sum(concurrency) FROM courier.workers") == 64
        # Each message delivered once.
        assert scalar(conn, "SELECT count(DISTINCT id) FROM courier.archive") == 2000
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.stderr.read()
    assert {state for _, _, state in _pools(conn)} == {"stopped"}
    log = [json.loads(line) for line in worker.stderr.read().splitlines() if line.startswith("{")]
    assert sum(1 for line in log if line["msg"] == "worker stopped" and "delivered" in line) == 2


def test_pools_start_from_a_directory_holding_a_package_named_like_ours(dsn, conn, tmp_path):
    """A user's project with its own `console` (or `sqlkit`) package, where they run `courier
    worker`: the pools' processes import Courier's, not the one in the working directory."""
    for name in ("console", "sqlkit"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise SystemExit('the user\'s own {name} was imported')\n")
    conn.execute("SELECT courier.create_endpoint('noop', 'noop', '{}')")
    conn.execute("SELECT courier.send_batch('noop', ARRAY(SELECT jsonb_build_object('n', g) "
                 "FROM generate_series(1, 100) g))")
    worker = start_worker_process(dsn, "--processes", "2", "--worker-id", "w", cwd=str(tmp_path))
    try:
        wait_for(lambda: _delivered(conn) == 100, timeout=60)
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.stderr.read()
    assert "own console" not in worker.stderr.read()


def test_a_killed_pool_is_restarted_and_delivery_goes_on(dsn, conn):
    conn.execute("SELECT courier.create_endpoint('noop', 'noop', '{}')")
    worker = start_worker_process(dsn, "--processes", "2", "--worker-id", "w")
    try:
        wait_for(lambda: len(_pools(conn)) == 2)
        victim = dict((name, pid) for name, pid, _ in _pools(conn))["w/2"]
        os.kill(victim, signal.SIGKILL)
        # The supervisor starts a new pool 2 (after its first pause, 1 s), which heartbeats
        # under the same name with its own pid.
        wait_for(lambda: dict((n, p) for n, p, _ in _pools(conn))["w/2"] != victim, timeout=30)
        conn.execute("SELECT courier.send_batch('noop', ARRAY(SELECT jsonb_build_object('n', g) "
                     "FROM generate_series(1, 500) g))")
        wait_for(lambda: _delivered(conn) == 500, timeout=30)
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
    log = [json.loads(line) for line in worker.stderr.read().splitlines() if line.startswith("{")]
    [restart] = [line for line in log if line["msg"] == "pool exited; restarting it"]
    assert restart["pool"] == 2 and restart["exit_code"] == -signal.SIGKILL


@pytest.mark.parametrize("concurrency, processes, sleep_ms, messages, fewest, most", [
    (1, 3, 20, 40, 1, 1),  # allowed one request at a time: one across all pools
    (6, 2, 200, 60, 4, 6),  # both pools send (3 each), never more than the endpoint's 6 together
])
def test_an_endpoints_in_flight_limit_holds_across_pools(dsn, conn, concurrency, processes, sleep_ms, messages,
                                                         fewest, most):
    with WebhookSink() as sink:
        _webhook_with_messages(conn, "limited", {"url": f"{sink.url}/sleep/{sleep_ms}", "concurrency": concurrency},
                               messages)
        worker = start_worker_process(dsn, "--processes", str(processes))
        try:
            wait_for(lambda: sink.count() == messages, timeout=60)
        finally:
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(30) == 0
        assert fewest <= sink.most_at_once <= most


def test_sigterm_while_pools_are_busy_ends_within_the_drain_timeout(dsn, conn):
    with WebhookSink() as sink:
        _webhook_with_messages(conn, "slow", {"url": f"{sink.url}/sleep/5000"}, 20)
        worker = start_worker_process(dsn, "--processes", "2", "--drain-timeout", "1")
        wait_for(lambda: sink.count() >= 2, timeout=30)
        started = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
        # The drain timeout, the pools' grace for releasing their claims, and start-up noise.
        assert time.monotonic() - started < 1 + 5 + 3
    # Nothing was lost: what was not delivered is back in the queue or will be redelivered.
    assert scalar(conn, "SELECT count(*) FROM courier.queue") + _delivered(conn) == 20


def test_more_processes_than_messages_in_flight_is_refused(dsn):
    worker = start_worker_process(dsn, "--processes", "4", "--concurrency", "2")
    assert worker.wait(30) == 2
    assert "4 processes cannot share 2 messages in flight" in worker.stderr.read()


def test_concurrency_alone_below_the_default_processes_runs_fewer_pools(dsn, conn):
    conn.execute("SELECT courier.create_endpoint('noop', 'noop', '{}')")
    worker = start_worker_process(dsn, "--processes", "3", "--concurrency", "3", "--worker-id", "w")
    try:
        wait_for(lambda: len(_pools(conn)) == 3)
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
    env = {k: v for k, v in os.environ.items() if k not in ("COURIER_DSN", "DATABASE_URL")}
    # No --processes: the default (a pool per core) gives way to --concurrency 1.
    single = subprocess.Popen([COURIER, "worker", "--dsn", dsn, "--concurrency", "1", "--worker-id", "one"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: "one" in {name for name, _, _ in _pools(conn)})
    finally:
        single.send_signal(signal.SIGTERM)
        assert single.wait(30) == 0, single.stderr.read()


def test_sigterm_to_every_process_at_once_drains_rather_than_abandons(dsn, conn):
    """A service manager that signals the whole worker (systemd's default KillMode) reaches
    each pool twice, by signal and by the supervisor's stop line, in either order: that is one
    stop, so the pools finish what they are sending."""
    with WebhookSink() as sink:
        _webhook_with_messages(conn, "slowish", {"url": f"{sink.url}/sleep/1500"}, 40)
        worker = start_worker_process(dsn, "--processes", "2", "--drain-timeout", "20")
        wait_for(lambda: sink.count() >= 4, timeout=30)
        pools = [pid for _, pid, _ in _pools(conn)]
        for pid in [worker.pid, *pools]:
            os.kill(pid, signal.SIGTERM)
        assert worker.wait(40) == 0
        started = sink.count()
    log = [json.loads(line) for line in worker.stderr.read().splitlines() if line.startswith("{")]
    assert not [line for line in log if "abandoning" in line["msg"]]
    # Every request that went out was answered and recorded; nothing waits for stale recovery.
    assert _delivered(conn) == started
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE status = 'processing'") == 0
