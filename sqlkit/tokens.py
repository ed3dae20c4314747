"""Typed API over the HTTP API's bearer tokens (functions/tokens.sql). A token's secret is made
here, shown once, and stored only as its SHA-256."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime

import psycopg

from . import queries

ACTIONS = ("enqueue", "consume", "publish", "monitor", "admin")
PREFIX = "courier_"


@dataclass(frozen=True)
class Token:
    name: str
    topics: list[str]
    endpoints: list[str]
    actions: list[str]
    created_at: datetime | None = None
    last_used_at: datetime | None = None
    revoked_at: datetime | None = None

    def may(self, action: str, topic: str | None = None, endpoint: str | None = None) -> bool:
        """Whether the token allows `action` on the topic or push endpoint named (an admin token
        allows everything)."""
        if "admin" in self.actions:
            return True
        if action not in self.actions:
            return False
        if topic is not None and not ({"*", topic} & set(self.topics)):
            return False
        return endpoint is None or bool({"*", endpoint} & set(self.endpoints))

    def topics_for(self, action: str) -> list[str] | None:
        """The topics the token may `action` on: None for every topic, [] for none."""
        if "admin" in self.actions or (action in self.actions and "*" in self.topics):
            return None
        return list(self.topics) if action in self.actions else []


def secret_hash(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def create_token(conn: psycopg.Connection, name: str, *, topics: list[str], endpoints: list[str],
                 actions: list[str]) -> str:
    """Make a token and return its secret, which is not stored and cannot be shown again."""
    secret = PREFIX + secrets.token_urlsafe(32)
    queries.fetch_value(conn, "create_api_token", {"name": name, "secret_hash": secret_hash(secret),
                                                   "topics": topics, "endpoints": endpoints, "actions": actions})
    return secret


def revoke_token(conn: psycopg.Connection, name: str) -> bool:
    """Revoke a token at once; False if it was revoked already."""
    return bool(queries.fetch_value(conn, "revoke_api_token", {"name": name}))


def list_tokens(conn: psycopg.Connection) -> list[Token]:
    return [Token(**row) for row in queries.fetch_all(conn, "list_api_tokens")]


async def authenticate(conn: psycopg.AsyncConnection, secret: str) -> Token | None:
    """The live token with this secret, or None."""
    rows = await queries.fetch_all_async(conn, "authenticate_api_token", {"secret_hash": secret_hash(secret)})
    return Token(**rows[0]) if rows else None
