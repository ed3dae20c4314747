"""Who is calling: a bearer token, or HTTP basic auth with the token's name as the user and its
secret as the password (queue-ti's `curl -u admin:secret`). Tokens are looked up by hash and
remembered for a second, so a revocation takes effect within one."""

from __future__ import annotations

import base64
import binascii
import time

from aiohttp import web

from sqlkit import tokens
from sqlkit.connection import AsyncDatabase
from sqlkit.tokens import Token

from .problems import ApiError

REMEMBER_SECONDS = 1.0


class Authenticator:
    def __init__(self, db: AsyncDatabase) -> None:
        self._db = db
        self._known: dict[bytes, tuple[Token | None, float]] = {}

    async def token(self, request: web.Request) -> Token:
        """The request's live token, or a 401."""
        name, secret = _credentials(request.headers.get("Authorization", ""))
        digest = tokens.secret_hash(secret)
        known, until = self._known.get(digest, (None, 0.0))
        if until < time.monotonic():
            async with self._db.connection() as conn:
                known = await tokens.authenticate(conn, secret)
            if len(self._known) > 10_000:
                self._known.clear()
            self._known[digest] = (known, time.monotonic() + REMEMBER_SECONDS)
        if known is None or (name is not None and name != known.name):
            raise _unauthorized("the token is unknown or revoked")
        return known


def require(token: Token, action: str, *, topic: str | None = None, endpoint: str | None = None) -> None:
    """A 403 unless the token allows the action on that topic or endpoint."""
    if not token.may(action, topic=topic, endpoint=endpoint):
        what = f" on topic {topic!r}" if topic else f" on endpoint {endpoint!r}" if endpoint else ""
        raise ApiError(403, "forbidden", f"token {token.name!r} may not {action}{what}")


def _credentials(header: str) -> tuple[str | None, str]:
    if not header.isascii():  # no secret has such a character: refused here, not a 500 at its hash
        raise _unauthorized("the Authorization header holds characters no token has")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return None, value.strip()
    if scheme.lower() == "basic" and value.strip():
        try:
            user, _, password = base64.b64decode(value.strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            raise _unauthorized("malformed basic credentials") from None
        if user and password:
            return user, password
    raise _unauthorized("send a token: Authorization: Bearer <token>, or basic auth as <name>:<token>")


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, "unauthorized", message,
                    headers={"WWW-Authenticate": 'Bearer realm="courier", Basic realm="courier"'})
