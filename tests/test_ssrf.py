"""SSRF protection (issue 10, item 15, and for broker URLs issue 23, item 13): internal literals
refused at create_endpoint and alter_endpoint, names checked on every address they resolve to,
the connection pinned to the checked address, and http_allow_internal_urls read live by a
running worker.

DNS cannot be run for real here, so the rebinding tests replace only the resolver function
(the event loop's getaddrinfo, which the old check and aiohttp's resolver both called) with one
that answers as a rebinding name would; the connection, the sink and the database are real.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import time

import psycopg
import pytest

from console.sink import WebhookSink
from console.workers.dispatchers import address_guard
from console.workers.dispatchers.address_guard import InternalAddressRefused, checked_address, is_internal
from tests.brokers import Broker, require_broker, url_for
from tests.helpers import scalar
from tests.test_broker_dispatch import RunningPool, until
from tests.workers import run_pool_until, start_worker_process, wait_for

INTERNAL_URLS = [
    "http://127.0.0.1/hook", "http://127.8.9.10:8080/", "http://localhost:9000/", "http://api.localhost/",
    "http://LOCALHOST./", "http://[::1]/", "http://[::ffff:127.0.0.1]/", "http://[::ffff:7f00:1]/",
    "http://[::ffff:10.0.0.5]/", "http://[64:ff9b::a9fe:a9fe]/", "http://169.254.169.254/latest/meta-data/",
    "http://10.1.2.3/", "http://172.16.0.1/", "http://192.168.1.1/", "http://100.64.0.1/", "http://0.0.0.0/",
    "http://[::]/", "http://[fe80::1]/", "http://[fd12:3456::1]/", "http://[fc00::1]/", "http://224.0.0.1/",
    "http://2130706433/", "http://0x7f000001/", "http://0x7f.1/", "http://127.1/", "http://017700000001/",
    "https://user:pw@10.0.0.1:8443/x", "http://[fe80::1%25eth0]/",
]
PUBLIC_URLS = ["https://hooks.example.com/in", "http://93.184.216.34/", "https://[2606:4700:4700::1111]/",
               "http://8.8.8.8:8080/x", "https://1.1.1.1/"]


def create(conn, name: str, config: dict) -> None:
    conn.execute("SELECT courier.create_endpoint(%s, 'http', %s::jsonb)", (name, json.dumps(config)))


@pytest.mark.parametrize("url", INTERNAL_URLS)
def test_create_endpoint_refuses_an_internal_address(conn, url):
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="points at an internal address") as caught:
        create(conn, "hook", {"url": url})
    assert "allow_internal" in caught.value.diag.message_hint
    assert scalar(conn, "SELECT count(*) FROM courier.endpoints") == 0


@pytest.mark.parametrize("url", PUBLIC_URLS)
def test_create_endpoint_accepts_a_public_address(conn, url):
    create(conn, "hook", {"url": url})


def test_alter_endpoint_and_a_plain_update_refuse_it_too(conn):
    create(conn, "hook", {"url": "https://hooks.example.com/in"})
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="internal address"):
        conn.execute("SELECT courier.alter_endpoint('hook', '{\"url\": \"http://169.254.169.254/\"}')")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="internal address"):
        conn.execute("UPDATE courier.endpoints SET config = '{\"url\": \"http://10.0.0.1/\"}'")
    assert scalar(conn, "SELECT config->>'url' FROM courier.endpoints") == "https://hooks.example.com/in"


def test_allow_internal_or_the_setting_permits_it(conn):
    create(conn, "trusted", {"url": "http://10.0.0.1/", "allow_internal": True})
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        create(conn, "untrusted", {"url": "http://10.0.0.1/", "allow_internal": False})
    conn.execute("SELECT courier.set_setting('http_allow_internal_urls', 'true')")
    create(conn, "untrusted", {"url": "http://10.0.0.1/"})


@pytest.mark.parametrize("address", ["127.0.0.1", "10.0.0.1", "169.254.169.254", "100.64.0.1", "0.0.0.0", "::1",
                                     "::ffff:127.0.0.1", "::ffff:169.254.169.254", "64:ff9b::a00:1", "::7f00:1",
                                     "2002:7f00:1::", "fe80::1", "fd00::1", "fec0::1", "ff02::1", "224.0.0.1"])
def test_the_delivery_check_knows_internal_addresses(address):
    assert is_internal(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111", "::ffff:8.8.8.8"])
def test_the_delivery_check_lets_public_addresses_through(address):
    assert not is_internal(ipaddress.ip_address(address))


@pytest.fixture
def sink():
    with WebhookSink() as running:
        yield running


class RebindingDns:
    """getaddrinfo for `name` answering from a script, one answer per lookup; other names
    resolve as usual."""

    def __init__(self, monkeypatch, name: str, answers: list[list[str]]) -> None:
        self.name, self.answers, self.lookups = name, answers, 0
        real = asyncio.BaseEventLoop.getaddrinfo

        async def getaddrinfo(loop, host, port, *args, **kwargs):
            if host != name:
                return await real(loop, host, port, *args, **kwargs)
            answer = self.answers[min(self.lookups, len(self.answers) - 1)]
            self.lookups += 1
            return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                     (a, port, 0, 0) if ":" in a else (a, port)) for a in answer]

        monkeypatch.setattr(asyncio.BaseEventLoop, "getaddrinfo", getaddrinfo)


def deliver_once(dsn, conn, name: str) -> str | None:
    """Run a pool until the message has an outcome; its last error (None: delivered)."""
    message = scalar(conn, "SELECT courier.send(%s, '{}')", (name,))

    def attempted() -> bool:
        return scalar(conn, "SELECT count(*) FROM courier.queue WHERE id = %s AND status = 'processing' "
                            "OR id = %s AND last_error IS NULL", (message, message)) == 0
    run_pool_until(dsn, attempted, timeout=20)
    return scalar(conn, "SELECT coalesce((SELECT last_error FROM courier.queue WHERE id = %(id)s), "
                        "(SELECT last_error FROM courier.dlq WHERE original_message_id = %(id)s))", {"id": message})


def test_a_rebinding_name_cannot_reach_an_internal_address(dsn, conn, sink, monkeypatch):
    port = sink.url.rsplit(":", 1)[1]
    create(conn, "rebind", {"url": f"http://rebind.test:{port}/healthy", "timeout": 2, "connect_timeout": 1})
    # Public to the first lookup, the sink's loopback address to every later one.
    dns = RebindingDns(monkeypatch, "rebind.test", [["93.184.216.34"], ["127.0.0.1"]])
    error = deliver_once(dsn, conn, "rebind")
    assert sink.count() == 0  # the old check looked once, then the connection looked again and got 127.0.0.1
    assert dns.lookups == 1  # one resolution, checked and connected to
    assert error is not None and "internal" not in error  # it tried the public address, which is unreachable here


def test_a_name_with_any_internal_address_is_refused(dsn, conn, sink, monkeypatch):
    port = sink.url.rsplit(":", 1)[1]
    create(conn, "mixed", {"url": f"http://mixed.test:{port}/healthy"})
    RebindingDns(monkeypatch, "mixed.test", [["93.184.216.34", "127.0.0.1"]])
    error = deliver_once(dsn, conn, "mixed")
    assert sink.count() == 0
    assert error.startswith("[PERMANENT] internal address 127.0.0.1 blocked (mixed.test resolves to it)")


def test_turning_internal_urls_off_takes_effect_in_a_running_worker(dsn, conn, sink):
    conn.execute("SELECT courier.set_setting('http_allow_internal_urls', 'true')")
    create(conn, "local", {"url": f"{sink.url}/healthy"})
    worker = start_worker_process(dsn)
    try:
        conn.execute("SELECT courier.send('local', '{\"n\": 1}')")
        wait_for(lambda: sink.count() == 1, timeout=20)
        conn.execute("SELECT courier.set_setting('http_allow_internal_urls', 'false')")
        time.sleep(3)  # the pool re-reads settings at every endpoint refresh (2 s)
        second = scalar(conn, "SELECT courier.send('local', '{\"n\": 2}')")
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM courier.dlq WHERE original_message_id = %s",
                                (second,)) == 1, timeout=20)
    finally:
        worker.terminate()
        worker.wait(30)
    assert sink.count() == 1  # was delivered: the worker read the setting once, at start
    assert "internal address 127.0.0.1 blocked" in scalar(conn, "SELECT last_error FROM courier.dlq")


# Broker URLs (issue 23, item 13): the same policy and opt-in as HTTP ---------------------------

BROKER_DESTINATIONS = {"redis": {"stream": "s"}, "amqp": {"routing_key": "k"}, "mqtt": {"topic": "t"},
                       "nats": {"subject": "s"}}
INTERNAL_BROKER_URLS = [
    ("redis", "redis://169.254.169.254"), ("redis", "rediss://:pw@127.1:6380/0"), ("redis", "redis://localhost/0"),
    ("amqp", "amqp://10.0.0.1"), ("amqp", "amqps://u:p@[::ffff:10.0.0.1]:5671/vhost"),
    ("amqp", "amqp://guest:guest@2130706433:5672/"),
    ("mqtt", "mqtt://0x7f.1"), ("mqtt", "mqtts://broker.localhost:8883"), ("mqtt", "mqtt://[fd00::1]:1883"),
    ("nats", "nats://[::ffff:127.0.0.1]"), ("nats", "tls://u:p@017700000001:4222"), ("nats", "nats://0.0.0.0"),
    ("nats", "nats://[64:ff9b::a9fe:a9fe]:4222"), ("redis", "redis://192.168.1.1:6379"),
]
PUBLIC_BROKER_URLS = [("redis", "redis://cache.example.com:6379/0"), ("amqp", "amqps://u:p@8.8.8.8/"),
                      ("mqtt", "mqtt://[2606:4700:4700::1111]:1883"), ("nats", "tls://nats.example.com:4222")]


def create_broker(conn, name: str, protocol: str, url: str, **extra) -> None:
    config = {"url": url, **BROKER_DESTINATIONS[protocol], **extra}
    conn.execute("SELECT courier.create_endpoint(%s, %s, %s::jsonb)", (name, protocol, json.dumps(config)))


@pytest.mark.parametrize(("protocol", "url"), INTERNAL_BROKER_URLS)
def test_create_endpoint_refuses_a_broker_on_an_internal_address(conn, protocol, url):
    with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
        create_broker(conn, "broker", protocol, url)
    assert f"{protocol} config.url points at an internal address" in caught.value.diag.message_primary
    assert "allow_internal" in caught.value.diag.message_hint
    assert scalar(conn, "SELECT count(*) FROM courier.endpoints") == 0


@pytest.mark.parametrize(("protocol", "url"), PUBLIC_BROKER_URLS)
def test_create_endpoint_accepts_a_broker_on_a_public_address(conn, protocol, url):
    create_broker(conn, "broker", protocol, url)


@pytest.mark.parametrize("protocol", sorted(BROKER_DESTINATIONS))
def test_allow_internal_or_the_setting_permits_an_internal_broker(conn, protocol):
    create_broker(conn, "trusted", protocol, f"{protocol}://10.0.0.1", allow_internal=True)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="allow_internal must be true or false"):
        create_broker(conn, "typo", protocol, f"{protocol}://10.0.0.1", allow_internal="yes")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="internal address"):
        create_broker(conn, "untrusted", protocol, f"{protocol}://10.0.0.1", allow_internal=False)
    conn.execute("SELECT courier.set_setting('http_allow_internal_urls', 'true')")
    create_broker(conn, "untrusted", protocol, f"{protocol}://10.0.0.1")


def test_alter_endpoint_and_a_plain_update_refuse_an_internal_broker(conn):
    create_broker(conn, "events", "nats", "nats://nats.example.com:4222")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=r"nats config\.url points at an internal address"):
        conn.execute("SELECT courier.alter_endpoint('events', %s::jsonb)",
                     (json.dumps({"url": "nats://[::ffff:127.0.0.1]", "subject": "s"}),))
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="internal address"):
        conn.execute("UPDATE courier.endpoints SET config = config || '{\"url\": \"nats://127.0.0.1\"}'")
    assert scalar(conn, "SELECT config->>'url' FROM courier.endpoints") == "nats://nats.example.com:4222"


# ... and at delivery, on the addresses a broker's host resolves to -------------------------------

BROKER_PROTOCOLS = sorted(BROKER_DESTINATIONS)


@pytest.mark.parametrize(("host", "address"), [
    ("127.1", "127.0.0.1"), ("0x7f.1", "127.0.0.1"), ("2130706433", "127.0.0.1"), ("017700000001", "127.0.0.1"),
    ("0251.0376.0251.0376", "169.254.169.254"), ("::ffff:127.0.0.1", "::ffff:127.0.0.1"), ("localhost", "localhost"),
    ("broker.localhost", "localhost"), ("10.1", "10.0.0.1"),
])
def test_the_broker_check_reads_odd_spellings_as_the_address_they_mean(host, address):
    with pytest.raises(InternalAddressRefused) as caught:
        asyncio.run(checked_address(host))
    assert caught.value.address == address


def _through_name(protocol: str, broker: Broker, **extra) -> dict:
    """The broker's config with its URL naming the host broker.test instead of 127.0.0.1."""
    return broker.config(url=url_for(protocol).replace("127.0.0.1", "broker.test"), **extra)


