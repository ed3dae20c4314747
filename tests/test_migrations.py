"""Migrations: ordered, checksummed, idempotent, concurrent-safe, and equal to a fresh install."""

from __future__ import annotations

import subprocess
import threading
import uuid

import psycopg
import pytest

from sqlkit import embedded, migrate
from sqlkit.errors import MigrationError
from tests.conftest import create_database, drop_database
from tests.helpers import scalar


def schema_dump(dsn: str) -> str:
    """pg_dump of schema courier, minus the migration bookkeeping rows."""
    done = subprocess.run(
        [str(embedded.client_binary("pg_dump")), "--schema-only", "--schema=courier", "--no-owner", dsn],
        capture_output=True, text=True, check=True)
    # pg_dump 18 against an older server prints per-database attribute versions (pg_attver).
    return "\n".join(line for line in done.stdout.splitlines()
                     if not line.startswith(("--", "\\restrict", "\\unrestrict", "SET ", "SELECT pg_catalog"))
                     and "pg_attver=" not in line)


def test_migrate_twice_is_a_no_op(empty_dsn):
    first = migrate.migrate(empty_dsn)
    assert [m.version for m in first] == [m.version for m in migrate.available()]
    assert migrate.migrate(empty_dsn) == []
    with psycopg.connect(empty_dsn) as conn:
        assert migrate.status(conn).up_to_date


def test_concurrent_migrations_apply_each_step_once(empty_dsn):
    barrier = threading.Barrier(4)
    applied: list[list[int]] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            barrier.wait()
            applied.append([m.version for m in migrate.migrate(empty_dsn)])
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(applied, key=len) == [[], [], [], [m.version for m in migrate.available()]]
    with psycopg.connect(empty_dsn) as conn:
        assert scalar(conn, "SELECT count(*) FROM courier.schema_migrations") == len(migrate.available())


@pytest.mark.parametrize("stop_at", [1, 3, 5])
def test_upgraded_database_equals_a_fresh_install(server_dsn, empty_dsn, stop_at):
    migrate.migrate(empty_dsn, target=stop_at)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert migrate.status(conn).installed_version == stop_at
        if stop_at >= 4:  # an older release had data in flight when the upgrade ran
            conn.execute("SELECT courier.create_endpoint('legacy', 'noop', '{}')")
            conn.execute("SELECT courier.send('legacy', '{\"old\": true}')")
    migrate.migrate(empty_dsn)

    fresh_name = "courier_fresh_" + uuid.uuid4().hex[:10]
    fresh_dsn = create_database(server_dsn, fresh_name)
    try:
        migrate.migrate(fresh_dsn)
        assert schema_dump(empty_dsn) == schema_dump(fresh_dsn)
    finally:
        drop_database(server_dsn, fresh_name)


def test_a_changed_migration_is_refused(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE courier.schema_migrations SET checksum = 'edited' WHERE version = 2")
    with pytest.raises(MigrationError, match="0002_internals has changed since it was applied"):
        migrate.migrate(dsn)


def test_a_newer_database_is_refused(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO courier.schema_migrations (version, name, checksum) VALUES (9999, 'future', 'x')")
    with pytest.raises(MigrationError, match="newer than this Courier knows"):
        migrate.migrate(dsn)


def test_migration_files_are_numbered_without_gaps():
    versions = [m.version for m in migrate.available()]
    assert versions == list(range(1, len(versions) + 1))
