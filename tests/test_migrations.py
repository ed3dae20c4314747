"""Migrations: ordered, checksummed, idempotent, concurrent-safe, and equal to a fresh install."""

from __future__ import annotations

import re
import subprocess
import tarfile
import threading
import uuid
from pathlib import Path

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


def seeded_rows(dsn: str) -> dict[str, list[tuple]]:
    """The rows Courier starts with, as a fresh install writes them."""
    with psycopg.connect(dsn) as conn:
        return {
            "settings": conn.execute("SELECT name, value, default_value, value_type, min_value, max_value, unit,"
                                     " description FROM courier.settings ORDER BY name").fetchall(),
            "send_limits": conn.execute("SELECT * FROM courier.send_limits").fetchall(),
            "internal_locks": conn.execute("SELECT name FROM courier.internal_locks ORDER BY name").fetchall(),
            "maintenance_lease": conn.execute("SELECT singleton, worker_id, expires_at::text"
                                              " FROM courier.maintenance_lease").fetchall(),
            "database_identity": conn.execute("SELECT count(*) FROM courier.database_identity").fetchall(),
        }


def _assert_equals_a_fresh_install(server_dsn: str, upgraded_dsn: str) -> None:
    fresh_name = "courier_fresh_" + uuid.uuid4().hex[:10]
    fresh_dsn = create_database(server_dsn, fresh_name)
    try:
        migrate.migrate(fresh_dsn)
        assert schema_dump(upgraded_dsn) == schema_dump(fresh_dsn)
        assert seeded_rows(upgraded_dsn) == seeded_rows(fresh_dsn)
    finally:
        drop_database(server_dsn, fresh_name)


def _with_data_in_flight(dsn: str, name: str) -> None:
    """What a database had in its tables when the upgrade ran: a push endpoint with messages
    pending and dead-lettered, a pull topic with a message leased."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT courier.create_endpoint(%s, 'noop', '{}')", (name,))
        conn.execute("SELECT courier.send(%s, '{\"old\": true}')", (name,))
        conn.execute("SELECT courier.send_with_options(%s, '{}', p_priority := 7, p_ordering_key := 'k')", (name,))
        conn.execute("SELECT courier.create_endpoint(%s, 'pull', '{}')", (name + "-topic",))
        conn.execute("SELECT courier.enqueue(%s, '{\"pulled\": true}')", (name + "-topic",))
        conn.execute("SELECT * FROM courier.dequeue(%s, 1)", (name + "-topic",))


def _messages(dsn: str) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT id, endpoint_id, status, priority, lease, payload FROM courier.queue"
                            " ORDER BY id").fetchall()


def _with_rows_in_flight(dsn: str, name: str) -> None:
    """An endpoint and a pending message, written to the tables themselves: a schema stopped
    short of the latest version has no functions (they are written for the latest tables)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("WITH e AS (INSERT INTO courier.endpoints (name, protocol) VALUES (%s, 'noop') RETURNING id)"
                     " INSERT INTO courier.queue (endpoint_id, payload) SELECT id, '{\"old\": true}' FROM e",
                     (name,))


def test_every_migration_upgraded_step_by_step_equals_a_fresh_install(server_dsn, empty_dsn):
    """From the baseline, one version at a time, each with messages in flight."""
    for migration in migrate.available():
        assert [m.version for m in migrate.migrate(empty_dsn, target=migration.version)] == [migration.version]
        _with_rows_in_flight(empty_dsn, f"at{migration.version}")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert migrate.status(conn).up_to_date
    assert len(_messages(empty_dsn)) == len(migrate.available())  # nothing in flight was lost
    _with_data_in_flight(empty_dsn, "latest")  # and the functions of the latest version work on them
    _assert_equals_a_fresh_install(server_dsn, empty_dsn)


# Migrations 0001-0032 and the function files as they stood when the baseline replaced them
# (commit c427f3d), kept as one archive: the history a database made before the squash holds.
PRE_BASELINE = Path(__file__).parent / "fixtures" / "pre_baseline_schema.tar.gz"


def _pre_baseline_files() -> tuple[list[migrate.Migration], list[migrate.FunctionFile]]:
    with tarfile.open(PRE_BASELINE) as archive:
        files = {member.name: archive.extractfile(member).read().decode()
                 for member in archive.getmembers() if member.isfile()}
    migrations = []
    for path, sql in files.items():
        if match := re.fullmatch(r"pre_baseline/migrations/(\d{4})_(\w+)\.sql", path):
            migrations.append(migrate.Migration(int(match[1]), match[2], sql))
    migrations.sort(key=lambda m: m.version)
    # In today's order; areas added since the squash were not there.
    functions = [migrate.FunctionFile(area, files[f"pre_baseline/functions/{area}.sql"])
                 for area in migrate.FUNCTION_AREAS if f"pre_baseline/functions/{area}.sql" in files]
    return migrations, functions


