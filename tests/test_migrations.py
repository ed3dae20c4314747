"""Migrations: ordered, checksummed, idempotent, concurrent-safe, and equal to a fresh install."""

from __future__ import annotations

import re
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


def _assert_equals_a_fresh_install(server_dsn: str, upgraded_dsn: str) -> None:
    fresh_name = "courier_fresh_" + uuid.uuid4().hex[:10]
    fresh_dsn = create_database(server_dsn, fresh_name)
    try:
        migrate.migrate(fresh_dsn)
        assert schema_dump(upgraded_dsn) == schema_dump(fresh_dsn)
    finally:
        drop_database(server_dsn, fresh_name)


def _with_data_in_flight(dsn: str, version: int) -> None:
    """What a release at `version` had in its tables when the upgrade ran."""
    if version < 4:
        return
    with psycopg.connect(dsn, autocommit=True) as conn:
        name = f"legacy{version}"
        conn.execute("SELECT courier.create_endpoint(%s, 'noop', '{}')", (name,))
        conn.execute("SELECT courier.send(%s, '{\"old\": true}')", (name,))


@pytest.mark.parametrize("stop_at", [1, 3, 5])
def test_upgraded_database_equals_a_fresh_install(server_dsn, empty_dsn, stop_at):
    migrate.migrate(empty_dsn, target=stop_at)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert migrate.status(conn).installed_version == stop_at
    _with_data_in_flight(empty_dsn, stop_at)
    migrate.migrate(empty_dsn)
    _assert_equals_a_fresh_install(server_dsn, empty_dsn)


def test_every_release_upgraded_step_by_step_equals_a_fresh_install(server_dsn, empty_dsn):
    """From the first release, one version at a time, each with messages in flight."""
    for migration in migrate.available():
        assert [m.version for m in migrate.migrate(empty_dsn, target=migration.version)] == [migration.version]
        _with_data_in_flight(empty_dsn, migration.version)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert migrate.status(conn).up_to_date
        assert scalar(conn, "SELECT count(*) FROM courier.queue") >= 5  # nothing in flight was lost
    _assert_equals_a_fresh_install(server_dsn, empty_dsn)


def test_a_database_of_a_release_before_function_files_upgrades(server_dsn, empty_dsn):
    """Releases up to 0012 defined their functions in the migrations, with no schema_functions."""
    last_of_that_release = 12
    migrate.migrate(empty_dsn, target=last_of_that_release)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE courier.schema_functions")
        for statement in (m.sql for m in migrate.available() if m.version <= last_of_that_release):
            assert "schema_functions" not in statement
    _with_data_in_flight(empty_dsn, last_of_that_release)
    migrate.migrate(empty_dsn)
    _assert_equals_a_fresh_install(server_dsn, empty_dsn)


# The pull API takes one id or arrays (SPEC.md), as two signatures of one name each.
OVERLOADED = {"ack": 2, "nack": 2}


def _declared_functions() -> set[str]:
    declared: list[str] = []
    for file in migrate.function_files():
        declared += re.findall(r"CREATE OR REPLACE FUNCTION courier\.(\w+)\s*\(", file.sql)
    for name in set(declared):
        assert declared.count(name) == OVERLOADED.get(name, 1), f"{name} is defined twice in sqlkit/functions"
    return set(declared)


def test_every_function_is_defined_once_in_the_function_files(conn):
    installed = [row[0] for row in conn.execute(
        "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = 'courier'")]
    for name in set(installed):
        assert installed.count(name) == OVERLOADED.get(name, 1), f"an overloaded courier function: {name}"
    assert set(installed) == _declared_functions()


def test_a_changed_function_file_is_applied_again_and_alone(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE courier.schema_functions SET checksum = 'old' WHERE area = 'sending'")
        conn.execute("CREATE OR REPLACE FUNCTION courier.enable_fast_mode() RETURNS void LANGUAGE sql AS 'SELECT'")
        before = dict(conn.execute("SELECT area, applied_at FROM courier.schema_functions"))
        state = migrate.status(conn)
        assert not state.up_to_date and not state.pending
        assert [f.area for f in state.functions_pending] == ["sending", "roles"]
    assert migrate.migrate(dsn) == []
    with psycopg.connect(dsn, autocommit=True) as conn:
        after = dict(conn.execute("SELECT area, applied_at FROM courier.schema_functions"))
        assert {area for area in after if after[area] != before[area]} == {"sending", "roles"}
        assert "synchronous_commit" in scalar(conn, "SELECT prosrc FROM pg_proc WHERE proname = 'enable_fast_mode'")
        assert migrate.status(conn).up_to_date


def test_a_failed_function_file_leaves_the_database_as_it_was(dsn, monkeypatch):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE courier.schema_functions SET checksum = 'old' WHERE area = 'sending'")
    broken = [migrate.FunctionFile(f.area, f.sql + ("\nSELECT 1/0;" if f.area == "archive" else ""))
              for f in migrate.function_files()]
    monkeypatch.setattr(migrate, "function_files", lambda: broken)
    with pytest.raises(Exception, match="division by zero"):
        migrate.migrate(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert scalar(conn, "SELECT checksum FROM courier.schema_functions WHERE area = 'sending'") == "old"


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
