"""Dispatchers behind one interface: given messages for an endpoint, one outcome each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from sqlkit.messages import ClaimedMessage

from ..outcome import Outcome


@dataclass(frozen=True)
class Target:
    """An endpoint as a dispatcher needs it, secrets included."""

    id: int
    name: str
    protocol: str
    config: dict[str, Any]


class Dispatcher(Protocol):
    async def deliver(self, target: Target, message: ClaimedMessage) -> Outcome: ...

    async def close(self) -> None: ...


def dispatcher_for(protocol: str, settings: dict[str, str]) -> Dispatcher | None:
    """A new dispatcher for protocol, or None where this build cannot deliver it yet."""
    if protocol == "noop":
        from .noop import NoopDispatcher
        return NoopDispatcher()
    if protocol == "http":
        from .http import HttpDispatcher
        return HttpDispatcher(settings)
    return None

