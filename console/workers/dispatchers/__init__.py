"""Dispatchers behind one interface: given messages for an endpoint, one outcome each.

A dispatcher implements `deliver` (one message), `deliver_batch` (a claimed batch, one
outcome per message in the same order) or both; `BaseDispatcher` derives whichever is
missing. The pool hands a whole claimed batch to a dispatcher whose class sets `batched`
(noop and the brokers, which publish a batch and await its acknowledgements together), and
one message at a time otherwise (HTTP, so that each response frees its slot as it arrives).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from sqlkit.messages import ClaimedMessage

from ...extras import for_protocol
from ..outcome import Outcome

BROKER_PROTOCOLS = ("redis", "amqp", "mqtt", "nats")


@dataclass(frozen=True)
class Target:
    """An endpoint as a dispatcher needs it, secrets included."""

    id: int
    name: str
    protocol: str
    config: dict[str, Any]


class Dispatcher(Protocol):
    batched: ClassVar[bool]

    async def deliver(self, target: Target, message: ClaimedMessage) -> Outcome: ...

    async def deliver_batch(self, target: Target, messages: Sequence[ClaimedMessage]) -> list[Outcome]: ...

    async def close(self) -> None: ...


class BaseDispatcher:
    """Derives deliver_batch from deliver (run concurrently) or deliver from deliver_batch;
    a subclass overrides at least one of them."""

    batched: ClassVar[bool] = False

    async def deliver(self, target: Target, message: ClaimedMessage) -> Outcome:
        return (await self.deliver_batch(target, [message]))[0]

    async def deliver_batch(self, target: Target, messages: Sequence[ClaimedMessage]) -> list[Outcome]:
        return list(await asyncio.gather(*(self.deliver(target, message) for message in messages)))

    async def close(self) -> None:
        return None


def dispatcher_for(protocol: str, settings: dict[str, str]) -> Dispatcher | None:
    """A new dispatcher for protocol, or None where this install cannot deliver it (an unknown
    protocol, or a broker whose client's extra is not installed)."""
    extra = for_protocol(protocol)
    if extra is not None and not extra.installed():
        return None
    if protocol == "noop":
        from .noop import NoopDispatcher
        return NoopDispatcher()
    if protocol == "http":
        from .http import HttpDispatcher
        return HttpDispatcher(settings)
    if protocol == "redis":
        from .redis import RedisDispatcher
        return RedisDispatcher(settings)
    if protocol == "amqp":
        from .amqp import AmqpDispatcher
        return AmqpDispatcher(settings)
    if protocol == "mqtt":
        from .mqtt import MqttDispatcher
        return MqttDispatcher(settings)
    if protocol == "nats":
        from .nats import NatsDispatcher
        return NatsDispatcher(settings)
    return None