def _deliver(dsn, conn, broker: Broker, count: int, done: str) -> list:
    async def scenario() -> list:
        await broker.setup()
        try:
            async with RunningPool(dsn):
                await until(lambda: scalar(conn, done) == count, 30, done)
            return await broker.read()
        finally:
            await broker.cleanup()

    return asyncio.run(scenario())


@pytest.mark.parametrize("protocol", BROKER_PROTOCOLS)
def test_a_broker_host_resolving_to_an_internal_address_is_refused_at_delivery(dsn, conn, monkeypatch, protocol):
    require_broker(protocol)
    broker = Broker.of(protocol)
    conn.execute("SELECT courier.create_endpoint('b', %s, %s::jsonb)",
                 (protocol, json.dumps(_through_name(protocol, broker, allow_internal=False))))
    RebindingDns(monkeypatch, "broker.test", [["93.184.216.34", "127.0.0.1"]])
    conn.execute("SELECT courier.send('b', '{\"n\": 1}')")
    received = _deliver(dsn, conn, broker, 1, "SELECT count(*) FROM courier.dlq")
    assert received == []
    assert scalar(conn, "SELECT last_error FROM courier.dlq").startswith(
        "[PERMANENT] internal address 127.0.0.1 blocked (broker.test resolves to it)")


