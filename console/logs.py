"""Structured logging: JSON lines for headless workers, with each record's extras as fields.

No line leaves with a secret in it, whoever wrote it: Courier's loggers and aiohttp's (whose
HTTP parser quotes the raw bytes of a malformed request, a token included) go through the
JSON formatter, which redacts every field and then the secret shapes in the whole line; and
RedactingFilter redacts the record itself, on aiohttp's loggers and on every handler
log_json_lines() leaves in place, so a handler with another formatter cannot leak either."""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime

from sqlkit.redaction import redact, redact_shapes, scrub

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime", "taskName"}

AIOHTTP_LOGGERS = ("aiohttp.access", "aiohttp.client", "aiohttp.internal", "aiohttp.server", "aiohttp.web",
                   "aiohttp.websocket")
"""aiohttp's own loggers (aiohttp/log.py): their records carry request bytes."""
REDACTED_AT_SOURCE = (*AIOHTTP_LOGGERS, "courier.serve")
"""Loggers whose records are redacted as they are made, whichever handler then takes them (a
logger's filters see only its own records, not its children's: each is named)."""


class RedactingFilter(logging.Filter):
    """Redacts a record in place (its message with its arguments, its exception and stack
    text, its extras) and lets it through; a record redacted already passes unchanged."""

    _formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = scrub(record.getMessage())
        record.args = None
        if record.exc_info:
            # The traceback as text, redacted; exc_info cleared so no formatter prints the
            # exception (whose message may quote a secret) again from the live object.
            if not record.exc_text:
                record.exc_text = self._formatter.formatException(record.exc_info)
            record.exc_info = None
        if record.exc_text:
            record.exc_text = scrub(record.exc_text)
        if record.stack_info:
            record.stack_info = scrub(record.stack_info)
        for key, value in list(record.__dict__.items()):
            if key not in _STANDARD:
                record.__dict__[key] = scrub(value) if isinstance(value, str) else redact(value)
        return True


class JsonLineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        line.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exception"] = record.exc_text
        # Messages, extras and exceptions may quote a broker URL or a header, and the whole
        # line a secret's shape (an escaped quote of raw bytes): no line leaves with a secret.
        return redact_shapes(json.dumps({key: scrub(value) if isinstance(value, str) else redact(value)
                                         for key, value in line.items()},
                                        default=lambda value: scrub(str(value))))


LEVELS = ("debug", "info", "warning", "error")
LEVEL_VARIABLE = "COURIER_LOG_LEVEL"
"""The level the headless commands log at (--log-level sets it; their children inherit it)."""


def log_json_lines(level: int | None = None) -> None:
    """JSON lines on stderr at `level` (None: COURIER_LOG_LEVEL, else info)."""
    if level is None:
        chosen = os.environ.get(LEVEL_VARIABLE, "info").strip().lower()
        level = getattr(logging, chosen.upper()) if chosen in LEVELS else logging.INFO
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLineFormatter())
    handler.addFilter(RedactingFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    redact_at_source()


def redact_at_source() -> None:
    """The records of REDACTED_AT_SOURCE redacted where they are made, and aiohttp's sent on to
    the root's handlers (the JSON lines), never to a handler of their own."""
    for name in REDACTED_AT_SOURCE:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactingFilter) for f in logger.filters):
            logger.addFilter(RedactingFilter())
    for name in AIOHTTP_LOGGERS:
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
