"""Delivery to Redis Streams, RabbitMQ, MQTT and NATS JetStream through the worker pool,
against the real brokers on loopback: end to end, error classes, a broker that goes away
behind a TCP proxy, and kill -9 of a worker mid-batch.

Broker tests skip with one line when a broker is unreachable, and fail instead when CI is set.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable

import psycopg
import pytest

from console.workers.pool import PoolSettings, WorkerPool
from sqlkit import endpoints, observability
from tests.brokers import LOOPBACK, PORTS, Broker, Received, require_broker, url_for
from tests.helpers import global_id, scalar
from tests.tcp_proxy import TcpProxy
from tests.workers import start_worker_process

PROTOCOLS = ["redis", "amqp", "mqtt", "nats"]


def create(conn, name: str, protocol: str, config: dict) -> None:
    conn.execute("SELECT courier.create_endpoint(%s, %s, %s::jsonb)", (name, protocol, json.dumps(config)))


def send_many(conn, endpoint: str, count: int, start: int = 0) -> dict[int, dict]:
    """count messages with headers, a correlation id and an idempotency key; by id, what
    each must look like at the broker."""
    sent = {}
    for n in range(start, start + count):
        correlation = str(uuid.uuid4())
        key = f"order-{n}-{uuid.uuid4().hex[:6]}"
        message_id = scalar(conn, "SELECT courier.send_with_options(%s, %s::jsonb, p_idempotency_key := %s, "
                                  "p_correlation_id := %s::uuid, p_headers := %s::jsonb)",
                            (endpoint, json.dumps({"n": n, "text": "héllo"}), key, correlation,
                             json.dumps({"trace": f"abc-{n}"})))
        sent[message_id] = {"payload": {"n": n, "text": "héllo"}, "headers": {
            "trace": f"abc-{n}", "courier-message-id": str(message_id), "courier-correlation-id": correlation,
            "courier-idempotency-key": key}}
    return sent


def completed(conn) -> int:
    return scalar(conn, "SELECT count(*) FROM courier.archive WHERE status = 'completed'")


async def until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await asyncio.to_thread(condition):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"not within {timeout}s: {what}")


class RunningPool:
    """An in-process pool running in the test's event loop, beside the broker's consumer."""

    def __init__(self, dsn: str, **settings) -> None:
        self.pool = WorkerPool(dsn, PoolSettings(**{"poll_interval": 0.1, "report_interval": 0.005, **settings}))

    async def __aenter__(self) -> WorkerPool:
        self._task = asyncio.create_task(self.pool.run())
        return self.pool

    async def __aexit__(self, *exc) -> None:
        self.pool.stop()
        await self._task


def by_id(received: list[Received]) -> Counter[int]:
    return Counter(int(r.headers["courier-message-id"]) for r in received)


@pytest.fixture(params=PROTOCOLS)
def protocol(request) -> str:
    require_broker(request.param)
    return request.param


# Validation -----------------------------------------------------------------------------

def test_kafka_is_refused_as_not_supported_yet(conn):
    with pytest.raises(psycopg.Error) as raised:
        create(conn, "k", "kafka", {"bootstrap_servers": "127.0.0.1:9092", "topic": "t"})
    assert raised.value.sqlstate == "0A000"
    assert "not supported yet" in str(raised.value)
    assert raised.value.diag.message_hint
    assert scalar(conn, "SELECT count(*) FROM courier.endpoints") == 0


@pytest.mark.parametrize(("protocol_name", "config", "complaint"), [
    ("redis", {"url": "redis://h", "stream": "s", "maxlenn": 5}, "maxlenn"),
    ("amqp", {"url": "amqp://h", "routing_key": "k", "timeout": "5"}, "timeout"),
    ("mqtt", {"url": "mqtt://h", "topic": "t", "qos": 3}, "qos"),
    ("nats", {"url": "nats://h", "subject": "s", "timeout": 0}, "timeout"),
    ("nats", {"url": "http://h", "subject": "s"}, "url"),
])
def test_broker_configs_are_checked(conn, protocol_name, config, complaint):
    with pytest.raises(psycopg.Error) as raised:
        create(conn, "bad", protocol_name, config)
    assert raised.value.sqlstate == "22023"
    assert complaint in str(raised.value)


def test_broker_credentials_are_redacted_where_configs_show(conn):
    create(conn, "rabbit", "amqp", {"url": "amqp://app:s3cret@rabbit:5672/", "routing_key": "k", "timeout": 2})
    create(conn, "stream", "redis", {"url": "redis://:hunter2@cache:6379/0", "stream": "s"})
    create(conn, "sensors", "mqtt", {"url": "mqtt://dev:p4ss@plant:1883", "topic": "t", "qos": 1})
    create(conn, "events", "nats", {"url": "nats://u:natspw@nats:4222", "subject": "s"})
    shown = json.dumps([e.config for e in endpoints.list_all(conn)])
    logged = json.dumps([r[0] for r in conn.execute("SELECT details FROM courier.event_log").fetchall()])
    for secret in ("s3cret", "hunter2", "p4ss", "natspw"):
        assert secret not in shown and secret not in logged
    assert {e.protocol for e in endpoints.list_all(conn)} == {"amqp", "redis", "mqtt", "nats"}


def test_no_broker_secret_reaches_errors_the_dlq_the_event_log_or_the_worker_log(dsn, conn):
    """Issue 23, item 10: a worker delivering to brokers with credentials in every URL form,
    each refused or unreachable: the errors the brokers' clients raise are recorded, logged and
    shown with the credentials redacted."""
    for protocol in PORTS:
        require_broker(protocol)
    secret = "Zq9sEcReT"
    closed = 1  # nothing listens on port 1: a connection error that may quote the URL
    urls = {"redis-pass": ("redis", f"redis://:{secret}@127.0.0.1:{PORTS['redis']}/0"),
            "redis-query": ("redis", f"redis://127.0.0.1:{PORTS['redis']}/0?password={secret}"),
            "redis-closed": ("redis", f"redis://user:{secret}@127.0.0.1:{closed}/0"),
            "amqp-at": ("amqp", f"amqp://guest:p@ss:{secret}@127.0.0.1:{PORTS['amqp']}/"),
            "amqp-closed": ("amqp", f"amqp://guest:{secret}@127.0.0.1:{closed}/"),
            "mqtt-closed": ("mqtt", f"mqtt://dev:{secret}@127.0.0.1:{closed}"),
            "nats-token": ("nats", f"nats://{secret}@127.0.0.1:{closed}"),
            "nats-tls": ("nats", f"tls://u:{secret}@127.0.0.1:{closed}")}
    extra = {"redis": {"stream": "s"}, "amqp": {"routing_key": "k"}, "mqtt": {"topic": "t"}, "nats": {"subject": "s"}}
    for name, (protocol, url) in urls.items():
        conn.execute("SELECT courier.create_endpoint(%s, %s, %s::jsonb, '{\"max_retries\": 0}'::jsonb)",
                     (name, protocol, json.dumps({"url": url, "timeout": 2, "allow_internal": True,
                                                  **extra[protocol]})))
        conn.execute("SELECT courier.send(%s, '{}')", (name,))
    worker = start_worker_process(dsn)
    try:
        deadline = time.monotonic() + 90
        while scalar(conn, "SELECT count(*) FROM courier.queue") > 0 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        worker.terminate()
        worker.wait(30)
    recorded = conn.execute("SELECT endpoint_name, last_error, error_history::text FROM courier.dlq").fetchall()
    # Redis accepts a password it does not need: those two are delivered, the rest fail.
    assert {row[0] for row in recorded} == set(urls) - {"redis-pass", "redis-query"}, recorded
    everything = " ".join([str(recorded), str(conn.execute("SELECT details FROM courier.event_log").fetchall()),
                           str(conn.execute("SELECT last_error FROM courier.endpoints").fetchall()),
                           str(conn.execute("SELECT last_error, error_history FROM courier.archive").fetchall()),
                           worker.stdout.read(), worker.stderr.read()])
    assert "***" in everything
    assert secret not in everything


# End to end -------------------------------------------------------------------------------

def test_each_message_arrives_once_with_payload_and_headers(dsn, conn, protocol):
    broker = Broker.of(protocol)

    async def scenario() -> list[Received]:
        await broker.setup()
        try:
            async with RunningPool(dsn):
                await until(lambda: completed(conn) == len(sent), 30, "all delivered")
            return await broker.read()
        finally:
            await broker.cleanup()

    create(conn, "dest", protocol, broker.config())
    sent = send_many(conn, "dest", 40)
    received = asyncio.run(scenario())
    assert by_id(received) == Counter(dict.fromkeys(sent, 1)), "each message exactly once"
    for message in received:
        expected = sent[int(message.headers["courier-message-id"])]
        assert message.payload == expected["payload"]
        for key, value in expected["headers"].items():
            assert message.headers[key] == value, key
        assert message.headers["courier-attempt"] == "1"
        assert message.headers["courier-global-id"] == global_id(conn, int(message.headers["courier-message-id"]))
    if protocol == "amqp":
        assert all(m.headers["amqp-message-id"] == m.headers["courier-global-id"] for m in received)
        assert all(m.headers["amqp-correlation-id"] == m.headers["courier-correlation-id"] for m in received)
    if protocol == "mqtt":
        assert all(m.headers["mqtt-correlation-data"] == m.headers["courier-correlation-id"] for m in received)
    if protocol == "nats":
        assert all(m.headers["Nats-Msg-Id"] == m.headers["courier-global-id"] for m in received)
    # The Endpoints pane and `courier endpoint health` show the broker endpoint like HTTP's.
    health = {h.endpoint_name: h for h in observability.endpoint_health(conn)}
    assert (health["dest"].protocol, health["dest"].circuit_state) == (protocol, "closed")
    assert health["dest"].last_success_at is not None and health["dest"].pending_messages == 0
    assert [e.protocol for e in endpoints.list_all(conn)] == [protocol]


def test_qos_0_and_core_nats_deliver_when_asked(dsn, conn):
    """At most once, explicitly: nothing lost on a healthy loopback broker either."""
    require_broker("mqtt")
    require_broker("nats")
    mqtt, core = Broker.of("mqtt"), Broker.of("nats")

    async def scenario():
        await mqtt.setup()
        import nats

        nc = await nats.connect(url_for("nats"))
        got: list[bytes] = []

        async def collect(message) -> None:
            got.append(message.data)

        await nc.subscribe(f"{core.name}.created", cb=collect)
        try:
            async with RunningPool(dsn):
                await until(lambda: completed(conn) == 20, 30, "all delivered")
            await nc.flush()
            await asyncio.sleep(0.2)
            return await mqtt.read(), got
        finally:
            await nc.close()
            await mqtt.cleanup()

    create(conn, "m0", "mqtt", mqtt.config(qos=0))
    create(conn, "n0", "nats", {"url": url_for("nats"), "subject": f"{core.name}.created", "jetstream": False,
                                **LOOPBACK})
    send_many(conn, "m0", 10)
    send_many(conn, "n0", 10)
    mqtt_received, nats_received = asyncio.run(scenario())
    assert len(mqtt_received) == 10
    assert len(nats_received) == 10


# Error classes ----------------------------------------------------------------------------

def test_unroutable_amqp_message_is_not_completed(dsn, conn):
    require_broker("amqp")
    create(conn, "nowhere", "amqp", {"url": url_for("amqp"), "routing_key": f"no-queue-{uuid.uuid4().hex}", **LOOPBACK})
    message_id = send_many(conn, "nowhere", 1).popitem()[0]

    async def scenario():
        async with RunningPool(dsn):
            await until(lambda: scalar(conn, "SELECT retry_count FROM courier.queue WHERE id = %s",
                                       (message_id,)) >= 1, 20, "a failed attempt")

    asyncio.run(scenario())
    status, error = conn.execute("SELECT status, last_error FROM courier.queue WHERE id = %s",
                                 (message_id,)).fetchone()
    assert status == "pending"
    assert error.startswith("[RETRYABLE]") and "unroutable" in error
    assert completed(conn) == 0


def test_missing_exchange_and_bad_credentials_disable(dsn, conn):
    require_broker("amqp")
    create(conn, "no-exchange", "amqp", {"url": url_for("amqp"), "exchange": f"missing-{uuid.uuid4().hex}",
                                         "routing_key": "k", **LOOPBACK})
    create(conn, "bad-login", "amqp", {"url": f"amqp://guest:wrong@127.0.0.1:{PORTS['amqp']}/",
                                       "routing_key": "k", **LOOPBACK})
    ids = list(send_many(conn, "no-exchange", 1)) + list(send_many(conn, "bad-login", 1))

    async def scenario():
        async with RunningPool(dsn):
            await until(lambda: scalar(conn, "SELECT count(*) FROM courier.archive WHERE status = 'failed'") == 2,
                        30, "both dead-lettered")

    asyncio.run(scenario())
    errors = dict(conn.execute("SELECT id, last_error FROM courier.archive WHERE id = ANY (%s)", (ids,)).fetchall())
    assert errors[ids[0]].startswith("[DISABLE]") and "does not exist" in errors[ids[0]]
    assert errors[ids[1]].startswith("[DISABLE]") and "refused access" in errors[ids[1]]
    assert "wrong" not in errors[ids[1]]


# Faults -----------------------------------------------------------------------------------

def test_broker_down_retries_opens_the_circuit_and_recovers_losing_nothing(dsn, conn, protocol):
    conn.execute("SELECT courier.set_setting('circuit_breaker_threshold', '3')")
    conn.execute("SELECT courier.set_setting('circuit_breaker_cooldown', '5')")
    broker = Broker.of(protocol)
    proxy = TcpProxy(PORTS[protocol])
    conn.execute("SELECT courier.create_endpoint('flaky', %s, %s::jsonb, %s::jsonb)",
                 (protocol, json.dumps(broker.config(port=proxy.port, timeout=1)),
                  json.dumps({"max_retries": 100, "backoff": "fixed", "base_delay_seconds": 1})))
    circuit = "SELECT circuit_state FROM courier.endpoints WHERE name = 'flaky'"
    seen = {}

    async def scenario() -> list[Received]:
        await broker.setup()
        try:
            async with RunningPool(dsn):
                sent.update(send_many(conn, "flaky", 10))
                await until(lambda: completed(conn) == 10, 30, "first ten delivered")
                proxy.cut()
                sent.update(send_many(conn, "flaky", 20, start=10))
                await until(lambda: scalar(conn, circuit) == "open", 30, "circuit open")
                seen["retried"] = scalar(conn, "SELECT count(*) FROM courier.queue WHERE retry_count > 0")
                seen["errors"] = [r[0] for r in conn.execute(
                    "SELECT DISTINCT last_error FROM courier.queue WHERE last_error IS NOT NULL").fetchall()]
                proxy.restore()
                await until(lambda: completed(conn) == 30, 60, "all delivered after recovery")
                seen["circuit"] = scalar(conn, circuit)
            return await broker.read()
        finally:
            proxy.close()
            await broker.cleanup()

    sent: dict[int, dict] = {}
    received = asyncio.run(scenario())
    assert seen["retried"] > 0
    assert all(e.startswith("[RETRYABLE]") for e in seen["errors"]), seen["errors"]
    assert seen["circuit"] == "closed"
    assert set(by_id(received)) == set(sent), "nothing lost"
    assert scalar(conn, "SELECT count(*) FROM courier.archive WHERE status <> 'completed'") == 0


def test_kill_9_mid_batch_loses_nothing(dsn, conn, protocol):
    """Stall the broker's connection so that a batch waits for its acknowledgements, kill -9
    the worker, and let a successor deliver after stale recovery."""
    broker = Broker.of(protocol)
    proxy = TcpProxy(PORTS[protocol])
    create(conn, "stalled", protocol, broker.config(port=proxy.port, timeout=60))
    processing = "SELECT count(*) FROM courier.queue WHERE status = 'processing'"
    found = {}

    async def scenario() -> list[Received]:
        await broker.setup()
        try:
            sent.update(send_many(conn, "stalled", 10))
            worker = start_worker_process(dsn, "--concurrency", "40", "--batch-size", "20")
            try:
                await until(lambda: completed(conn) == 10, 30, "first ten delivered")
                proxy.stall()
                sent.update(send_many(conn, "stalled", 50, start=10))
                await until(lambda: scalar(conn, processing) >= 20, 30, "a batch in flight")
                worker.kill()  # SIGKILL: no drain, its claims left behind
                await asyncio.to_thread(worker.wait, 10)
            finally:
                if worker.poll() is None:
                    worker.kill()
            found["stranded"] = scalar(conn, processing)
            proxy.restore()
            conn.execute("UPDATE courier.queue SET processing_started_at = now() - interval '10 minutes' "
                         "WHERE status = 'processing'")
            successor = start_worker_process(dsn, "--concurrency", "40")
            try:
                await until(lambda: completed(conn) == 60, 60, "all delivered by the successor")
            finally:
                successor.terminate()
                await asyncio.to_thread(_wait, successor)
            return await broker.read()
        finally:
            proxy.close()
            await broker.cleanup()

    sent: dict[int, dict] = {}
    received = asyncio.run(scenario())
    counts = by_id(received)
    assert found["stranded"] > 0
    assert set(counts) == set(sent), "every message delivered at least once"
    duplicates = sum(n - 1 for n in counts.values())
    assert duplicates <= found["stranded"]
    print(f"{protocol} kill -9: {found['stranded']} stranded, {duplicates} delivered twice")


def _wait(process: subprocess.Popen[str]) -> None:
    try:
        process.wait(30)
    finally:
        if process.poll() is None:
            process.kill()


def test_config_change_takes_effect_without_restart_and_connections_close_when_unused(dsn, conn):
    require_broker("redis")
    first, second = Broker.of("redis"), Broker.of("redis")
    create(conn, "moving", "redis", first.config())
    held = {}

    async def scenario():
        try:
            runner = RunningPool(dsn, refresh_interval=0.2)
            async with runner as pool:
                send_many(conn, "moving", 5)
                await until(lambda: completed(conn) == 5, 30, "five to the first stream")
                conn.execute("SELECT courier.alter_endpoint('moving', %s::jsonb)", (json.dumps(second.config()),))
                await asyncio.sleep(0.5)  # the pool's next endpoint refresh
                send_many(conn, "moving", 5, start=5)
                await until(lambda: completed(conn) == 10, 30, "five more")
                dispatcher = pool.deliveries.dispatcher("redis")
                held["serving"] = len(dispatcher.connections._entries)
                conn.execute("SELECT courier.disable_endpoint('moving')")
                await asyncio.sleep(0.6)  # the next refresh closes the disabled endpoint's connection
                held["disabled"] = len(dispatcher.connections._entries)
                conn.execute("SELECT courier.enable_endpoint('moving')")
                send_many(conn, "moving", 1, start=10)
                await until(lambda: completed(conn) == 11, 30, "one more after re-enabling")
            held["after_drain"] = len(dispatcher.connections._entries)
            return len(await first.read()), len(await second.read())
        finally:
            await first.cleanup()
            await second.cleanup()

    assert asyncio.run(scenario()) == (5, 6)
    assert (held["serving"], held["disabled"], held["after_drain"]) == (1, 0, 0)


# Error classes without a broker: every branch of each dispatcher's classify ----------------

def _classes(dispatcher, target, errors):
    return [(str(dispatcher.classify(target, error)[0].kind), dispatcher.classify(target, error)[1])
            for error in errors]


def test_error_classes_are_as_documented():
    import aiormq.exceptions as aex
    import nats.errors as nerr
    import nats.js.errors as jerr
    import redis.exceptions as rex
    from aio_pika.exceptions import PublishError
    from aiomqtt.exceptions import MqttConnectError
    from aiormq.abc import DeliveredMessage
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.reasoncodes import ReasonCode
    from pamqp.commands import Basic

    from console.workers.dispatchers import Target
    from console.workers.dispatchers.amqp import AmqpDispatcher
    from console.workers.dispatchers.mqtt import MqttDispatcher, PublishRefused
    from console.workers.dispatchers.nats import NatsDispatcher
    from console.workers.dispatchers.redis import RedisDispatcher

    redis_target = Target(1, "r", "redis", {"url": "redis://:pw@h:6379/0", "stream": "s"})
    assert _classes(RedisDispatcher(), redis_target, [
        rex.ConnectionError("refused"), rex.TimeoutError("slow"), rex.OutOfMemoryError("OOM command not allowed"),
        rex.AuthenticationError("WRONGPASS"), rex.ResponseError("WRONGTYPE Operation against a key"),
        rex.ResponseError("ERR something else"),
    ]) == [("retryable", True), ("retryable", True), ("retryable", False), ("disable", True),
           ("disable", False), ("permanent", False)]

    returned = Basic.Return(reply_code=312, reply_text="NO_ROUTE", exchange="x", routing_key="k")
    amqp_target = Target(2, "a", "amqp", {"url": "amqp://u:pw@h/", "exchange": "x", "routing_key": "k"})
    assert _classes(AmqpDispatcher(), amqp_target, [
        ConnectionRefusedError(), aex.ProbableAuthenticationError("ACCESS_REFUSED"),
        aex.ChannelNotFoundEntity("NOT_FOUND - no exchange"), aex.ChannelPreconditionFailed("too large"),
        PublishError(DeliveredMessage(returned, None, b"", None), returned),
    ]) == [("retryable", True), ("disable", True), ("disable", True), ("permanent", True), ("retryable", False)]

    mqtt_target = Target(3, "m", "mqtt", {"url": "mqtt://u:pw@h:1883", "topic": "t"})
    assert _classes(MqttDispatcher(), mqtt_target, [
        OSError("refused"), MqttConnectError(ReasonCode(PacketTypes.CONNACK, identifier=0x86)),
        MqttConnectError(ReasonCode(PacketTypes.CONNACK, identifier=0x88)),
        PublishRefused(ReasonCode(PacketTypes.PUBACK, identifier=0x87)),
        PublishRefused(ReasonCode(PacketTypes.PUBACK, identifier=0x97)),
        PublishRefused(ReasonCode(PacketTypes.PUBACK, identifier=0x99)), ValueError("Payload too large."),
    ]) == [("retryable", True), ("disable", True), ("retryable", True), ("disable", False), ("retryable", False),
           ("permanent", False), ("permanent", False)]

    nats_target = Target(4, "n", "nats", {"url": "nats://u:pw@h:4222", "subject": "s"})
    assert _classes(NatsDispatcher(), nats_target, [
        nerr.ConnectionClosedError(), nerr.TimeoutError(), nerr.MaxPayloadError(), nerr.NoRespondersError(),
        jerr.ServiceUnavailableError(code=503, description="unavailable"),
        jerr.APIError(code=400, err_code=10054, description="message size exceeds maximum allowed"),
        jerr.APIError(code=503, err_code=10077, description="maximum messages exceeded"),
        jerr.BadRequestError(code=400, err_code=10999, description="bad"),
    ]) == [("retryable", True), ("retryable", True), ("permanent", False), ("disable", False),
           ("retryable", False), ("permanent", False), ("retryable", False), ("permanent", False)]
    # Errors never show a URL's password.
    for dispatcher, target in ((RedisDispatcher(), redis_target), (AmqpDispatcher(), amqp_target),
                               (MqttDispatcher(), mqtt_target), (NatsDispatcher(), nats_target)):
        assert ":pw@" not in dispatcher.classify(target, ConnectionRefusedError("x"))[0].error