@pytest.mark.parametrize("protocol", BROKER_PROTOCOLS)
def test_a_broker_connection_goes_to_the_address_that_was_checked(dsn, conn, monkeypatch, protocol):
    """The broker on loopback stands in for a public one (the check is told 127.0.0.1 is
    external); its name answers 127.0.0.1 to the first lookup and an unroutable address to any
    later one, so only a connection pinned to the checked address can deliver."""
    require_broker(protocol)
    broker = Broker.of(protocol)
    conn.execute("SELECT courier.create_endpoint('b', %s, %s::jsonb)",
                 (protocol, json.dumps(_through_name(protocol, broker, allow_internal=False, timeout=3))))
    real_is_internal = address_guard.is_internal
    monkeypatch.setattr(address_guard, "is_internal",
                        lambda address: str(address) != "127.0.0.1" and real_is_internal(address))
    dns = RebindingDns(monkeypatch, "broker.test", [["127.0.0.1"], ["10.255.255.1"]])
    for n in range(3):
        conn.execute("SELECT courier.send('b', %s::jsonb)", (json.dumps({"n": n}),))
    received = _deliver(dsn, conn, broker, 3, "SELECT count(*) FROM courier.archive WHERE status = 'completed'")
    assert sorted(r.payload["n"] for r in received) == [0, 1, 2]
    assert dns.lookups == 1


