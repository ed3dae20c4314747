"""Stages of the worker pool on their own, against a real database: each is built with only
what its constructor takes, as the pool builds it, and no pool runs."""

from __future__ import annotations

import asyncio
import time

import psycopg

from console.workers.capacity import Capacity
from console.workers.dispatchers import Target
from console.workers.leases import Leases
from console.workers.outcome import Outcome
from console.workers.reporting import Reporter
from console.workers.settings import PoolSettings, PoolStats
from sqlkit import queries
from sqlkit.connection import AsyncDatabase
from sqlkit.messages import ClaimedMessage, claimed_from_row
from tests.helpers import archived, scalar


def endpoint_with_messages(conn: psycopg.Connection, name: str, n: int) -> Target:
    endpoint_id = scalar(conn, "SELECT courier.create_endpoint(%s, 'noop', '{}')", (name,))
    conn.execute("SELECT courier.send_batch(%s, ARRAY(SELECT jsonb_build_object('n', g) "
                 "FROM generate_series(1, %s) g))", (name, n))
    return Target(endpoint_id, name, "noop", {})


async def claim(db: AsyncDatabase, target: Target, n: int) -> list[ClaimedMessage]:
    async with db.connection() as conn:
        rows = await queries.fetch_all_async(conn, "claim_for_endpoint",
                                             {"worker_id": "stage-test", "batch_size": n, "endpoint_id": target.id})
    return [claimed_from_row(row) for row in rows]


def test_a_failure_holds_back_its_endpoint_until_the_reporter_has_reported_it(dsn, conn):
    """The claims give an endpoint no room while the reporter holds a failure of it that SQL
    has not seen (a circuit it opens must stop the next claim); once the report commits, the
    failure no longer counts and that endpoint, and only it, is woken to claim again."""
    target = endpoint_with_messages(conn, "flaky", 2)
    endpoint_with_messages(conn, "other", 1)
    stats = PoolStats()
    woken: list[int] = []

    async def main() -> tuple[bool, int]:
        async with AsyncDatabase(dsn, min_size=1, max_size=2) as db:
            delivered, failed = await claim(db, target, 2)
            stopping = asyncio.Event()
            reporter = Reporter(db, PoolSettings(maintenance=None), stats, Capacity(), Leases(db), stopping,
                                wake=woken.append, busy=lambda: False)
            reporter.record(target, [(delivered, Outcome.success()),
                                     (failed, Outcome.retryable("503 from the endpoint"))])
            held_back = reporter.has_unreported_failure(target.id) and reporter.unreported() == 2
            stopping.set()  # the loop reports what it holds, then ends: nothing more can come
            await asyncio.wait_for(reporter.run(drained=lambda: True), 10)
            assert not reporter.has_unreported_failure(target.id) and reporter.unreported() == 0
            return held_back, failed.id

    held_back, failed_id = asyncio.run(main())
    assert held_back
    assert woken == [target.id]
    assert archived(conn) == 1
    assert conn.execute("SELECT status, retry_count FROM courier.queue WHERE id = %s",
                        (failed_id,)).fetchone() == ("pending", 1)
    assert (stats.delivered, stats.failed, stats.lone_reports) == (1, 1, 1)


def test_only_leases_held_past_renew_after_are_renewed(dsn, conn):
    """Lease renewal renews a lease taken longer ago than renew_after, not one taken since,
    nor one the pool no longer holds (its outcome reported, or its message given back); a
    renewed lease counts from its renewal."""
    target = endpoint_with_messages(conn, "slow", 3)

    def an_hour_old() -> None:
        conn.execute("UPDATE courier.queue SET processing_started_at = now() - interval '1 hour'")

    def renewed() -> set[int]:
        return {row[0] for row in conn.execute("SELECT id FROM courier.queue "
                                               "WHERE processing_started_at > now() - interval '1 minute'")}

    async def main() -> tuple[int, set[int], set[int]]:
        async with AsyncDatabase(dsn, min_size=1, max_size=2) as db:
            messages = await claim(db, target, 3)
            old, recent, forgotten = messages
            leases = Leases(db)
            leases.taken([old.id, forgotten.id], time.monotonic() - 100)
            leases.taken([recent.id], time.monotonic())
            leases.forget([forgotten.id])
            await asyncio.to_thread(an_hour_old)
            await leases.renew(messages, renew_after=10)
            first = await asyncio.to_thread(renewed)
            await asyncio.to_thread(an_hour_old)
            await leases.renew(messages, renew_after=10)
            second = await asyncio.to_thread(renewed)
            return old.id, first, second

    old_id, first, second = asyncio.run(main())
    assert first == {old_id}
    assert second == set(), "a lease just renewed was renewed again"
