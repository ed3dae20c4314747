"""Archive retention never stalls delivery (issue 10, item 17).

A long reader of the archive (an analytics scan, a replay) holds its lock for seconds. A plain
DROP of an old partition waited behind it with ACCESS EXCLUSIVE on the archive, and every
report, which inserts into the archive, queued behind the DROP: delivery stopped until the
reader finished. Here a real worker delivers a steady stream while retention runs against such
a reader, and no message may take much longer than before.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time

import psycopg
import pytest

from console.workers.maintenance import MaintenanceLeader, MaintenanceSchedule
from sqlkit.archive_retention import drop_expired_partitions
from sqlkit.connection import connect
from tests.helpers import scalar
from tests.test_archive import archive_row, mid_month, month_name, partitions
from tests.workers import run_pool_until

READER_HOLDS = 3.0
SEND_EVERY = 0.02
SENDING_FOR = 5.0


@pytest.fixture
def expired_partitions(conn) -> list[str]:
    """Two monthly partitions past a one-month retention, with rows."""
    for archive_id, months_ago in ((1, 5), (2, 4)):
        archive_row(conn, archive_id, mid_month(-months_ago))
    conn.execute("SELECT courier.maintain_archive_partitions(3)")
    conn.execute("SELECT courier.set_setting('archive_retention_months', '1')")
    expired = [month_name(-5), month_name(-4)]
    assert set(expired) <= set(partitions(conn))
    return expired


def hold_archive_open(dsn: str, started: threading.Event) -> None:
    """A reader of the whole archive that keeps its transaction (and its locks) open."""
    with psycopg.connect(dsn) as reader:
        reader.execute("SELECT count(*) FROM courier.archive")
        started.set()
        time.sleep(READER_HOLDS)
        reader.commit()


def test_retention_against_a_long_reader_does_not_stall_delivery(dsn, conn, expired_partitions):
    endpoint = scalar(conn, "SELECT courier.create_endpoint('steady', 'noop', '{}')")
    sent = threading.Event()
    reader_started = threading.Event()
    dropped: list[int] = []

    def produce() -> None:
        with psycopg.connect(dsn, autocommit=True) as producer:
            deadline = time.monotonic() + SENDING_FOR
            while time.monotonic() < deadline:
                producer.execute("SELECT courier.send('steady', '{}')")
                time.sleep(SEND_EVERY)
        sent.set()

    def retain() -> None:
        time.sleep(1.0)  # a second of deliveries before: the baseline
        reader = threading.Thread(target=hold_archive_open, args=(dsn, reader_started))
        reader.start()
        reader_started.wait(10)
        with connect(dsn) as maintenance:
            dropped.append(drop_expired_partitions(maintenance, budget=15))
        reader.join()

    threads = [threading.Thread(target=produce), threading.Thread(target=retain)]
    for thread in threads:
        thread.start()
    run_pool_until(dsn, lambda: sent.is_set() and not scalar(conn, "SELECT count(*) FROM courier.queue"),
                   timeout=30, maintenance=None)
    for thread in threads:
        thread.join(30)

    latencies = [float(s) for (s,) in conn.execute(
        "SELECT extract(epoch FROM completed_at - created_at) FROM courier.archive WHERE endpoint_id = %s "
        "ORDER BY id", (endpoint,))]
    assert len(latencies) > SENDING_FOR / SEND_EVERY / 3
    p99 = statistics.quantiles(latencies, n=100)[98]
    print(f"delivery latency during retention: n={len(latencies)} median={statistics.median(latencies):.3f}s "
          f"p99={p99:.3f}s max={max(latencies):.3f}s (reader held {READER_HOLDS}s)")
    # A DROP queued behind the reader held every report for the reader's remaining seconds.
    assert max(latencies) < READER_HOLDS / 2
    assert dropped == [2]  # once the reader had finished
    assert not set(expired_partitions) & set(partitions(conn))
    assert not scalar(conn, "SELECT count(*) FROM pg_class WHERE relname = ANY (%s)", (expired_partitions,))
    assert scalar(conn, "SELECT sum(jsonb_array_length(details->'partitions')) FROM courier.event_log "
                        "WHERE event_type = 'archive.partitions_dropped'") == 2


def test_retention_skips_a_partition_in_use_at_once_and_says_so(dsn, conn, expired_partitions):
    started = threading.Event()
    reader = threading.Thread(target=hold_archive_open, args=(dsn, started))
    reader.start()
    started.wait(10)
    began = time.monotonic()
    assert scalar(conn, "SELECT courier.cleanup_old_archive_partitions()") == 0
    assert time.monotonic() - began < 1  # waited for the reader until it finished
    busy = scalar(conn, "SELECT details->'busy' FROM courier.event_log "
                        "WHERE event_type = 'archive.partitions_dropped'")
    assert busy == expired_partitions
    reader.join()
    assert scalar(conn, "SELECT courier.cleanup_old_archive_partitions()") == 2


def test_the_maintenance_leader_runs_retention_through_the_concurrent_path():
    (job,) = [j for j in MaintenanceSchedule().jobs() if j.name == "archive_retention"]
    assert job.runner is not None


def test_partition_upkeep_gives_up_a_lock_quickly_and_the_leader_retries_it(dsn, conn):
    started = threading.Event()
    reader = threading.Thread(target=hold_archive_open, args=(dsn, started))
    reader.start()
    started.wait(10)
    began = time.monotonic()
    with pytest.raises(psycopg.errors.LockNotAvailable):
        conn.execute("SELECT courier.maintain_archive_partitions(6)")  # reports would queue behind its wait
    assert time.monotonic() - began < 1

    schedule = MaintenanceSchedule(months_ahead=6, job_time_budget=10)
    leader = MaintenanceLeader(dsn, "leader-test", schedule)

    async def lead_for(seconds: float) -> None:
        stopping = asyncio.Event()
        running = asyncio.create_task(leader.run(stopping))
        await asyncio.sleep(seconds)
        stopping.set()
        await running

    asyncio.run(lead_for(READER_HOLDS + 2))
    reader.join()
    assert month_name(6) in partitions(conn)  # created once the reader had gone, within the same run
