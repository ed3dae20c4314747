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

Secrets also have shapes of their own, found wherever they stand, whatever words come before
them (issue 40: an oversized or malformed Authorization header reaches the log quoted by
aiohttp's parser, `b' Bearer courier_...'`, with no `Authorization:` before it): SHAPE_RULES,
applied by scrub() with the rules above to every log line (console/logs.py) and alone to every
error body the HTTP API sends (console/serve/app.py). They are
- the credentials after `Bearer ` or `Basic ` (8 characters or more, so prose such as "basic
  auth" is left alone);
- an API token's secret: sqlkit.tokens.PREFIX and its token_urlsafe body (43 characters; 24 or
  more are redacted, so a database named courier_orders keeps its name, and a secret cut short
  in a quote is redacted while it holds more than 23 of its characters);
- a Standard Webhooks signing secret, `whsec_` and its base64.
courier._redact_text() applies them too, after the rules above, as redact_text() does.
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
# Written, like TEXT_RULES, to mean the same in PostgreSQL but for \b, which PostgreSQL spells \y.
SHAPE_RULES: tuple[tuple[str, str], ...] = (
    (r"\b(bearer|basic)(\s+)[a-z0-9._~+/-]{8,}=*", r"\1\2***"),
    (r"(courier_)[a-z0-9_-]{24,}", r"\1***"),
    (r"(whsec_)[a-z0-9+/=_-]+", r"\1***"),
)
SECRET_KEY = r"(secret|pass|pwd|token|auth|api[_-]?key|credential|signing|cookie|private[_-]?key)"

# TEXT_RULES as Python's backtracking engine must run them. PostgreSQL's engine matches the
# rules above in linear time; Python's tried every split of a word around its keyword, and a
# log line quoting 2,000 characters of "secretsecret..." took 27 s (8,000 of "aaa..." 12 s):
# one hostile string in a log line stalled the server's event loop. These match exactly the
# same text (tests/test_redaction.py runs random hostile text through both engines), in time
# linear in the text:
# - a URL's scheme is matched only from the start of a run of scheme characters ([0-9+.-]*
#   before its first letter kept as it is), and possessively: it ends where "://" begins;
# - a secret-looking name is matched only from the start of its word, with its keyword found
#   by a lookahead, and the word taken whole (possessively): it ends where ":" or "=" begins.
_LINEAR_TEXT_RULES: tuple[tuple[str, str], ...] = (
    (r"""(?<![a-z0-9+.-])([0-9+.-]*+)([a-z][a-z0-9+.-]*+://)([^/?#@:\s"]*:)?[^/?#\s"]*@""", r"\1\2\3***@"),
    (r"""((?<![a-z0-9_-])(?=[a-z0-9_-]*?(?:secret|pass|pwd|token|auth|api[_-]?key|credential|signing|cookie))"""
     r"""[a-z0-9_-]*+["']?\s*+[:=]\s*+["']?)((?:bearer|basic|token|digest)\s+)?[^\s"'&,;)}\]]+""", r"\1***"),
    (r"""([?&;](?=[a-z0-9_.-]*?(?:key|sig))[a-z0-9_.-]*+=)[^&#\s"']+""", r"\1***"),
)
_COMPILED = tuple((re.compile(pattern, re.IGNORECASE), replacement) for pattern, replacement in _LINEAR_TEXT_RULES)
_SHAPES = tuple((re.compile(pattern, re.IGNORECASE), replacement) for pattern, replacement in SHAPE_RULES)
_SECRET_KEY = re.compile(SECRET_KEY, re.IGNORECASE)


def redact_text(text: str) -> str:
    """text with every credential it quotes, and every secret of a known shape, replaced by ***."""
    for pattern, replacement in _COMPILED:
        text = pattern.sub(replacement, text)
    return redact_shapes(text)


def redact_shapes(text: str) -> str:
    """text with every secret of a known shape replaced (the prefix kept: `courier_***`)."""
    for pattern, replacement in _SHAPES:
        text = pattern.sub(replacement, text)
    return text


def scrub(text: str) -> str:
    """redact_text(): for a log line, which may quote anything."""
    return redact_text(text)


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
