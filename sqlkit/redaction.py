"""Courier's one redaction rule, for text that may quote a credential (broker URLs, error text,
log lines) and for documents (endpoint configs, headers, event details).

The database applies the same rule in courier._redact_text() and courier._redact()
(sqlkit/functions/internals.sql), which build their regular expressions from the same
patterns, written there as literals; tests/test_redaction.py runs a corpus through both and
requires the same output. Where a database is at hand (what it stores and shows), SQL redacts;
this module is for what never passes through it (worker log lines) and for error text before
it is recorded.

What counts as a secret:
- a URL's user-info: everything between `scheme://` and the last `@` of its authority (so a
  password may hold `@` and `:`), except a username before the first `:`;
  `amqp://guest:p@ss@host` -> `amqp://guest:***@host`, `nats://token@host` -> `nats://***@host`;
- the value of a name that looks like a secret (password, token, secret, auth..., api key,
  credential, signing, cookie) followed by `=` or `:`, as in query parameters
  (`?password=...`), headers (`Authorization: Bearer ...`, `X-Api-Key: ...`) and JSON or repr
  text (`"token": "..."`);
- the value of a query parameter whose name holds `key` or `sig` (`?key=...`, `&sig=...`);
- in a document, the whole value of a key that looks like a secret, at any depth, and every
  string by the rules above.
"""

from __future__ import annotations

import re
from typing import Any

MASK = "***"

# (pattern, replacement) pairs, applied in order, case-insensitively. They are written to mean
# the same in Python's re and PostgreSQL's regular expressions (greedy quantifiers only, so
# PostgreSQL's longest match is Python's first).
TEXT_RULES: tuple[tuple[str, str], ...] = (
    (r"""([a-z][a-z0-9+.-]*://)([^/?#@:\s"]*:)?[^/?#\s"]*@""", r"\1\2***@"),
    (r"""([a-z0-9_-]*(secret|pass|pwd|token|auth|api[_-]?key|credential|signing|cookie)[a-z0-9_-]*["']?\s*[:=]\s*["']?)"""
     r"""((bearer|basic|token|digest)\s+)?[^\s"'&,;)}\]]+""", r"\1***"),
    (r"""([?&;][a-z0-9_.-]*(key|sig)[a-z0-9_.-]*=)[^&#\s"']+""", r"\1***"),
)
SECRET_KEY = r"(secret|pass|pwd|token|auth|api[_-]?key|credential|signing|cookie|private[_-]?key)"

_COMPILED = tuple((re.compile(pattern, re.IGNORECASE), replacement) for pattern, replacement in TEXT_RULES)
_SECRET_KEY = re.compile(SECRET_KEY, re.IGNORECASE)


def redact_text(text: str) -> str:
    """text with every credential it quotes replaced by ***."""
    for pattern, replacement in _COMPILED:
        text = pattern.sub(replacement, text)
    return text


def redact(value: Any) -> Any:
    """A JSON-like document with secrets replaced, as courier._redact() does it."""
    if isinstance(value, dict):
        return {key: MASK if _SECRET_KEY.search(key) and not isinstance(item, dict) else redact(item)
                for key, item in value.items()}
    if isinstance(value, list):
        return [redact(item) for item in value]
    if isinstance(value, str):
        return redact_text(value)
    return value
