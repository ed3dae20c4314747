"""MQTT 5 over aiomqtt (paho-mqtt): one client per endpoint; each message is published to
config.topic with config.qos (default 1) and config.retain, a batch's publishes concurrently.

QoS 1 and 2 are at least once: a message is delivered once the broker acknowledged it
(PUBACK, or PUBCOMP for QoS 2) with a success reason code. QoS 0 is at most once: it is used
only when the config asks for `"qos": 0`, and a message then counts as delivered once the
client handed it to the socket, without any acknowledgement.

Each message: the payload JSON as the payload (content type application/json, payload format
indicator UTF-8), Courier's correlation id as Correlation Data, and as MQTT 5 user properties
the producer's headers plus courier-message-id, courier-global-id, courier-attempt,
courier-correlation-id and courier-idempotency-key.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import uuid
from collections.abc import Sequence

import aiomqtt
import paho.mqtt.client as paho
from aiomqtt.exceptions import MqttConnectError
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from sqlkit.messages import ClaimedMessage

from ..outcome import Outcome
from . import Target
from .broker import BrokerDispatcher, address, courier_headers, redacted, timeout_of

# PUBACK/PUBREC reason codes (MQTT 5, 3.4.2.1) and CONNACK codes that say the endpoint's
# config is wrong, not that the broker is busy.
_REFUSED = {0x86: "bad user name or password", 0x87: "not authorized", 0x90: "topic name invalid",
            0x8C: "bad authentication method", 0x85: "client identifier not valid", 0x84: "unsupported protocol"}
_TOO_LARGE = {0x95: "packet too large", 0x99: "payload format invalid"}
# MQTT 3.1.1 CONNACK return codes: 4 bad user name or password, 5 not authorized.
_REFUSED_V3 = {4, 5}


class PublishRefused(Exception):
    def __init__(self, reason: ReasonCode | None, what: str = "") -> None:
        super().__init__(what or str(reason))
        self.reason = reason


class _Client(aiomqtt.Client):
    """aiomqtt's client, with a publish that reports the broker's reason code: aiomqtt's own
    treats a PUBACK that refuses the message (0x87 not authorized, 0x97 quota exceeded, ...)
    as a success, which at-least-once delivery cannot."""

    def __init__(self, *args, pinned: str | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._reasons: dict[int, ReasonCode] = {}
        # A batch is published at once: hundreds of publishes awaiting their PUBACK are the
        # design, not the "concerning number" aiomqtt would log a warning for on every call.
        self.pending_calls_threshold = 100_000
        if pinned is not None:
            # paho connects to its host by name; the socket goes to the checked address instead,
            # and TLS (wrapped around it by paho) still checks the host's name.
            paho_client = self._client

            def connect_pinned() -> socket.socket:
                return socket.create_connection((pinned, paho_client._port), timeout=paho_client._connect_timeout)

            paho_client._create_socket_connection = connect_pinned

    def _on_publish(self, client, userdata, mid, reason_code, properties) -> None:
        self._reasons[mid] = reason_code
        super()._on_publish(client, userdata, mid, reason_code, properties)

    @property
    def is_connected(self) -> bool:
        return self._connected.done() and not self._disconnected.done()

    async def publish_acknowledged(self, topic: str, payload: bytes, qos: int, retain: bool,
                                   properties: Properties) -> None:
        if not self.is_connected:
            raise aiomqtt.MqttError("not connected to the MQTT broker")
        info = self._client.publish(topic, payload, qos, retain, properties)
        if info.rc != paho.MQTT_ERR_SUCCESS:
            raise aiomqtt.MqttCodeError(info.rc, "Could not publish message")
        if not info.is_published():
            confirmation = asyncio.Event()
            with self._pending_call(info.mid, confirmation, self._pending_publishes):
                await confirmation.wait()  # bounded by the batch's timeout
        reason = self._reasons.pop(info.mid, None)
        if reason is not None and reason.is_failure:
            raise PublishRefused(reason)


def properties_of(message: ClaimedMessage) -> Properties:
    properties = Properties(PacketTypes.PUBLISH)
    properties.ContentType = "application/json"
    properties.PayloadFormatIndicator = 1
    if message.correlation_id:
        properties.CorrelationData = str(message.correlation_id).encode()
    properties.UserProperty = list(courier_headers(message).items())
    return properties


class MqttDispatcher(BrokerDispatcher[_Client]):
    async def open(self, target: Target, pinned: str | None) -> _Client:
        url = target.config["url"]
        where = address(url)
        tls = ssl.create_default_context() if url.startswith("mqtts://") else None
        client = _Client(where.host, where.port or (8883 if tls else 1883), username=where.username,
                         password=where.password, identifier=f"courier-{target.name}-{uuid.uuid4().hex[:8]}"[:64],
                         protocol=aiomqtt.ProtocolVersion.V5, timeout=timeout_of(target), tls_context=tls,
                         max_inflight_messages=1000, max_queued_outgoing_messages=0, pinned=pinned)
        await client.__aenter__()
        return client

    async def close_connection(self, connection: _Client) -> None:
        await connection.__aexit__(None, None, None)

    async def publish(self, target: Target, connection: _Client,
                      messages: Sequence[ClaimedMessage]) -> list[Outcome]:
        topic = target.config["topic"]
        qos = int(target.config.get("qos", 1))
        retain = bool(target.config.get("retain", False))
        results = await asyncio.gather(*(
            connection.publish_acknowledged(topic, m.payload_json.encode(), qos, retain, properties_of(m))
            for m in messages), return_exceptions=True)
        outcomes, broken = [], None
        for result in results:
            if isinstance(result, asyncio.CancelledError):
                raise result
            if isinstance(result, BaseException):
                outcome, drop = self.classify(target, result)
                outcomes.append(outcome)
                broken = broken or (result if drop else None)
            else:
                outcomes.append(Outcome.success())
        if broken is not None:
            await self.connections.discard(target, connection, broken)
        return outcomes

    def classify(self, target: Target, error: BaseException) -> tuple[Outcome, bool]:
        text = f"{type(error).__name__}: {str(error)[:300]}"
        if isinstance(error, PublishRefused):
            code = error.reason.value if error.reason is not None else 0
            if code in _REFUSED:
                return Outcome.disable(f"mqtt broker refused the publish to {target.config['topic']!r}: "
                                       f"{_REFUSED[code]} (0x{code:02X})"), False
            if code in _TOO_LARGE:
                return Outcome.permanent(f"mqtt broker refused the message: {_TOO_LARGE[code]} (0x{code:02X})"), False
            return Outcome.retryable(f"mqtt broker did not accept the message: {error.reason} (0x{code:02X})"), False
        if isinstance(error, MqttConnectError):
            rc = error.rc
            code = rc.value if isinstance(rc, ReasonCode) else rc
            if (isinstance(rc, ReasonCode) and code in _REFUSED) or (isinstance(rc, int) and code in _REFUSED_V3):
                return Outcome.disable(f"mqtt broker refused the connection ({redacted(target.config['url'])}): "
                                       f"{text}"), True
            return Outcome.retryable(f"mqtt broker refused the connection: {text}"), True
        if isinstance(error, ValueError) and "too large" in str(error).lower():
            return Outcome.permanent(f"mqtt message too large: {text}"), False
        return Outcome.retryable(f"mqtt connection error ({redacted(target.config['url'])}): {text}"), True
