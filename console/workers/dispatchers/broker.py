"""What the broker dispatchers (redis, amqp, mqtt, nats) share: one connection per endpoint,
opened on first use, reopened with backoff after a failure and whenever the endpoint's
config changes, closed when the pool drains; the headers every message carries; and the
batch timeout.

A connection is shared by every batch in flight for its endpoint. A failure that may have
broken it (a connection error or a timeout) discards it: the next batch reconnects, but not
before the backoff has passed; until then batches fail at once as RETRYABLE, without
touching the broker, and count towards the endpoint's circuit like the failure itself.

Internal addresses are refused as for HTTP: unless the endpoint says "allow_internal": true (or
the setting http_allow_internal_urls is on), a connection is opened only to an address its
URL's host resolved to and that checked external, and the refusal is PERMANENT. A connection
opened while internal addresses were allowed is dropped at the next batch once they are not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import unquote, urlsplit

from sqlkit.messages import ClaimedMessage
from sqlkit.redaction import redact_text

from ..outcome import Outcome
from . import BaseDispatcher, Target
from .address_guard import InternalAddressRefused, checked_address, refused

log = logging.getLogger("courier.worker")

C = TypeVar("C")

DEFAULT_TIMEOUT = 10.0
"""Seconds to connect, and to wait for a batch's acknowledgements, unless config.timeout says."""
BACKOFF_FIRST = 0.5
BACKOFF_MAX = 30.0


def timeout_of(target: Target) -> float:
    return float(target.config.get("timeout", DEFAULT_TIMEOUT))


def courier_headers(message: ClaimedMessage) -> dict[str, str]:
    """The producer's headers, then Courier's own (which win a clash): the message id, its
    global id (unique across databases: what a consumer deduplicates on), the attempt, and the
    correlation id and idempotency key where the message has them."""
    headers = {str(k): _text(v) for k, v in (message.headers or {}).items()}
    headers["courier-message-id"] = str(message.id)
    headers["courier-global-id"] = message.global_id
    headers["courier-attempt"] = str(message.retry_count + 1)
    if message.correlation_id:
        headers["courier-correlation-id"] = str(message.correlation_id)
    if message.idempotency_key:
        headers["courier-idempotency-key"] = message.idempotency_key
    return headers


