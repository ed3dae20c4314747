"""The four brokers as tests need them: reachability (skip on a user's machine, fail under CI),
and a unique destination per test that a consumer reads back, cleaned up afterwards. The
proxy that cuts, stalls and restores a broker is tests.tcp_proxy.TcpProxy."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import uuid
from dataclasses import dataclass
from typing import Any

import pytest

HOST = "127.0.0.1"
PORTS = {"redis": 6379, "amqp": 5672, "mqtt": 1883, "nats": 4222}
NAMES = {"redis": "Redis", "amqp": "RabbitMQ", "mqtt": "Mosquitto (MQTT)", "nats": "NATS"}
LOOPBACK = {"allow_internal": True}
"""The test brokers are on loopback, which endpoints reach only when they say so."""


def require_broker(protocol: str) -> None:
    """Skip with one line when the broker is unreachable, unless CI is set: then fail."""
    port = PORTS[protocol]
    try:
        socket.create_connection((HOST, port), timeout=1).close()
    except OSError as error:
        reason = f"{NAMES[protocol]} not reachable on {HOST}:{port} ({error.strerror or error})"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI is set, so broker tests are mandatory")
        pytest.skip(reason)


@dataclass
class Received:
    payload: Any
    headers: dict[str, str]


def url_for(protocol: str, port: int | None = None) -> str:
    port = port or PORTS[protocol]
    return {"redis": f"redis://{HOST}:{port}/0", "amqp": f"amqp://guest:guest@{HOST}:{port}/",
            "mqtt": f"mqtt://{HOST}:{port}", "nats": f"nats://{HOST}:{port}"}[protocol]


class Broker:
    """A unique destination on one broker: config() for the endpoint, read() what arrived."""

    def __init__(self, protocol: str) -> None:
        self.protocol = protocol
        self.name = f"courier-test-{uuid.uuid4().hex[:10]}"

    @staticmethod
    def of(protocol: str) -> Broker:
        return {"redis": RedisBroker, "amqp": AmqpBroker, "mqtt": MqttBroker, "nats": NatsBroker}[protocol](protocol)

    def config(self, port: int | None = None, **extra: Any) -> dict[str, Any]:
        raise NotImplementedError

    async def setup(self) -> None: ...

    async def read(self) -> list[Received]:
        raise NotImplementedError

    async def cleanup(self) -> None: ...


class RedisBroker(Broker):
    def config(self, port=None, **extra):
        return {"url": url_for("redis", port), "stream": self.name, "maxlen": 100000, **LOOPBACK, **extra}

    async def read(self):
        import redis.asyncio as aioredis

        client = aioredis.from_url(url_for("redis"), decode_responses=True)
        try:
            entries = await client.xrange(self.name)
        finally:
            await client.aclose()
        return [Received(json.loads(fields.pop("payload")), fields) for _, fields in entries]

    async def cleanup(self):
        import redis.asyncio as aioredis

        client = aioredis.from_url(url_for("redis"))
        try:
            await client.delete(self.name)
        finally:
            await client.aclose()


class AmqpBroker(Broker):
    """A direct exchange and a queue bound to it with routing key "created"."""

    async def setup(self):
        import aio_pika

        self._connection = await aio_pika.connect(url_for("amqp"))
        channel = await self._connection.channel()
        self._exchange = await channel.declare_exchange(self.name, aio_pika.ExchangeType.DIRECT)
        self._queue = await channel.declare_queue(self.name)
        await self._queue.bind(self._exchange, "created")

    def config(self, port=None, **extra):
        return {"url": url_for("amqp", port), "exchange": self.name, "routing_key": "created", **LOOPBACK, **extra}

    async def read(self):
        received = []
        while (message := await self._queue.get(no_ack=True, fail=False)) is not None:
            headers = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in (message.headers or {}).items()}
            headers["amqp-message-id"] = message.message_id
            if message.correlation_id:
                headers["amqp-correlation-id"] = message.correlation_id
            received.append(Received(json.loads(message.body), headers))
        return received

    async def cleanup(self):
        with contextlib.suppress(Exception):
            await self._queue.delete(if_unused=False, if_empty=False)
            await self._exchange.delete()
        await self._connection.close()


class MqttBroker(Broker):
    """A subscriber at QoS 1 (MQTT 5, so user properties arrive) collecting in the background."""

    async def setup(self):
        import aiomqtt

        self._received: list[Received] = []
        self._client = aiomqtt.Client(HOST, PORTS["mqtt"], protocol=aiomqtt.ProtocolVersion.V5,
                                      identifier=f"sub-{self.name}", max_queued_incoming_messages=0)
        await self._client.__aenter__()
        await self._client.subscribe(f"{self.name}/#", qos=1)  # "#" also matches the parent level
        self._task = asyncio.create_task(self._collect())

    async def _collect(self):
        async for message in self._client.messages:
            props = message.properties
            headers = dict(getattr(props, "UserProperty", None) or [])
            if getattr(props, "CorrelationData", None):
                headers["mqtt-correlation-data"] = props.CorrelationData.decode()
            self._received.append(Received(json.loads(message.payload), headers))

    def config(self, port=None, **extra):
        return {"url": url_for("mqtt", port), "topic": self.name, "qos": 1, **LOOPBACK, **extra}

    async def read(self):
        await asyncio.sleep(0.3)  # the last deliveries to the subscriber
        return list(self._received)

    async def cleanup(self):
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self._client.__aexit__(None, None, None)


class NatsBroker(Broker):
    """A JetStream stream capturing the subject <name>.created."""

    async def setup(self):
        import nats

        self._nc = await nats.connect(url_for("nats"))
        self._js = self._nc.jetstream()
        await self._js.add_stream(name=self.name, subjects=[f"{self.name}.>"])

    def config(self, port=None, **extra):
        return {"url": url_for("nats", port), "subject": f"{self.name}.created", "jetstream": True, **LOOPBACK,
                **extra}

    async def read(self):
        info = await self._js.stream_info(self.name)
        if info.state.messages == 0:
            return []
        received = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            message = await self._js.get_msg(self.name, seq)
            received.append(Received(json.loads(message.data), dict(message.headers or {})))
        return received

    async def cleanup(self):
        with contextlib.suppress(Exception):
            await self._js.delete_stream(self.name)
        await self._nc.close()
