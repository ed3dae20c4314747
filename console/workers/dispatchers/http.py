"""HTTP webhooks over aiohttp's client: one pooled session, auth, Standard Webhooks signing,
CloudEvents, internal-address blocking, response capture, and ulak's error classes.

aiohttp rather than httpx because it measured clearly faster as a plain load generator
against the same sink: 2.5k against 0.75k requests/s on one connection, 4.8k against 0.7k
with eight (two cores, loopback).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import time
from collections.abc import Collection
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from sqlkit.messages import ClaimedMessage

from ..outcome import Outcome
from . import BaseDispatcher, Target
from .address_guard import GuardedResolver, InternalAddressRefused, internal_literal, refused

RETRY_AFTER_CAP = 86_400


def classify(status: int, retry_after: str | None, snooze_statuses: Collection[int] = ()) -> Outcome:
    """ulak's classes: 2xx success; 429 and 5xx retryable; 410 disable; other 4xx permanent. A
    status the endpoint lists in snooze_statuses that comes with a Retry-After snoozes the
    message: due again then, no attempt counted (River's snooze, for a receiver that says
    "not yet"); without the header it is classed as above."""
    if status in snooze_statuses:
        seconds = parse_retry_after(retry_after)
        if seconds is not None:
            return Outcome.snooze(status, seconds)
    if 200 <= status < 300:
        return Outcome.success()
    if status == 410:
        return Outcome.disable("HTTP 410 Gone")
    if status == 429 or status >= 500:
        honoured = parse_retry_after(retry_after) if status in (429, 503) else None
        return Outcome.retryable(f"HTTP {status}", honoured)
    return Outcome.permanent(f"HTTP {status}")


def parse_retry_after(value: str | None, now: float | None = None) -> int | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date), capped at 24 h."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return min(int(value), RETRY_AFTER_CAP)
    try:
        when = parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError):
        return None
    return max(0, min(int(when - (now if now is not None else time.time())), RETRY_AFTER_CAP))


def standard_webhooks_signature(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` value of the Standard Webhooks spec (v1, HMAC-SHA256)."""
    key = base64.b64decode(secret.removeprefix("whsec_")) if secret.startswith("whsec_") else secret.encode()
    signed = f"{message_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