def _text(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


@dataclass
class Address:
    host: str
    port: int | None
    username: str | None
    password: str | None
    path: str


def address(url: str) -> Address:
    parts = urlsplit(url)
    return Address(parts.hostname or "127.0.0.1", parts.port, unquote(parts.username) if parts.username else None,
                   unquote(parts.password) if parts.password else None, parts.path)


def redacted(url: str) -> str:
    """url without its credentials, for error messages (which end up in the event log and DLQ)."""
    return redact_text(url)


class Unavailable(Exception):
    """No connection to the endpoint's broker right now (connecting failed recently)."""


@dataclass
class _Entry(Generic[C]):
    signature: Any
    """What the connection was opened for: a change means a new connection."""
    connection: C | None = None
    failures: int = 0
    retry_at: float = 0.0
    last_error: str = ""
    users: int = 0
    """Batches publishing on this connection now."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Connections(Generic[C]):
    """One connection per endpoint, opened by `open(target)` and closed by `close(connection)`;
    `signature(target)` (by default its config) says what it was opened for."""

    def __init__(self, open: Callable[[Target], Awaitable[C]], close: Callable[[C], Awaitable[None]],
                 signature: Callable[[Target], Any] = lambda target: target.config) -> None:
        self._open = open
        self._close = close
        self._signature = signature
        self._entries: dict[int, _Entry[C]] = {}

    async def get(self, target: Target) -> C:
        entry = self._entries.get(target.id)
        signature = self._signature(target)
        if entry is not None and entry.signature != signature:
            # A config change takes effect at the next batch: the old connection goes.
            await self._close_entry(self._entries.pop(target.id))
            entry = None
        if entry is None:
            entry = self._entries[target.id] = _Entry(signature)
        if entry.connection is not None:
            return entry.connection
        async with entry.lock:
            if entry.connection is not None:
                return entry.connection
            wait = entry.retry_at - time.monotonic()
            if wait > 0:
                raise Unavailable(f"reconnecting in {wait:.1f}s after: {entry.last_error}")
            try:
                entry.connection = await asyncio.wait_for(self._open(target), timeout_of(target))
            except InternalAddressRefused:
                raise  # a refusal, not a failure to back off from: each batch is refused at once
            except Exception as error:
                self._failed(entry, error)
                raise
            entry.failures = 0
            log.info("broker connected", extra={"endpoint": target.name, "protocol": target.protocol})
            return entry.connection

    async def discard(self, target: Target, connection: C, error: BaseException) -> None:
        """Drop a connection that failed (if it is still the current one); back off."""
        entry = self._entries.get(target.id)
        if entry is None or entry.connection is not connection:
            return
        entry.connection = None
        self._failed(entry, error)
        log.warning("broker connection dropped", extra={"endpoint": target.name, "error": entry.last_error})
        await self._close_quietly(connection)

    def _failed(self, entry: _Entry[C], error: BaseException) -> None:
        entry.failures += 1
        entry.retry_at = time.monotonic() + min(BACKOFF_FIRST * 2 ** (entry.failures - 1), BACKOFF_MAX)
        entry.last_error = f"{type(error).__name__}: {str(error)[:200]}"

    def using(self, target: Target, delta: int) -> None:
        entry = self._entries.get(target.id)
        if entry is not None:
            entry.users = max(0, entry.users + delta)

    async def retain(self, live: set[int]) -> None:
        """Close the connections of endpoints not in live (dropped, disabled or no longer
        enabled), unless a batch is still publishing on one."""
        for endpoint_id in [i for i, e in self._entries.items() if i not in live and e.users <= 0]:
            await self._close_entry(self._entries.pop(endpoint_id))

    async def close_all(self) -> None:
        entries, self._entries = list(self._entries.values()), {}
        for entry in entries:
            await self._close_entry(entry)

    async def _close_entry(self, entry: _Entry[C]) -> None:
        if entry.connection is not None:
            connection, entry.connection = entry.connection, None
            await self._close_quietly(connection)

    async def _close_quietly(self, connection: C) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._close(connection), 5.0)


class BrokerDispatcher(BaseDispatcher, Generic[C]):
    """A batched dispatcher over Connections: subclasses open, close, publish a batch and
    classify errors; this class gets the connection, bounds the batch by the endpoint's
    timeout, and turns a connection-level failure into one outcome per message."""

    batched = True

    def __init__(self, settings: dict[str, str] | None = None) -> None:
        self.apply_settings(settings or {})
        self.connections: Connections[C] = Connections(
            self._open_checked, self.close_connection, lambda target: (target.config, self.allows_internal(target)))

    def apply_settings(self, settings: dict[str, str]) -> None:
        """The settings as the pool last read them (at every endpoint refresh)."""
        self._allow_internal = settings.get("http_allow_internal_urls", "false") == "true"

    def allows_internal(self, target: Target) -> bool:
        return self._allow_internal or target.config.get("allow_internal") is True

    async def _open_checked(self, target: Target) -> C:
        if self.allows_internal(target):
            return await self.open(target, None)
        return await self.open(target, await checked_address(address(target.config["url"]).host))

    async def open(self, target: Target, pinned: str | None) -> C:
        """A connection to the endpoint's broker: to the address pinned (resolved from the URL's
        host and checked), or by the URL's host itself when pinned is None (internal allowed).
        A TLS connection checks the URL's host either way."""
        raise NotImplementedError

    async def close_connection(self, connection: C) -> None:
        raise NotImplementedError

    async def publish(self, target: Target, connection: C, messages: Sequence[ClaimedMessage]) -> list[Outcome]:
        """One outcome per message; raise for a failure of the whole batch."""
        raise NotImplementedError

    def classify(self, target: Target, error: BaseException) -> tuple[Outcome, bool]:
        """The outcome of an error, and whether the connection should be dropped for it."""
        raise NotImplementedError

    def connect_outcome(self, target: Target, error: BaseException) -> Outcome:
        """The outcome of failing to connect: by default as classify says."""
        return self.classify(target, error)[0]

    async def deliver_batch(self, target: Target, messages: Sequence[ClaimedMessage]) -> list[Outcome]:
        try:
            connection = await self.connections.get(target)
        except Unavailable as error:
            return [Outcome.retryable(f"{target.protocol} broker unavailable: {error}")] * len(messages)
        except InternalAddressRefused as refusal:
            return [refused(refusal.address, refusal.host)] * len(messages)
        except TimeoutError:
            return [Outcome.retryable(f"timeout connecting to {target.protocol} broker "
                                      f"after {timeout_of(target)}s")] * len(messages)
        except Exception as error:
            return [self.connect_outcome(target, error)] * len(messages)
        self.connections.using(target, 1)
        try:
            return await asyncio.wait_for(self.publish(target, connection, messages), timeout_of(target))
        except TimeoutError as error:
            await self.connections.discard(target, connection, error)
            return [Outcome.retryable(f"timeout: no acknowledgement from the {target.protocol} broker "
                                      f"within {timeout_of(target)}s")] * len(messages)
        except Exception as error:
            outcome, drop = self.classify(target, error)
            if drop:
                await self.connections.discard(target, connection, error)
            return [outcome] * len(messages)
        finally:
            self.connections.using(target, -1)

    async def retain(self, live: set[int]) -> None:
        await self.connections.retain(live)

    async def close(self) -> None:
        await self.connections.close_all()
