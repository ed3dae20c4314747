"""`courier doctor`'s checks: is everything Courier needs here, and what to do where it is not.

Each check answers one question with a status, what it saw and, unless it is ok, the fix.
Nothing here changes anything; a check that cannot run says why and is skipped.
"""

from __future__ import annotations

import platform
import re
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from urllib.parse import urlsplit

import psycopg

from sqlkit import embedded, migrate, observability
from sqlkit.connection import connect
from sqlkit.dsn import resolve_dsn
from sqlkit.errors import CourierError, from_psycopg

from . import extras

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
TESTED_SERVER_MAJORS = (15, 18)
ROLES = ("courier_owner", "courier_admin", "courier_application", "courier_monitor")
BROKER_DEFAULT_PORTS = {"redis": 6379, "rediss": 6379, "amqp": 5672, "amqps": 5671, "mqtt": 1883,
                        "mqtts": 8883, "nats": 4222, "tls": 4222}
CONNECT_TIMEOUT = 3.0


@dataclass(frozen=True)
class Check:
    area: str
    name: str
    status: str
    detail: str
    fix: str | None = None


def run_all(explicit_dsn: str | None) -> list[Check]:
    checks = [_courier_version()]
    checks.extend(_database(explicit_dsn))
    checks.extend(_spark())
    return checks


def _courier_version() -> Check:
    return Check("courier", "version", OK, f"courier {metadata.version('courier')} on Python "
                 f"{platform.python_version()} ({platform.system()} {platform.machine()})")


# The database ---------------------------------------------------------------------------

def _database(explicit_dsn: str | None) -> Iterator[Check]:
    choice = resolve_dsn(explicit_dsn)
    if choice.is_embedded:
        url = embedded.url()
        if url is None:
            yield Check("database", "reachable", FAIL,
                        f"no database configured, and the embedded PostgreSQL ({embedded.data_dir()}) is not running",
                        "Run `courier db start` (or `courier demo`), or point --dsn / COURIER_DSN at a server")
            return
        source = "the embedded PostgreSQL"
    else:
        url = choice.dsn or ""
        source = f"the server from {choice.source}"
    try:
        conn = connect(url, connect_timeout=CONNECT_TIMEOUT)
    except CourierError as error:
        yield Check("database", "reachable", FAIL, f"{source}: {error.message}",
                    error.hint or "Check the connection string and that the server is running")
        return
    except psycopg.Error as error:
        translated = from_psycopg(error)
        yield Check("database", "reachable", FAIL, f"{source}: {translated.message}",
                    translated.hint or "Check the connection string and that the server is running")
        return
    with conn:
        info = conn.info
        yield Check("database", "reachable", OK,
                    f"{source}: {info.host or 'socket'}:{info.port}/{info.dbname} as {info.user}")
        yield _server_version(conn)
        schema = _schema(conn)
        yield schema
        if schema.status == FAIL and "not installed" in schema.detail:
            return
        yield from _roles(conn)
        yield _workers(conn)
        yield from _brokers(conn)


def _server_version(conn: psycopg.Connection) -> Check:
    number = conn.info.server_version
    major, text = number // 10000, f"{number // 10000}.{number % 10000}"
    if major < min(TESTED_SERVER_MAJORS):
        return Check("database", "server version", WARN, f"PostgreSQL {text}: older than any version Courier is "
                     f"tested on ({' and '.join(map(str, TESTED_SERVER_MAJORS))})", "Use PostgreSQL 15 or newer")
    return Check("database", "server version", OK, f"PostgreSQL {text}")


