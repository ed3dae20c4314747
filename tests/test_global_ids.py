"""Issue 23, item 2: any id Courier hands a broker or receiver to deduplicate on is unique across
databases. Each database gets an identity at its first migrate; the ids carry it.

The databases here are migrated from scratch, each on its own: the per-test databases of
conftest are copies of one template, and a copy (like a restored backup) carries the
template's identity.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from sqlkit import migrate
from tests.brokers import Broker, require_broker, url_for
from tests.conftest import create_database, drop_database
from tests.helpers import scalar
from tests.workers import run_pool_until

IDENTITY = "SELECT id FROM courier.database_identity"


@pytest.fixture
def two_databases(server_dsn: str) -> Iterator[tuple[str, str]]:
    names = [f"courier_g_{uuid.uuid4().hex[:12]}" for _ in range(2)]
    try:
        dsns = tuple(create_database(server_dsn, name) for name in names)
        for dsn in dsns:
            migrate.migrate(dsn)
        yield dsns
    finally:
        for name in names:
            drop_database(server_dsn, name)


def identity(dsn: str) -> uuid.UUID:
    with psycopg.connect(dsn) as conn:
        return scalar(conn, IDENTITY)


def test_the_identity_is_made_at_first_migrate_survives_a_remigrate_and_differs_between_databases(two_databases):
    first, second = two_databases
    before = identity(first)
    assert isinstance(before, uuid.UUID)
    migrate.migrate(first)  # nothing pending: a no-op
    with psycopg.connect(first) as conn:
        conn.execute("DELETE FROM courier.schema_functions")  # every function file re-applied
    migrate.migrate(first)
    assert identity(first) == before
    assert identity(second) != before
    with psycopg.connect(first) as conn:
        assert scalar(conn, "SELECT count(*) FROM courier.database_identity") == 1
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("INSERT INTO courier.database_identity DEFAULT VALUES")


def test_the_admin_role_that_runs_workers_reads_the_identity_and_cannot_change_it(conn):
    conn.execute("SET ROLE courier_admin")
    assert isinstance(scalar(conn, IDENTITY), uuid.UUID)
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("UPDATE courier.database_identity SET id = gen_random_uuid()")
    conn.execute("RESET ROLE")
    for role in ("courier_application", "courier_monitor"):
        conn.execute(f"SET ROLE {role}")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(IDENTITY)
        conn.execute("RESET ROLE")


@pytest.fixture
def two_copies(server_dsn: str, template_name: str) -> Iterator[tuple[str, str]]:
    """Two copies of one migrated database (as a restored backup or a staging clone is):
    the same identity, the same sequences."""
    names = [f"courier_c_{uuid.uuid4().hex[:12]}" for _ in range(2)]
    try:
        yield tuple(create_database(server_dsn, name, template=template_name) for name in names)
    finally:
        for name in names:
            drop_database(server_dsn, name)


def test_two_databases_delivering_message_1_to_one_jetstream_stream_both_land(two_databases):
    """Before: both published Nats-Msg-Id courier-1 within the stream's duplicate window, the
    stream kept one message, and both databases recorded theirs as delivered."""
    headers = deliver_message_1_from_each(two_databases)
    for dsn, h in zip(two_databases, headers, strict=True):
        assert h["Nats-Msg-Id"].startswith(f"courier-{identity(dsn)}-1-")


def test_copies_of_one_database_sharing_its_identity_do_not_collide_either(two_copies):
    assert identity(two_copies[0]) == identity(two_copies[1])
    deliver_message_1_from_each(two_copies)


def deliver_message_1_from_each(databases: tuple[str, str]) -> list[dict[str, str]]:
    """Each database sends message 1 to one JetStream stream and delivers it; the headers of
    the messages the stream holds, asserted to be both, apart."""
    require_broker("nats")
    stream = Broker.of("nats").name
    subject = f"{stream}.created"

    async def nats(action):
        import nats as nats_client

        nc = await nats_client.connect(url_for("nats"))
        try:
            return await action(nc.jetstream())
        finally:
            await nc.close()

    async def stored(js) -> list[dict[str, str]]:
        info = await js.stream_info(stream)
        return [dict((await js.get_msg(stream, seq)).headers or {})
                for seq in range(info.state.first_seq, info.state.last_seq + 1)]

    asyncio.run(nats(lambda js: js.add_stream(name=stream, subjects=[f"{stream}.>"])))
    try:
        for dsn in databases:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("SELECT courier.create_endpoint('events', 'nats', %s::jsonb)",
                             (json.dumps(Broker.of("nats").config() | {"subject": subject}),))
                assert scalar(conn, "SELECT courier.send('events', '{\"n\": 1}')") == 1

                def delivered(conn=conn) -> bool:
                    return scalar(conn, "SELECT count(*) FROM courier.archive WHERE status = 'completed'") == 1
                run_pool_until(dsn, delivered, timeout=30)
                assert delivered()
        headers = asyncio.run(nats(stored))
    finally:
        asyncio.run(nats(lambda js: js.delete_stream(stream)))
    assert len(headers) == 2, "the stream holds both databases' message 1"
    assert [h["courier-message-id"] for h in headers] == ["1", "1"]
    assert headers[0]["Nats-Msg-Id"] != headers[1]["Nats-Msg-Id"]
    assert all(h["courier-global-id"] == h["Nats-Msg-Id"] for h in headers)
    return headers


def test_a_redelivery_of_one_message_is_still_dropped_by_the_stream(conn):
    """The global id is the same for every attempt: JetStream's duplicate window still drops a
    second publish of a message whose first PubAck was lost."""
    import dataclasses

    from console.workers.dispatchers import Target
    from console.workers.dispatchers.nats import NatsDispatcher
    from sqlkit.messages import claim_batch

    require_broker("nats")
    broker = Broker.of("nats")
    conn.execute("SELECT courier.create_endpoint('events', 'nats', %s::jsonb)", (json.dumps(broker.config()),))
    conn.execute("SELECT courier.send('events', '{\"n\": 1}')")
    (message,) = claim_batch(conn, "test", 10, scalar(conn, "SELECT id FROM courier.endpoints"))
    retried = dataclasses.replace(message, retry_count=1, lease=message.lease + 1)
    assert retried.global_id == message.global_id

    async def scenario():
        await broker.setup()
        dispatcher = NatsDispatcher()
        try:
            target = Target(message.endpoint_id, "events", "nats", broker.config())
            outcomes = [await dispatcher.deliver_batch(target, [m]) for m in (message, retried)]
            return outcomes, await broker.read()
        finally:
            await dispatcher.close()
            await broker.cleanup()

    outcomes, stored = asyncio.run(scenario())
    assert [str(o[0].kind) for o in outcomes] == ["success", "success"]
    assert len(stored) == 1
