"""NATS over nats-py: one connection per endpoint; each message is published to
config.subject, a batch's publishes concurrently.

With JetStream (the default, `"jetstream": true`) a message is delivered once the stream that
captures the subject returned its PubAck; each carries its global id as `Nats-Msg-Id`, so the
stream's duplicate window also drops a redelivery of a message whose PubAck was lost, and
only that: another database's message of the same id is not a duplicate. Core
NATS (`"jetstream": false`, asked for explicitly) is at most once: a batch counts as delivered
once the server answered the PING that follows it, whether or not anyone was subscribed.

Each message: the payload JSON as the data, and as NATS headers the producer's headers plus
courier-message-id, courier-global-id, courier-attempt, courier-correlation-id and
courier-idempotency-key.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from urllib.parse import urlsplit

import nats
import nats.errors as nerr
import nats.js.errors as jerr
from nats.aio.client import Client as NatsClient

from sqlkit.messages import ClaimedMessage

from ..outcome import Outcome
from . import Target
from .broker import BrokerDispatcher, courier_headers, redacted, timeout_of

# JetStream API error codes (nats-server's errors.json) for a message the stream refuses as
# too large, and for a stream that is full with the "discard new" policy (back-pressure).
_TOO_LARGE = {10054}
_FULL = {10077, 10027, 10028}


_SUCCESS = Outcome.success()


async def _quiet(_error: Exception) -> None:
    return None


def nats_headers(message: ClaimedMessage, jetstream: bool) -> dict[str, str]:
    headers = courier_headers(message)
    if jetstream:
        headers["Nats-Msg-Id"] = message.global_id
    return headers


def _pinned_url(url: str, pinned: str) -> str:
    """url with its host replaced by the pinned address (credentials and port kept)."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    host = f"[{pinned}]" if ":" in pinned else pinned
    port = f":{parts.port}" if parts.port else ""
    return parts._replace(netloc=f"{userinfo}@{host}{port}" if userinfo else f"{host}{port}").geturl()


class NatsDispatcher(BrokerDispatcher[NatsClient]):
    async def open(self, target: Target, pinned: str | None) -> NatsClient:
        url = target.config["url"]
        options = {}
        if pinned is not None:
            options["tls_hostname"] = urlsplit(url).hostname
            url = _pinned_url(url, pinned)
        # No reconnection inside the client (it would buffer publishes while away, and go to
        # servers the cluster advertises, unchecked): the dispatcher reconnects with its own
        # backoff, and the pool retries what failed.
        return await nats.connect(url, name=f"courier {target.name}", allow_reconnect=False,
                                  connect_timeout=timeout_of(target), max_reconnect_attempts=0,
                                  error_cb=_quiet, disconnected_cb=None, **options)

    async def close_connection(self, connection: NatsClient) -> None:
        await connection.close()

    async def publish(self, target: Target, connection: NatsClient,
                      messages: Sequence[ClaimedMessage]) -> list[Outcome]:
        if not connection.is_connected:
            raise nerr.ConnectionClosedError()
        subject = target.config["subject"]
        jetstream = target.config.get("jetstream", True)
        if not jetstream:
            for message in messages:
                try:
                    await connection.publish(subject, message.payload_json.encode(),
                                             headers=nats_headers(message, False))
                except nerr.MaxPayloadError as error:
                    return [self.classify(target, error)[0] if m is message else
                            Outcome.retryable("not sent: an earlier message of its batch was refused")
                            for m in messages]
            await connection.flush(timeout_of(target))
            return [Outcome.success()] * len(messages)
        js = connection.jetstream(timeout=timeout_of(target))
        results = await asyncio.gather(*(
            js.publish(subject, m.payload_json.encode(), headers=nats_headers(m, True)) for m in messages),
            return_exceptions=True)
        outcomes, broken = [], None
        for result in results:
            if isinstance(result, asyncio.CancelledError):
                raise result
            if isinstance(result, BaseException):
                outcome, drop = self.classify(target, result)
                outcomes.append(outcome)
                broken = broken or (result if drop else None)
            else:  # the PubAck's stream and sequence: not recorded, as for HTTP responses
                outcomes.append(_SUCCESS)
        if broken is not None:
            await self.connections.discard(target, connection, broken)
        return outcomes

    def classify(self, target: Target, error: BaseException) -> tuple[Outcome, bool]:
        text = f"{type(error).__name__}: {str(error)[:300]}"
        subject = target.config["subject"]
        if isinstance(error, nerr.MaxPayloadError):
            return Outcome.permanent(f"nats message larger than the server's max_payload: {text}"), False
        if isinstance(error, nerr.NoRespondersError | jerr.NoStreamResponseError):
            return Outcome.disable(f"no JetStream stream captures subject {subject!r} (create one, or set "
                                   f"\"jetstream\": false for at-most-once core NATS)"), False
        if isinstance(error, jerr.APIError):
            code = getattr(error, "err_code", None)
            if code in _TOO_LARGE:
                return Outcome.permanent(f"JetStream refused the message as too large: {text}"), False
            if code in _FULL or isinstance(error, jerr.ServiceUnavailableError | jerr.ServerError):
                return Outcome.retryable(f"JetStream back-pressure: {text}"), False
            if isinstance(error, jerr.NotFoundError):
                return Outcome.disable(f"JetStream stream for {subject!r} not found: {text}"), False
            return Outcome.permanent(f"JetStream refused the message: {text}"), False
        if isinstance(error, nerr.AuthorizationError) or "authorization" in str(error).lower():
            return Outcome.disable(f"nats server refused the credentials or permissions "
                                   f"({redacted(target.config['url'])}): {text}"), True
        if isinstance(error, nerr.BadSubjectError | nerr.BadHeaderError):
            return Outcome.permanent(f"nats refused the subject or a header: {text}"), False
        return Outcome.retryable(f"nats connection error ({redacted(target.config['url'])}): {text}"), True
