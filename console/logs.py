"""Structured logging: JSON lines for headless workers, with each record's extras as fields."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

from sqlkit.redaction import redact, redact_text

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime", "taskName"}


class JsonLineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        line.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        # Messages, extras and exceptions may quote a broker URL or a header: no line leaves
        # with a secret in it.
        return json.dumps({key: redact_text(value) if isinstance(value, str) else redact(value)
                           for key, value in line.items()}, default=lambda value: redact_text(str(value)))


def log_json_lines(level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLineFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
