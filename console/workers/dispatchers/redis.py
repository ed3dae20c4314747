"""Redis Streams: each message is one XADD to config.stream, capped by config.maxlen
(MAXLEN ~, so trimming stays cheap), a whole batch in one pipeline (one round trip).
A message is delivered once its XADD returned an entry id.

Fields of each entry: `payload` (the JSON text), the producer's headers by name, then
Courier's courier-message-id, courier-global-id, courier-attempt, courier-correlation-id and
courier-idempotency-key (which win over a producer header of the same name).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions as rex
from redis.asyncio.connection import Connection, ConnectionPool, parse_url
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from sqlkit.messages import ClaimedMessage

from ..outcome import Outcome
from . import Target
from .broker import BrokerDispatcher, courier_headers, redacted, timeout_of

_SUCCESS = Outcome.success()


def entry_fields(message: ClaimedMessage) -> dict[str, str]:
    return {"payload": message.payload_json, **{k: v for k, v in courier_headers(message).items() if k != "payload"}}


def _pinned(connection_class: type[Connection], pinned: str) -> type[Connection]:
    """connection_class connecting to the pinned address, its TLS still checking the URL's host:
    the client reconnects by itself, and every connection must go where the check said."""

    class Pinned(connection_class):  # type: ignore[misc, valid-type]
        def _connection_arguments(self) -> dict[str, Any]:
            arguments = {**super()._connection_arguments(), "host": pinned}
            if arguments.get("ssl") is not None:
                arguments["server_hostname"] = self.host
            return arguments

    return Pinned


class RedisDispatcher(BrokerDispatcher[aioredis.Redis]):
    async def open(self, target: Target, pinned: str | None) -> aioredis.Redis:
        timeout = timeout_of(target)
        options = parse_url(target.config["url"])
        if pinned is not None:
            options["connection_class"] = _pinned(options.get("connection_class", Connection), pinned)
        # No retries inside the client: a failure comes back as an outcome, and the pool's
        # retry policy and circuit decide what follows. No socket_timeout (redis-py's default is
        # 5 s): deliver_batch bounds each whole batch by the endpoint's timeout already, and
        # redis-py would arm a timer of its own around every reply (8% of the worker's time
        # delivering to a stream).
        pool = ConnectionPool(socket_timeout=None, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0),
                              retry_on_timeout=False, client_name="courier-worker", **options)
        client = aioredis.Redis(connection_pool=pool)
        try:
            await client.ping()
        except BaseException:
            await client.aclose(close_connection_pool=True)
            raise
        return client

    async def close_connection(self, connection: aioredis.Redis) -> None:
        await connection.aclose(close_connection_pool=True)

    async def publish(self, target: Target, connection: aioredis.Redis,
                      messages: Sequence[ClaimedMessage]) -> list[Outcome]:
        stream = target.config["stream"]
        maxlen = target.config.get("maxlen")
        async with connection.pipeline(transaction=False) as pipe:
            for message in messages:
                pipe.xadd(stream, entry_fields(message), maxlen=maxlen, approximate=True)
            replies = await pipe.execute(raise_on_error=False)
        outcomes = []
        for reply in replies:
            if isinstance(reply, BaseException):
                outcome, drop = self.classify(target, reply)
                if drop:
                    raise reply
                outcomes.append(outcome)
            else:  # the entry id: not recorded, as HTTP records no response unless asked to
                outcomes.append(_SUCCESS)
        return outcomes

    def classify(self, target: Target, error: BaseException) -> tuple[Outcome, bool]:
        where = redacted(target.config["url"])
        text = f"{type(error).__name__}: {str(error)[:300]}"
        if isinstance(error, rex.AuthenticationError | rex.AuthorizationError | rex.NoPermissionError):
            return Outcome.disable(f"redis refused the credentials or ACL of {where}: {text}"), True
        if isinstance(error, rex.BusyLoadingError | rex.OutOfMemoryError | rex.ReadOnlyError):
            return Outcome.retryable(f"redis back-pressure: {text}"), False
        if isinstance(error, rex.ConnectionError | rex.TimeoutError | OSError):
            return Outcome.retryable(f"redis connection error ({where}): {text}"), True
        if isinstance(error, rex.ResponseError):
            reply = str(error)
            if reply.startswith(("WRONGTYPE", "NOAUTH", "WRONGPASS", "NOPERM")):
                return Outcome.disable(f"redis refused XADD to {target.config['stream']!r}: {text}"), False
            if reply.startswith(("OOM", "BUSY", "LOADING", "TRYAGAIN", "MASTERDOWN", "CLUSTERDOWN", "READONLY")):
                return Outcome.retryable(f"redis back-pressure: {text}"), False
            if "max" in reply.lower() and ("bulk" in reply.lower() or "size" in reply.lower()):
                return Outcome.permanent(f"redis refused the entry as too large: {text}"), False
            return Outcome.permanent(f"redis refused XADD: {text}"), False
        return Outcome.retryable(f"redis error: {text}"), True
