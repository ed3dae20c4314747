"""dispatch-redis, dispatch-amqp, dispatch-mqtt and dispatch-nats: `courier worker` with no
flags delivering preloaded messages to a broker on loopback, against a plain client of the
same library publishing the same messages with the same acknowledgements, in batches of 100,
two in flight (the ceiling). The notes add the worker's CPU cost and what one pool in the
bench's own process, claiming 100 at a time with two batches in flight, drains (this
scenario's definition before issue 27).

Brokers default to loopback (COURIER_BENCH_REDIS_URL, ..._AMQP_URL, ..._MQTT_URL and
..._NATS_URL override them). Each run uses a destination of its own, deleted afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

from console.workers.pool import PoolSettings
from console.workers.processes import default_processes

from .delivery import _endpoint, _preload, _run_pool
from .drain import WorkerDrain, cost_note, drain_with_worker_process
from .result import Measurement, ScenarioResult, measure_rounds

BATCH = 100
"""The plain client's batch: faster for it than the worker's claim of 500 (NATS 23.9k against
17.5k msg/s, MQTT 4.4k against 3.6k, Redis 45k against 40k on two cores)."""
IN_FLIGHT_BATCHES = 2
T = TypeVar("T")

URLS = {
    "redis": os.environ.get("COURIER_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"),
    "amqp": os.environ.get("COURIER_BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
    "mqtt": os.environ.get("COURIER_BENCH_MQTT_URL", "mqtt://127.0.0.1:1883"),
    "nats": os.environ.get("COURIER_BENCH_NATS_URL", "nats://127.0.0.1:4222"),
}
# The bench's brokers are the operator's own, on loopback by default: internal addresses allowed.
_TRUSTED = {"allow_internal": True}


def _message(n: int) -> tuple[bytes, dict[str, str]]:
    """What the plain client sends: the payload and headers a Courier message carries."""
    return json.dumps({"n": n}).encode(), {"courier-message-id": str(n), "courier-attempt": "1"}


async def _publish_all(messages: int, publish_batch: Callable[[range], Awaitable[None]]) -> float:
    """Seconds to publish `messages` in batches of BATCH, IN_FLIGHT_BATCHES at a time."""
    batches: asyncio.Queue[range] = asyncio.Queue()
    for start in range(0, messages, BATCH):
        batches.put_nowait(range(start, min(start + BATCH, messages)))

    async def worker() -> None:
        while not batches.empty():
            await publish_batch(batches.get_nowait())

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(IN_FLIGHT_BATCHES)))
    return time.perf_counter() - started


# Each destination: (config for the endpoint, plain publisher, cleanup), as an async context.

@contextlib.asynccontextmanager
async def _redis(messages: int):
    import redis.asyncio as aioredis

    stream = f"courier-bench-{uuid.uuid4().hex[:8]}"
    client = aioredis.from_url(URLS["redis"])

    async def publish(batch: range) -> None:
        async with client.pipeline(transaction=False) as pipe:
            for n in batch:
                payload, headers = _message(n)
                pipe.xadd(stream, {"payload": payload, **headers}, maxlen=100_000, approximate=True)
            await pipe.execute()

    try:
        yield {"url": URLS["redis"], "stream": stream, "maxlen": 100_000, **_TRUSTED}, publish
    finally:
        await client.delete(stream)
        await client.aclose()


@contextlib.asynccontextmanager
async def _amqp(messages: int):
    import aio_pika

    name = f"courier-bench-{uuid.uuid4().hex[:8]}"
    connection = await aio_pika.connect(URLS["amqp"])
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    exchange = await channel.declare_exchange(name, aio_pika.ExchangeType.DIRECT, auto_delete=False)
    queue = await channel.declare_queue(name, arguments={"x-max-length": 200_000})
    await queue.bind(exchange, "bench")

    async def publish(batch: range) -> None:
        await asyncio.gather(*(
            exchange.publish(aio_pika.Message(payload, headers=headers, content_type="application/json",
                                              delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                             "bench", mandatory=True)
            for payload, headers in map(_message, batch)))

    try:
        yield {"url": URLS["amqp"], "exchange": name, "routing_key": "bench", **_TRUSTED}, publish
    finally:
        await queue.delete(if_unused=False, if_empty=False)
        await exchange.delete()
        await connection.close()


@contextlib.asynccontextmanager
async def _mqtt(messages: int):
    import aiomqtt
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    from console.workers.dispatchers.broker import address

    topic = f"courier-bench/{uuid.uuid4().hex[:8]}"
    where = address(URLS["mqtt"])
    client = aiomqtt.Client(where.host, where.port or 1883, username=where.username, password=where.password,
                            protocol=aiomqtt.ProtocolVersion.V5, max_inflight_messages=1000,
                            identifier=f"bench-{uuid.uuid4().hex[:8]}")
    client.pending_calls_threshold = 100_000
    await client.__aenter__()

    async def publish(batch: range) -> None:
        async def one(n: int) -> None:
            payload, headers = _message(n)
            properties = Properties(PacketTypes.PUBLISH)
            properties.UserProperty = list(headers.items())
            await client.publish(topic, payload, qos=1, properties=properties, timeout=30)

        await asyncio.gather(*(one(n) for n in batch))

    try:
        yield {"url": URLS["mqtt"], "topic": topic, "qos": 1, **_TRUSTED}, publish
    finally:
        await client.__aexit__(None, None, None)


@contextlib.asynccontextmanager
async def _nats(messages: int):
    import nats

    name = f"courier-bench-{uuid.uuid4().hex[:8]}"
    nc = await nats.connect(URLS["nats"])
    js = nc.jetstream(timeout=30)
    await js.add_stream(name=name, subjects=[f"{name}.>"])
    run = uuid.uuid4().hex[:6]

    async def publish(batch: range) -> None:
        async def one(n: int) -> None:
            payload, headers = _message(n)
            await js.publish(f"{name}.bench", payload, headers={**headers, "Nats-Msg-Id": f"bench-{run}-{n}"})

        await asyncio.gather(*(one(n) for n in batch))

    try:
        yield {"url": URLS["nats"], "subject": f"{name}.bench", "jetstream": True, **_TRUSTED}, publish
    finally:
        with contextlib.suppress(Exception):
            await js.delete_stream(name)
        await nc.close()


DESTINATIONS = {"redis": _redis, "amqp": _amqp, "mqtt": _mqtt, "nats": _nats}
ACKNOWLEDGEMENT = {"redis": "the XADD reply (pipelined)", "amqp": "publisher confirms with mandatory",
                   "mqtt": "QoS 1 PUBACK (MQTT 5)", "nats": "the JetStream PubAck"}


def _dispatch(protocol: str, dsn: str, messages: int, rounds: int) -> ScenarioResult:
    costs: list[WorkerDrain] = []

    def loaded_then(name: str, drain: Callable[[], T]) -> T:
        """A fresh destination, endpoint `name` on it with `messages` preloaded, then drain()."""
        async def measured() -> T:
            async with DESTINATIONS[protocol](messages) as (endpoint_config, _):
                await asyncio.to_thread(_endpoint, dsn, name, protocol, endpoint_config)
                await asyncio.to_thread(_preload, dsn, name, messages)
                return await asyncio.to_thread(drain)

        return asyncio.run(measured())

    def courier() -> Measurement:
        drained = loaded_then(f"{protocol}-bench", lambda: drain_with_worker_process(dsn, messages))
        costs.append(drained)
        return Measurement(drained.rate)

    def one_pool() -> Measurement:
        """One pool in this process claiming BATCH at a time with IN_FLIGHT_BATCHES batches in
        flight, as the plain client publishes: what this scenario measured before issue 27."""
        pool, elapsed = loaded_then(f"{protocol}-bench-pool", lambda: _run_pool(
            dsn, lambda p: p.stats.delivered >= messages, _one_pool_settings()))
        return Measurement(pool.stats.delivered / elapsed)

    def ceiling() -> Measurement:
        async def measured() -> float:
            async with DESTINATIONS[protocol](messages) as (_, publish):
                return messages / await _publish_all(messages, publish)

        return Measurement(asyncio.run(measured()))

    measured = measure_rounds({"ceiling": ceiling, "courier": courier, "one pool": one_pool}, rounds)
    return ScenarioResult(
        scenario=f"dispatch-{protocol}",
        variant=f"{messages:,} msgs, `courier worker` defaults", unit="msg/s",
        courier=measured["courier"], ceiling=measured["ceiling"], target_ratio=0.7,
        notes=f"`courier worker` with no flags, in its own processes ({default_processes()} pools), timed from the "
              f"first delivery to the last, vs a plain client of the same library publishing the same payload and "
              f"headers with the same acknowledgement ({ACKNOWLEDGEMENT[protocol]}) in batches of {BATCH}, "
              f"{IN_FLIGHT_BATCHES} in flight, to a broker on loopback; {cost_note(costs, messages)}; one pool "
              f"in the bench's process claiming {BATCH} at a "
              f"time with {IN_FLIGHT_BATCHES} batches in flight (this scenario before issue 27) drained "
              f"{measured['one pool'].rate:,.0f} msg/s")


def _one_pool_settings() -> PoolSettings:
    return PoolSettings(concurrency=BATCH * IN_FLIGHT_BATCHES, batch_size=BATCH, poll_interval=0.05)


def dispatch_redis(dsn: str, *, clients: int, seconds: float, rounds: int, messages: int = 50_000) -> ScenarioResult:
    return _dispatch("redis", dsn, messages, rounds)


def dispatch_amqp(dsn: str, *, clients: int, seconds: float, rounds: int, messages: int = 50_000) -> ScenarioResult:
    return _dispatch("amqp", dsn, messages, rounds)


def dispatch_mqtt(dsn: str, *, clients: int, seconds: float, rounds: int, messages: int = 50_000) -> ScenarioResult:
    return _dispatch("mqtt", dsn, messages, rounds)


def dispatch_nats(dsn: str, *, clients: int, seconds: float, rounds: int, messages: int = 50_000) -> ScenarioResult:
    return _dispatch("nats", dsn, messages, rounds)
