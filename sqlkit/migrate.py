"""Ordered, checksummed migrations from sqlkit/migrations, tracked in courier.schema_migrations.

`migrate()` holds an advisory lock for its whole run, so concurrent runs (several workers
starting at once) apply each migration exactly once; later runs find nothing to do.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from importlib import resources

import psycopg

from .connection import connect
from .errors import MigrationError, translated

_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")
# Any fixed key works; this one spells "courier" in the first bytes for pg_locks readers.
MIGRATION_LOCK_KEY = 0x636F7572696572


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str = field(repr=False)

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}"


@dataclass(frozen=True)
class MigrationStatus:
    installed_version: int
    latest_version: int
    pending: list[Migration]

    @property
    def up_to_date(self) -> bool:
        return not self.pending


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
    return found


def _grants_sql() -> str:
    return resources.files("sqlkit").joinpath("grants.sql").read_text(encoding="utf-8")


def _applied(conn: psycopg.Connection) -> dict[int, str]:
    exists = conn.execute("SELECT to_regclass('courier.schema_migrations') IS NOT NULL").fetchone()
    if not exists or not exists[0]:
        return {}
    rows = conn.execute("SELECT version, checksum FROM courier.schema_migrations").fetchall()
    return dict(rows)


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


def status(conn: psycopg.Connection) -> MigrationStatus:
    migrations = available()
    with translated():
        applied = _applied(conn)
    return MigrationStatus(max(applied, default=0), migrations[-1].version, _pending(applied, migrations))


def migrate(dsn: str, target: int | None = None) -> list[Migration]:
    """Apply pending migrations up to target (default: all); returns those applied now."""
    migrations = [m for m in available() if target is None or m.version <= target]
    applied_now: list[Migration] = []
    with connect(dsn) as conn, translated():
        conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
        try:
            with conn.transaction():
                conn.execute("CREATE SCHEMA IF NOT EXISTS courier")
                conn.execute(
                    """CREATE TABLE IF NOT EXISTS courier.schema_migrations (
                           version    integer PRIMARY KEY,
                           name       text NOT NULL,
                           checksum   text NOT NULL,
                           applied_at timestamptz NOT NULL DEFAULT now())"""
                )
            for migration in _pending(_applied(conn), migrations):
                with conn.transaction():
                    conn.execute(migration.sql.encode())
                    conn.execute(
                        "INSERT INTO courier.schema_migrations (version, name, checksum)"
                        " VALUES (%s, %s, %s)",
                        (migration.version, migration.name, migration.checksum),
                    )
                applied_now.append(migration)
            # Grants name the functions of the latest schema, so only a complete schema gets them.
            if max(_applied(conn), default=0) == available()[-1].version:
                with conn.transaction():
                    conn.execute(_grants_sql().encode())
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
    return applied_now
