"""SSRF protection (issue 10, item 15): internal literals refused at create_endpoint and
alter_endpoint, names checked on every address they resolve to, the connection pinned to the
checked address, and http_allow_internal_urls read live by a running worker.

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
from console.workers.dispatchers.address_guard import is_internal
from tests.helpers import scalar
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