def _schema(conn: psycopg.Connection) -> Check:
    try:
        state = migrate.status(conn)
    except (psycopg.Error, CourierError) as error:
        found = from_psycopg(error) if isinstance(error, psycopg.Error) else error
        if found.sqlstate == "42501":  # an application or monitoring role may not read the history
            return Check("database", "schema", SKIP, f"this role cannot read the migration history ({found.message})",
                         "Run `courier doctor` as an admin role to check the schema")
        return Check("database", "schema", FAIL, found.message, "Run `courier migrate`")
    if state.installed_version == 0:
        return Check("database", "schema", FAIL, "schema courier is not installed", "Run `courier migrate`")
    if state.pending or state.functions_pending or state.adopts_history:
        waiting = [m.label for m in state.pending] + [f.label for f in state.functions_pending]
        return Check("database", "schema", FAIL,
                     f"at version {state.installed_version} of {state.latest_version}; pending: "
                     + (", ".join(waiting) or "recording the squashed history as the baseline"),
                     "Run `courier migrate`")
    return Check("database", "schema", OK, f"migrations current (version {state.latest_version})")


def _roles(conn: psycopg.Connection) -> Iterator[Check]:
    present = {row[0] for row in conn.execute("SELECT rolname FROM pg_roles WHERE rolname = ANY(%s)",
                                              [list(ROLES)])}
    missing = [role for role in ROLES if role not in present]
    if missing:
        yield Check("database", "roles", FAIL, f"missing: {', '.join(missing)}", "Run `courier migrate`")
        return
    yield Check("database", "roles", OK, ", ".join(ROLES))
    user, superuser = conn.execute(
        "SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user").fetchone() or ("?", False)
    granted = [role for (role,) in conn.execute(
        "SELECT r FROM unnest(%s::text[]) AS r WHERE pg_has_role(current_user, r, 'MEMBER')", [list(ROLES)])]
    if superuser:
        yield Check("database", "connected role", WARN, f"{user} is a superuser",
                    "Fine for setting up; run producers, consumers and workers as roles granted "
                    "courier_application or courier_admin (README, Roles)")
    elif not granted:
        yield Check("database", "connected role", FAIL, f"{user} is granted none of Courier's roles",
                    "GRANT courier_admin (or courier_application, courier_monitor) TO " + user)
    else:
        yield Check("database", "connected role", OK, f"{user}, granted {', '.join(granted)}")


def _workers(conn: psycopg.Connection) -> Check:
    try:
        alive, push_endpoints = conn.execute("""
            SELECT count(*) FILTER (WHERE alive),
                   (SELECT count(*) FROM courier.endpoints WHERE enabled AND protocol <> 'pull')
            FROM courier.get_worker_status()""").fetchone() or (0, 0)
    except psycopg.Error as error:
        return Check("workers", "running", SKIP, f"cannot read worker heartbeats: {from_psycopg(error).message}")
    if alive:
        return Check("workers", "running", OK, f"{alive} alive")
    if push_endpoints:
        return Check("workers", "running", WARN,
                     f"no worker alive, and {push_endpoints} enabled endpoint(s) wait for one",
                     "Start one with `courier worker` (or `courier serve --workers N`)")
    return Check("workers", "running", OK, "none alive; no endpoint needs one yet")


