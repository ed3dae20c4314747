"""Install and upgrade schema courier: versioned migrations for tables, indexes and data, and
repeatable function files, each function defined once and re-applied when its file changes.

sqlkit/migrations/NNNN_name.sql run once each, in order, and are immutable once shipped; they
are the history an installed database upgrades through. The first, 0032_baseline, is the schema
migrations 0001-0032 built, squashed into one file; a database those migrations built is
recognised by its recorded history and recorded as at the baseline, with nothing applied.

sqlkit/functions/<area>.sql hold every function (and the triggers that call them) in its
current form, as CREATE OR REPLACE; a file whose checksum differs from the one recorded in
courier.schema_functions is applied again, the way Flyway's repeatable migrations work, so a
change to a function is a diff of that function.
roles.sql comes last and is re-applied whenever anything else was.

`migrate()` does all of it in one transaction under an advisory lock, so concurrent runs
(several workers starting at once) apply each step exactly once, a failed run leaves nothing
behind, and no other session ever sees a function before its privileges are set. A database
that is already up to date is left alone without the lock; the lock is waited for a bounded
time, since any database user can hold an advisory key, and the error names the session
holding it.
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass, field
from importlib import resources

import psycopg

from .connection import connect
from .errors import MigrationError, translated

_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")
# Any fixed key works; this one spells "courier" in the first bytes for pg_locks readers.
MIGRATION_LOCK_KEY = 0x636F7572696572
# How long migrate() waits for another session's migration lock before it gives up.
DEFAULT_LOCK_WAIT = 60.0
# The squashed history: migrations 0001-0032 became 0032_baseline. A database they built
# records each (version, checksum); this is the digest of all 32 rows (_history_digest).
BASELINE_VERSION = 32
SQUASHED_HISTORY_DIGEST = "d5b63f8ce4365ed751127792b3ec293f5384fe23af475b18e325e9c59d957229"
SQUASHED_AT_COMMIT = "c427f3d"
# The order function files are applied in; roles.sql grants on what the others define.
FUNCTION_AREAS = ("internals", "endpoints", "sending", "claiming", "delivery", "archive", "pull",
                  "consumer", "pubsub", "tokens", "observability", "verbs", "schedules", "roles")


def _checksum(sql: str) -> str:
    return hashlib.sha256(sql.encode()).hexdigest()


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str = field(repr=False)

    @property
    def checksum(self) -> str:
        return _checksum(self.sql)

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}"


@dataclass(frozen=True)
class FunctionFile:
    area: str
    sql: str = field(repr=False)

    @property
    def checksum(self) -> str:
        return _checksum(self.sql)

    @property
    def label(self) -> str:
        return f"functions/{self.area}.sql"


@dataclass(frozen=True)
class MigrationStatus:
    installed_version: int
    latest_version: int
    pending: list[Migration]
    functions_pending: list[FunctionFile] = field(default_factory=list)
    adopts_history: bool = False
    """Whether the database holds the history the baseline squashed, still to be recorded as
    the baseline."""

    @property
    def up_to_date(self) -> bool:
        return not self.pending and not self.functions_pending and not self.adopts_history


def available() -> list[Migration]:
    folder = resources.files("sqlkit").joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        match = _FILE.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"two migration files share a version number: {versions}")
    if not found or found[0].version != BASELINE_VERSION:
        raise MigrationError(f"sqlkit/migrations must begin with the baseline {BASELINE_VERSION:04d}: {versions}")
    return found


def function_files() -> list[FunctionFile]:
    folder = resources.files("sqlkit").joinpath("functions")
    present = {entry.name.removesuffix(".sql") for entry in folder.iterdir() if entry.name.endswith(".sql")}
    if present != set(FUNCTION_AREAS):
        raise MigrationError(f"sqlkit/functions holds {sorted(present)}, migrate knows {list(FUNCTION_AREAS)}")
    return [FunctionFile(area, folder.joinpath(f"{area}.sql").read_text(encoding="utf-8"))
            for area in FUNCTION_AREAS]


def _exists(conn: psycopg.Connection, table: str) -> bool:
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()
    return bool(row and row[0])


def _applied(conn: psycopg.Connection) -> dict[int, str]:
    if not _exists(conn, "courier.schema_migrations"):
        return {}
    return dict(conn.execute("SELECT version, checksum FROM courier.schema_migrations").fetchall())


def _applied_functions(conn: psycopg.Connection) -> dict[str, str]:
    if not _exists(conn, "courier.schema_functions"):
        return {}
    return dict(conn.execute("SELECT area, checksum FROM courier.schema_functions").fetchall())


def _history_digest(applied: dict[int, str]) -> str:
    return _checksum("".join(f"{version}:{checksum}\n" for version, checksum in sorted(applied.items())))


def _as_baseline(applied: dict[int, str], baseline: Migration) -> tuple[dict[int, str], bool]:
    """The applied migrations as this Courier numbers them, and whether they hold the history
    the baseline squashed (recorded as the baseline by the next migrate). Any other history
    from before the baseline is refused: no release shipped one, so nothing can upgrade it."""
    if min(applied, default=BASELINE_VERSION) >= BASELINE_VERSION:
        return applied, False
    if _history_digest(applied) != SQUASHED_HISTORY_DIGEST:
        raise MigrationError(
            f"the database has schema version {max(applied):04d} of a development build from before "
            f"the baseline migration {baseline.label}, which this Courier cannot upgrade",
            hint=f"Run `courier migrate` with Courier at commit {SQUASHED_AT_COMMIT} first, then with this one",
        )
    return {BASELINE_VERSION: baseline.checksum}, True


def _pending(applied: dict[int, str], migrations: list[Migration]) -> list[Migration]:
    known = {m.version: m for m in migrations}
    unknown = sorted(set(applied) - set(known))
    if unknown:
        raise MigrationError(
            f"the database has schema version {unknown[-1]:04d}, newer than this Courier "
            f"knows ({migrations[-1].version:04d})",
            hint="Upgrade Courier on this machine before running it against this database",
        )
    for version, checksum in applied.items():
        if known[version].checksum != checksum:
            raise MigrationError(
                f"migration {known[version].label} has changed since it was applied",
                hint="Shipped migrations are immutable; add a new migration instead",
            )
    return [m for m in migrations if m.version not in applied]


def _functions_pending(applied: dict[str, str], anything_else: bool) -> list[FunctionFile]:
    changed = [f for f in function_files() if applied.get(f.area) != f.checksum]
    if (changed or anything_else) and all(f.area != "roles" for f in changed):
        changed.append(function_files()[-1])
    return changed


def status(conn: psycopg.Connection) -> MigrationStatus:
    migrations = available()
    with translated():
        applied = _applied(conn)
        applied_functions = _applied_functions(conn)
    applied, adopts_history = _as_baseline(applied, migrations[0])
    pending = _pending(applied, migrations)
    return MigrationStatus(max(applied, default=0), migrations[-1].version, pending,
                           _functions_pending(applied_functions, bool(pending)), adopts_history)


def _bootstrap(conn: psycopg.Connection) -> None:
    conn.execute("CREATE SCHEMA IF NOT EXISTS courier")
    conn.execute(
        """CREATE TABLE IF NOT EXISTS courier.schema_migrations (
               version    integer PRIMARY KEY,
               name       text NOT NULL,
               checksum   text NOT NULL,
               applied_at timestamptz NOT NULL DEFAULT now())"""
    )
    conn.execute(
        """CREATE TABLE IF NOT EXISTS courier.schema_functions (
               area       text PRIMARY KEY,
               checksum   text NOT NULL,
               applied_at timestamptz NOT NULL DEFAULT now())"""
    )


def _record_as_baseline(conn: psycopg.Connection, baseline: Migration) -> None:
    """Replace the squashed history's rows with the baseline's: the schema they built is the
    one the baseline builds (tests/test_migrations.py proves it)."""
    conn.execute("DELETE FROM courier.schema_migrations WHERE version <= %s", (baseline.version,))
    conn.execute("INSERT INTO courier.schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                 (baseline.version, baseline.name, baseline.checksum))


def _apply_functions(conn: psycopg.Connection, files: list[FunctionFile]) -> None:
    # Bodies may name functions of a later file; they are checked when first called.
    conn.execute("SET LOCAL check_function_bodies = off")
    for file in files:
        conn.execute(file.sql.encode())
        conn.execute(
            "INSERT INTO courier.schema_functions (area, checksum) VALUES (%s, %s)"
            " ON CONFLICT (area) DO UPDATE SET checksum = excluded.checksum, applied_at = now()",
            (file.area, file.checksum),
        )


def _lock_holder(conn: psycopg.Connection) -> str:
    """Who holds the migration lock, as an operator would look for the session."""
    row = conn.execute(
        """SELECT l.pid, a.usename, a.application_name, a.backend_start
           FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
           WHERE l.locktype = 'advisory' AND l.granted AND l.database = (SELECT oid FROM pg_database
                                                                     WHERE datname = current_database())
             AND l.classid = (%(key)s >> 32)::oid AND l.objid = (%(key)s & 4294967295)::oid AND l.objsubid = 1
           LIMIT 1""",
        {"key": MIGRATION_LOCK_KEY},
    ).fetchone()
    if row is None:
        return "another session"
    pid, user, application, since = row
    connected = f", connected since {since:%Y-%m-%d %H:%M:%S %Z}" if since else ""
    return f"session {pid} (role {user or '?'}, application {application or '-'!r}{connected})"


def _take_migration_lock(conn: psycopg.Connection, wait: float) -> None:
    deadline = time.monotonic() + wait
    pause = 0.05
    while not conn.execute("SELECT pg_try_advisory_lock(%s)", (MIGRATION_LOCK_KEY,)).fetchone()[0]:
        if time.monotonic() >= deadline:
            raise MigrationError(
                f"the migration lock is held by {_lock_holder(conn)}; waited {wait:g} s",
                hint="Another `courier migrate` may be running; if not, end that session "
                     "(SELECT pg_terminate_backend(pid)) and run it again",
            )
        time.sleep(pause)
        pause = min(pause * 2, 1.0)


def migrate(dsn: str, target: int | None = None, lock_wait: float = DEFAULT_LOCK_WAIT) -> list[Migration]:
    """Apply pending migrations up to target (default: all), then the function files that
    changed if the schema is complete; returns the versioned migrations applied now."""
    every = available()
    migrations = [m for m in every if target is None or m.version <= target]
    with connect(dsn) as conn, translated():
        if target is None and status(conn).up_to_date:  # a starting console or demo waits for no lock
            _rebuild_depth(conn)
            return []
        _take_migration_lock(conn, lock_wait)
        try:
            with conn.transaction():
                _bootstrap(conn)
                applied, adopts_history = _as_baseline(_applied(conn), every[0])
                if adopts_history:
                    _record_as_baseline(conn, every[0])
                pending = _pending(applied, migrations)
                for migration in pending:
                    conn.execute(migration.sql.encode())
                    conn.execute(
                        "INSERT INTO courier.schema_migrations (version, name, checksum)"
                        " VALUES (%s, %s, %s)",
                        (migration.version, migration.name, migration.checksum),
                    )
                # Functions are written for the latest tables, so only a complete schema gets them.
                if max(_applied(conn), default=0) == every[-1].version:
                    _apply_functions(conn, _functions_pending(_applied_functions(conn), bool(pending)))
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
        if max(_applied(conn), default=0) == every[-1].version:
            _rebuild_depth(conn)
    return pending


def _rebuild_depth(conn: psycopg.Connection) -> None:
    """The depth counters are unlogged: after a crash, count the queue once (a no-op otherwise).
    A role that may not (the monitor) leaves it to the maintenance leader, and a standby, whose
    unlogged tables cannot be read, to its primary."""
    try:
        with conn.transaction():
            conn.execute("SELECT CASE WHEN pg_is_in_recovery() THEN 0 ELSE courier.rebuild_queue_depth() END")
    except psycopg.errors.InsufficientPrivilege:
        pass