@pytest.mark.parametrize("protocol", BROKER_PROTOCOLS)
def test_turning_internal_urls_off_drops_a_running_broker_connection(dsn, conn, protocol):
    """Allowed by the setting when made, the endpoint's URL spells loopback as 127.1; once the
    setting is off, the next batch reconnects through the check and is refused."""
    require_broker(protocol)
    conn.execute("SELECT courier.set_setting('http_allow_internal_urls', 'true')")
    broker = Broker.of(protocol)
    config = broker.config(url=url_for(protocol).replace("127.0.0.1", "127.1"))
    del config["allow_internal"]
    conn.execute("SELECT courier.create_endpoint('b', %s, %s::jsonb)", (protocol, json.dumps(config)))
    seen = {}

    async def scenario() -> list:
        await broker.setup()
        try:
            async with RunningPool(dsn, refresh_interval=0.2):
                conn.execute("SELECT courier.send('b', '{\"n\": 1}')")
                await until(lambda: scalar(conn, "SELECT count(*) FROM courier.archive") == 1, 30, "first delivered")
                conn.execute("SELECT courier.set_setting('http_allow_internal_urls', 'false')")
                await asyncio.sleep(1)  # the pool's next endpoint refresh
                conn.execute("SELECT courier.send('b', '{\"n\": 2}')")
                await until(lambda: scalar(conn, "SELECT count(*) FROM courier.dlq") == 1, 30, "second refused")
            seen["error"] = scalar(conn, "SELECT last_error FROM courier.dlq")
            return await broker.read()
        finally:
            await broker.cleanup()

    received = asyncio.run(scenario())
    assert [r.payload for r in received] == [{"n": 1}]
    assert seen["error"].startswith("[PERMANENT] internal address 127.0.0.1 blocked (127.1 resolves to it)")