def _brokers(conn: psycopg.Connection) -> Iterator[Check]:
    """Per broker protocol in use: the client extra, and a TCP connection to each address."""
    brokers = list(extras.PROTOCOL_EXTRAS)
    try:
        rows = conn.execute("""
            SELECT protocol, name, config ->> 'url' FROM courier.endpoints
            WHERE protocol = ANY(%s) ORDER BY protocol, name""", [brokers]).fetchall()
    except psycopg.Error:
        # A monitoring role sees the endpoints but not their configs (credentials live there).
        try:
            rows = conn.execute("""SELECT protocol, name, NULL FROM courier.endpoints
                                   WHERE protocol = ANY(%s) ORDER BY protocol, name""", [brokers]).fetchall()
        except psycopg.Error as error:
            yield Check("brokers", "endpoints", SKIP, f"cannot read endpoints: {from_psycopg(error).message}",
                        "Run `courier doctor` as an admin role to check the brokers")
            return
        if rows:
            yield Check("brokers", "addresses", SKIP, "this role cannot read the endpoints' URLs",
                        "Run `courier doctor` as an admin role to check that each broker is reachable")
    by_protocol: dict[str, list[tuple[str, str | None]]] = {}
    for protocol, name, url in rows:
        by_protocol.setdefault(protocol, []).append((name, url))
    if not by_protocol:
        yield Check("brokers", "endpoints", OK, "no broker endpoints")
        return
    try:
        able, known = observability.worker_protocols(conn)
    except psycopg.Error:
        able, known = {}, 0
    for protocol, endpoints in by_protocol.items():
        extra = extras.EXTRAS[extras.PROTOCOL_EXTRAS[protocol]]
        names = ", ".join(name for name, _ in endpoints)
        if not extra.installed():
            yield Check("brokers", f"{protocol} client", FAIL,
                        f"{', '.join(extra.missing_modules())} not installed; used by {names}", extra.install)
        else:
            yield Check("brokers", f"{protocol} client", OK, f"installed; used by {names}")
        if known:  # what the running workers' installs can deliver (each may run elsewhere)
            if able.get(protocol):
                yield Check("brokers", f"{protocol} workers", OK, f"{able[protocol]} of {known} running worker(s) "
                            "can deliver it")
            else:
                yield Check("brokers", f"{protocol} workers", FAIL,
                            f"none of the {known} running worker(s) can deliver it; its messages wait",
                            f"{extra.install} where the workers run; restart them")
        for address, users in _addresses(endpoints).items():
            yield _reachable(protocol, address, users)


def _addresses(endpoints: list[tuple[str, str | None]]) -> dict[tuple[str, int], list[str]]:
    """host:port of each endpoint's URL (never the credentials in it), with the endpoints using it."""
    found: dict[tuple[str, int], list[str]] = {}
    for name, url in endpoints:
        try:
            parts = urlsplit(url or "")
            host, port = parts.hostname, parts.port or BROKER_DEFAULT_PORTS.get(parts.scheme)
        except ValueError:
            continue
        if host and port:
            found.setdefault((host, port), []).append(name)
    return found


def _reachable(protocol: str, address: tuple[str, int], users: list[str]) -> Check:
    host, port = address
    where = f"{host}:{port}"
    try:
        with socket.create_connection(address, timeout=CONNECT_TIMEOUT):
            pass
    except OSError as error:
        reason = error.strerror or type(error).__name__
        return Check("brokers", f"{protocol} {where}", FAIL, f"not reachable ({reason}); used by {', '.join(users)}",
                     "Start the broker, or fix the endpoints' url (`courier endpoint alter NAME --config ...`)")
    return Check("brokers", f"{protocol} {where}", OK, f"accepts connections; used by {', '.join(users)}")


# Spark ----------------------------------------------------------------------------------

_JAVA_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?[^"]*"')
SPARK_JAVA_MAJORS = (17, 21)


def _spark() -> Iterator[Check]:
    extra = extras.EXTRAS["spark"]
    if not extra.installed():
        yield Check("pipeline", "spark", SKIP, "the spark extra is not installed (only `courier pipeline` needs it)",
                    extra.install)
        return
    yield Check("pipeline", "spark", OK, f"pyspark {metadata.version('pyspark')}")
    from .pipeline.session import JAVA_HINT, java_executable

    java = java_executable()
    if java is None:
        yield Check("pipeline", "java", FAIL, "no Java runtime found (JAVA_HOME or PATH)", JAVA_HINT)
        return
    try:
        shown = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as error:
        yield Check("pipeline", "java", FAIL, f"{java} did not run: {error}", JAVA_HINT)
        return
    match = _JAVA_VERSION.search(shown.stderr + shown.stdout)
    if match is None:
        yield Check("pipeline", "java", WARN, f"{java}: could not read its version", JAVA_HINT)
        return
    major = int(match.group(1)) if match.group(1) != "1" else int(match.group(2) or 0)
    if major not in SPARK_JAVA_MAJORS:
        yield Check("pipeline", "java", WARN if major > max(SPARK_JAVA_MAJORS) else FAIL,
                    f"Java {major} at {java}; Spark 4 runs on Java 17 or 21", JAVA_HINT)
        return
    yield Check("pipeline", "java", OK, f"Java {major} at {java}")