class HttpDispatcher(BaseDispatcher):
    def __init__(self, settings: dict[str, str]) -> None:
        self.apply_settings(settings)
        # Two sessions, so that a connection opened for an endpoint allowed internal addresses
        # is never reused for one that is not: the guarded one resolves through the check.
        self._guarded = self._new_session(GuardedResolver())
        self._open = self._new_session(None)

    @staticmethod
    def _new_session(resolver: GuardedResolver | None) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(limit=512, limit_per_host=0, resolver=resolver)
        return aiohttp.ClientSession(connector=connector, auto_decompress=False)

    def apply_settings(self, settings: dict[str, str]) -> None:
        """The dispatcher settings as the pool last read them; called at every endpoint refresh,
        so turning http_allow_internal_urls off takes effect without a restart."""
        self._default_timeout = float(settings.get("http_timeout", "10"))
        self._allow_internal = settings.get("http_allow_internal_urls", "false") == "true"
        self._capture_all = settings.get("capture_response", "false") == "true"
        self._capture_limit = int(settings.get("response_body_max_size", "65536"))

    async def close(self) -> None:
        await self._guarded.close()
        await self._open.close()

    async def deliver(self, target: Target, message: ClaimedMessage) -> Outcome:
        config = target.config
        url = config["url"]
        allow_internal = self._allow_internal or config.get("allow_internal") is True
        if not allow_internal:
            literal = internal_literal(urlsplit(url).hostname or "")
            if literal:  # aiohttp connects to an IP literal without asking the resolver
                return refused(literal)
        session = self._open if allow_internal else self._guarded
        body, headers = self._request_body(config, message)
        total = float(config.get("timeout", self._default_timeout))
        timeout = aiohttp.ClientTimeout(total=total, connect=float(config.get("connect_timeout", total)))
        capture = self._capture_all or config.get("capture_response") is True
        try:
            async with session.request(config.get("method", "POST").upper(), url, data=body, headers=headers,
                                       timeout=timeout, allow_redirects=False,
                                       skip_auto_headers=("Accept-Encoding",)) as response:
                if capture:
                    content = await _read_at_most(response, self._capture_limit + 1)
                else:  # what has arrived, so that a short body's connection can be reused
                    content = await response.content.read(self._capture_limit + 1)
        except InternalAddressRefused as refusal:
            return refused(refusal.address, refusal.host)
        except TimeoutError as error:
            return Outcome.retryable(f"timeout: {type(error).__name__}")
        except aiohttp.ClientError as error:
            return Outcome.retryable(f"connection error: {type(error).__name__}: {error}")
        outcome = classify(response.status, response.headers.get("retry-after"), config.get("snooze_statuses") or ())
        if capture:
            outcome = Outcome(outcome.kind, outcome.error, outcome.retry_after,
                              self._captured(response.status, content, message))
        return outcome

    @staticmethod
    def _request_body(config: dict[str, Any], message: ClaimedMessage) -> tuple[bytes, dict[str, str]]:
        # webhook-id and the CloudEvents id are what receivers deduplicate on: unique across
        # databases, the same for every attempt.
        message_id = message.global_id
        headers = {"content-type": "application/json", "user-agent": "courier",
                   "x-courier-message-id": str(message.id), "x-courier-global-id": message_id,
                   "x-courier-attempt": str(message.retry_count + 1)}
        if message.correlation_id:
            headers["x-correlation-id"] = str(message.correlation_id)
        headers.update({k.lower(): str(v) for k, v in (config.get("headers") or {}).items()})
        headers.update({k.lower(): str(v) for k, v in (message.headers or {}).items()})
        auth = config.get("auth")
        if auth and auth["type"] == "bearer":
            headers["authorization"] = f"Bearer {auth['token']}"
        elif auth and auth["type"] == "basic":
            credentials = f"{auth['username']}:{auth['password']}".encode()
            headers["authorization"] = "Basic " + base64.b64encode(credentials).decode()

        cloudevents = config.get("cloudevents")
        body = message.payload_json.encode()
        if cloudevents:
            attributes = {
                "specversion": "1.0",
                "id": message_id,
                "source": cloudevents.get("source", f"courier/{message.endpoint_name}"),
                "type": cloudevents.get("type", "courier.message"),
                "time": message.created_at.isoformat(),
                "datacontenttype": "application/json",
            }
            if cloudevents["mode"] == "structured":
                # The payload's text as stored, not parsed and dumped: a float would round its numbers.
                body = orjson.dumps({**attributes, "data": orjson.Fragment(message.payload_json)})
                headers["content-type"] = "application/cloudevents+json"
            else:
                headers.update({f"ce-{k}": v for k, v in attributes.items() if k != "datacontenttype"})

        signing = config.get("signing")
        if signing:
            timestamp = int(time.time())
            headers["webhook-id"] = message_id
            headers["webhook-timestamp"] = str(timestamp)
            headers["webhook-signature"] = standard_webhooks_signature(signing["secret"], message_id, timestamp, body)
        return body, headers

    def _captured(self, status: int, content: bytes, message: ClaimedMessage) -> dict[str, Any]:
        text = content[: self._capture_limit].decode("utf-8", errors="replace")
        return {"status": status, "body": text, "truncated": len(content) > self._capture_limit,
                "correlation_id": str(message.correlation_id) if message.correlation_id else None}


async def _read_at_most(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """Up to limit bytes of the body, however it arrives: StreamReader.read(n) returns what is
    buffered, so a body sent in pieces was cut at the first piece and labelled complete."""
    try:
        return await response.content.readexactly(limit)
    except asyncio.IncompleteReadError as short:
        return short.partial

