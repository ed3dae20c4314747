"""RabbitMQ (AMQP 0-9-1) over aio-pika: a channel in publisher-confirm mode per endpoint;
each message is published to config.exchange (the default exchange when absent) with
config.routing_key and `mandatory`, and a batch's confirms are awaited together. A message is
delivered once the broker confirmed it (basic.ack); a message the broker returns as
unroutable (no queue bound for the routing key) or nacks is not.

Each message: the payload JSON as the body (content type application/json), its global id
(unique across databases) as message_id, its correlation id as correlation_id, persistent
(delivery mode 2) unless config.persistent is false, and as AMQP headers the producer's headers
plus courier-message-id, courier-global-id, courier-attempt, courier-correlation-id and
courier-idempotency-key.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aio_pika
import aio_pika.exceptions as pex
import aiormq.exceptions as aex
from aiormq.connection import TransportFactory
from pamqp.commands import Basic
from yarl import URL

from sqlkit.messages import ClaimedMessage

from ..outcome import Outcome
from . import Target
from .broker import BrokerDispatcher, courier_headers, redacted, timeout_of


@dataclass
class Publisher:
    connection: aio_pika.abc.AbstractConnection
    channel: aio_pika.abc.AbstractChannel
    exchange: aio_pika.abc.AbstractExchange


def amqp_message(message: ClaimedMessage, persistent: bool) -> aio_pika.Message:
    return aio_pika.Message(
        message.payload_json.encode(), content_type="application/json", message_id=message.global_id,
        correlation_id=str(message.correlation_id) if message.correlation_id else None,
        headers=courier_headers(message),
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT if persistent else aio_pika.DeliveryMode.NOT_PERSISTENT)


class _PinnedTransport(TransportFactory):
    """aiormq's TCP and TLS transports, connecting to the pinned address; TLS checks the URL's host."""

    def __init__(self, pinned: str) -> None:
        self.pinned = pinned

    async def create(self, url: URL, **kwargs: Any) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        provider = kwargs.pop("ssl_context_provider")
        tls = url.scheme == "amqps"
        context = await provider.get_context() if tls else None
        try:
            return await asyncio.open_connection(host=self.pinned, port=url.port, ssl=context,
                                                 server_hostname=url.host if tls else None, **kwargs)
        except OSError as error:
            raise aex.AMQPConnectionError(*error.args) from error


def _pinned(pinned: str) -> type[aio_pika.Connection]:
    class Pinned(aio_pika.Connection):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.kwargs["transport_factory"] = _PinnedTransport(pinned)  # handed on to aiormq

    return Pinned


class AmqpDispatcher(BrokerDispatcher[Publisher]):
    async def open(self, target: Target, pinned: str | None) -> Publisher:
        connection = await aio_pika.connect(
            target.config["url"], timeout=timeout_of(target),
            client_properties={"connection_name": f"courier {target.name}"},
            connection_class=aio_pika.Connection if pinned is None else _pinned(pinned))
        try:
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            name = target.config.get("exchange") or ""
            exchange = channel.default_exchange if name == "" else await channel.get_exchange(name, ensure=False)
        except BaseException:
            await connection.close()
            raise
        return Publisher(connection, channel, exchange)

    async def close_connection(self, connection: Publisher) -> None:
        await connection.connection.close()

    async def publish(self, target: Target, connection: Publisher,
                      messages: Sequence[ClaimedMessage]) -> list[Outcome]:
        routing_key = target.config["routing_key"]
        persistent = target.config.get("persistent", True)
        results = await asyncio.gather(*(
            connection.exchange.publish(amqp_message(m, persistent), routing_key, mandatory=True)
            for m in messages), return_exceptions=True)
        outcomes, broken = [], None
        for result in results:
            if isinstance(result, Basic.Ack):
                outcomes.append(Outcome.success())
            elif isinstance(result, BaseException):
                if isinstance(result, asyncio.CancelledError):
                    raise result
                outcome, drop = self.classify(target, result)
                outcomes.append(outcome)
                broken = broken or (result if drop else None)
            else:  # basic.nack, or a return the client did not raise
                outcomes.append(Outcome.retryable(f"amqp broker did not confirm the message: {result!r}"[:300]))
        if broken is not None:
            await self.connections.discard(target, connection, broken)
        return outcomes

    def classify(self, target: Target, error: BaseException) -> tuple[Outcome, bool]:
        text = f"{type(error).__name__}: {str(error)[:300]}"
        exchange = target.config.get("exchange") or "(default exchange)"
        if isinstance(error, pex.DeliveryError | pex.PublishError):
            frame = getattr(error, "frame", None)
            if isinstance(frame, Basic.Nack):
                return Outcome.retryable(f"amqp broker nacked the message: {text}"), False
            return Outcome.retryable(f"amqp message unroutable: exchange {exchange!r} returned it for routing key "
                                     f"{target.config['routing_key']!r} (no queue bound)"), False
        if isinstance(error, aex.AuthenticationError | aex.ProbableAuthenticationError | aex.ChannelAccessRefused
                      | aex.ConnectionNotAllowed):
            return Outcome.disable(f"amqp broker refused access ({redacted(target.config['url'])}): {text}"), True
        if isinstance(error, aex.ChannelNotFoundEntity):
            return Outcome.disable(f"amqp exchange {exchange!r} does not exist: {text}"), True
        if isinstance(error, aex.ChannelPreconditionFailed):
            # RabbitMQ closes the channel with 406 for a message over max_message_size.
            return Outcome.permanent(f"amqp broker refused the message: {text}"), True
        if isinstance(error, aex.ConnectionResourceError):
            return Outcome.retryable(f"amqp broker back-pressure: {text}"), True
        return Outcome.retryable(f"amqp connection error ({redacted(target.config['url'])}): {text}"), True