def migrate_before_the_squash(dsn: str, through: int | None = None) -> None:
    """What `courier migrate` did before the squash: each migration of the history in order,
    recorded with its checksum, then (once the history is complete) every function file."""
    migrations, functions = _pre_baseline_files()
    with psycopg.connect(dsn) as conn, conn.transaction():
        migrate._bootstrap(conn)
        for migration in migrations:
            if through is not None and migration.version > through:
                break
            conn.execute(migration.sql.encode())
            conn.execute("INSERT INTO courier.schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                         (migration.version, migration.name, migration.checksum))
        if through is None:
            migrate._apply_functions(conn, functions)


def test_the_squashed_history_is_the_one_recognised():
    migrations, _ = _pre_baseline_files()
    assert [m.version for m in migrations] == list(range(1, migrate.BASELINE_VERSION + 1))
    assert migrate._history_digest({m.version: m.checksum for m in migrations}) == migrate.SQUASHED_HISTORY_DIGEST


def test_a_database_migrated_before_the_squash_is_recorded_as_the_baseline(server_dsn, empty_dsn):
    migrate_before_the_squash(empty_dsn)
    _with_data_in_flight(empty_dsn, "before-squash")
    messages = _messages(empty_dsn)
    with psycopg.connect(empty_dsn) as conn:
        identity = scalar(conn, "SELECT id FROM courier.database_identity")
        state = migrate.status(conn)
    assert state.adopts_history and not state.up_to_date
    assert state.pending == migrate.available()[1:]  # the migrations since the squash
    assert state.installed_version == migrate.BASELINE_VERSION

    baseline, *after = migrate.available()
    assert migrate.migrate(empty_dsn) == after  # the baseline is not applied: its schema is there already
    with psycopg.connect(empty_dsn) as conn:
        assert conn.execute("SELECT version, name, checksum FROM courier.schema_migrations ORDER BY version"
                            ).fetchall() == [(m.version, m.name, m.checksum) for m in (baseline, *after)]
        assert migrate.status(conn).up_to_date
        assert scalar(conn, "SELECT id FROM courier.database_identity") == identity
    assert _messages(empty_dsn) == messages
    _assert_equals_a_fresh_install(server_dsn, empty_dsn)


@pytest.mark.parametrize("through", [12, 31])
def test_a_partial_history_from_before_the_baseline_is_refused(empty_dsn, through):
    migrate_before_the_squash(empty_dsn, through=through)
    with pytest.raises(MigrationError, match=f"schema version {through:04d} of a development build") as error:
        migrate.migrate(empty_dsn)
    assert "c427f3d" in error.value.hint
    with psycopg.connect(empty_dsn) as conn:
        assert scalar(conn, "SELECT max(version) FROM courier.schema_migrations") == through
        assert scalar(conn, "SELECT count(*) FROM courier.schema_migrations") == through


def test_an_edited_history_from_before_the_baseline_is_refused(empty_dsn):
    migrate_before_the_squash(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("UPDATE courier.schema_migrations SET checksum = 'edited' WHERE version = 7")
    with pytest.raises(MigrationError, match="from before the baseline"):
        migrate.migrate(empty_dsn)


def test_the_migrations_define_no_functions():
    """A function is defined once, in its file under sqlkit/functions; a migration holds tables,
    indexes and data, so that a function changes in one place."""
    for migration in migrate.available():
        defines = re.search(r"CREATE\s+(OR\s+REPLACE\s+)?(FUNCTION|PROCEDURE|TRIGGER)", migration.sql, re.I)
        assert defines is None, migration.label


# The pull API takes one id or arrays (SPEC.md), as two signatures of one name each.
OVERLOADED = {"ack": 2, "nack": 2, "snooze": 2}


def _declared_functions() -> set[str]:
    declared: list[str] = []
    for file in migrate.function_files():
        declared += re.findall(r"CREATE OR REPLACE (?:FUNCTION|PROCEDURE) courier\.(\w+)\s*\(", file.sql)
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
        conn.execute("UPDATE courier.schema_migrations SET checksum = 'edited' WHERE version = 32")
    with pytest.raises(MigrationError, match="0032_baseline has changed since it was applied"):
        migrate.migrate(dsn)


def test_a_newer_database_is_refused(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO courier.schema_migrations (version, name, checksum) VALUES (9999, 'future', 'x')")
    with pytest.raises(MigrationError, match="newer than this Courier knows"):
        migrate.migrate(dsn)


def test_migration_files_follow_the_baseline_without_gaps():
    versions = [m.version for m in migrate.available()]
    assert migrate.available()[0].label == f"{migrate.BASELINE_VERSION:04d}_baseline"
    assert versions == list(range(migrate.BASELINE_VERSION, migrate.BASELINE_VERSION + len(versions)))


def test_pull_leases_in_flight_keep_their_fences_and_due_order_across_their_index_split(empty_dsn):
    """Migration 0059 gives leased pull messages an index of their own. Messages written before
    it (a running lease, a lapsed one, pending and scheduled ones) come through it as they were:
    the running lease's holder can still ack it, and a dequeue takes the pending message and the
    lapsed lease in due order, counting the lost attempt, and nothing scheduled for later."""
    migrate.migrate(empty_dsn, target=58)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        topic = scalar(conn, "INSERT INTO courier.endpoints (name, protocol) VALUES ('moved', 'pull') RETURNING id")
        rows = {}
        for name, status, lease, due in [("pending", "pending", 0, "-10 seconds"),
                                         ("running", "processing", 7, "60 seconds"),
                                         ("lapsed", "processing", 9, "-5 seconds"),
                                         ("later", "pending", 0, "1 hour")]:
            rows[name] = scalar(conn, "INSERT INTO courier.queue (endpoint_id, payload, status, lease, visible_at) "
                                      "VALUES (%s, jsonb_build_object('name', %s::text), %s, %s, now() + %s::interval) "
                                      "RETURNING id", (topic, name, status, lease, due))
    migrate.migrate(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert scalar(conn, "SELECT leased FROM courier.topics()") == 2  # running, lapsed: from the leased index
        assert scalar(conn, "SELECT leases FROM courier.endpoints WHERE name = 'moved'")  # receive looks for lapses
        taken = conn.execute("SELECT payload ->> 'name', retry_count FROM courier.dequeue('moved', 10)").fetchall()
        assert taken == [("pending", 0), ("lapsed", 1)]
        assert scalar(conn, "SELECT courier.ack(%s, 9)", (rows["lapsed"],)) == "lease_lost"
        assert scalar(conn, "SELECT courier.ack(%s, 7)", (rows["running"],)) == "acked"
