"""Finding the database: --dsn, COURIER_DSN, DATABASE_URL, libpq's PG* variables, embedded."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

# libpq reads these itself; any one of them means the user has pointed us at a server.
LIBPQ_VARIABLES = ("PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER", "PGSERVICE")


@dataclass(frozen=True)
class DsnChoice:
    """A resolved connection string and where it came from."""

    dsn: str | None
    source: str

    @property
    def is_embedded(self) -> bool:
        return self.dsn is None


def resolve_dsn(explicit: str | None = None, environ: Mapping[str, str] | None = None) -> DsnChoice:
    """Pick the DSN in SPEC order. dsn=None means "use the embedded PostgreSQL"."""
    env = os.environ if environ is None else environ
    if explicit:
        return DsnChoice(explicit, "--dsn")
    for name in ("COURIER_DSN", "DATABASE_URL"):
        if env.get(name):
            return DsnChoice(env[name], name)
    if any(env.get(name) for name in LIBPQ_VARIABLES):
        return DsnChoice("", "PG* environment")
    return DsnChoice(None, "embedded")


def without_password(dsn: str) -> tuple[str, str | None]:
    """dsn with its password taken out, and that password (None: it has none). For a program
    given a connection string as an argument (pgbench, psql), which any local user can read
    with `ps`: pass it the first, and the second as PGPASSWORD in its environment."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(dsn)
    password = params.pop("password", None)
    return make_conninfo(**params), str(password) if password else None


def with_database(dsn: str, database: str) -> str:
    """dsn naming another database on the same server (same host, user and options). An
    empty dsn (libpq's PG* variables) gives just dbname=..., the rest still from PG*."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(dsn)
    params["dbname"] = database
    return make_conninfo(**params)
