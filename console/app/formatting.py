"""How the console writes times, ages, counts and states: one place, so every pane agrees."""

from __future__ import annotations

from datetime import datetime, tzinfo
from typing import Any

from rich.text import Text

from sqlkit import exact_json

# Theme variables, not colours, and the text-* ones that themes make readable on their own
# background: the same table reads on dark and light themes.
STATE_STYLES = {
    "closed": "$text-success", "open": "$text-error", "half_open": "$text-warning",
    "pending": "$foreground", "processing": "$text-accent", "failed": "$text-error", "redriven": "$text-success",
    "completed": "$text-success", "expired": "$text-warning", "ok": "$text-success", "warning": "$text-warning",
    "critical": "$text-error", "running": "$text-success", "disabled": "dim", "paused": "$text-warning",
    "draining": "$text-warning",
    "stopped": "dim", "stale": "$text-error", "lost": "$text-error", "live": "$text-success", "revoked": "dim",
    "late": "$text-error", "failing": "$text-error",
}


def age(seconds: float | None) -> str:
    """A compact age: 42s, 7m05s, 3h12m, 4d02h."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def since(moment: datetime | None, now: datetime) -> str:
    return "-" if moment is None else age((now - moment).total_seconds())


def when(moment: datetime | None, tz: tzinfo | None) -> str:
    return "-" if moment is None else moment.astimezone(tz).strftime("%Y-%m-%d %H:%M:%S")


def to_the_minute(moment: datetime | None, tz: tzinfo | None) -> str:
    return "-" if moment is None else moment.astimezone(tz).strftime("%Y-%m-%d %H:%M")


def clock_time(moment: datetime | None, tz: tzinfo | None) -> str:
    return "-" if moment is None else moment.astimezone(tz).strftime("%H:%M:%S")


def count(n: int | float | None) -> str:
    """1234 -> 1,234; big numbers stay narrow: 12.3M."""
    if n is None:
        return "-"
    n = int(n)
    if abs(n) >= 10_000_000:
        return f"{n / 1_000_000:.1f}M"
    return f"{n:,}"


def rate(per_second: float | None) -> str:
    if per_second is None:
        return "-"
    return f"{per_second:,.0f}/s" if per_second >= 10 else f"{per_second:.1f}/s"


def size(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TB"


def pretty_json(value: Any) -> str:
    """value as indented JSON; a number read exactly (exact_json.JsonNumber) is written as stored."""
    return exact_json.dumps_like(value, indent=2, sort_keys=False, ensure_ascii=False, default=str)


def one_line(text: str | None, width: int = 60) -> str:
    if not text:
        return ""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def state_text(state: str, theme_colors: dict[str, str]) -> Text:
    """A state word in its theme colour (theme_colors maps '$success' etc. to a colour)."""
    wanted = STATE_STYLES.get(state, "$foreground")
    style = theme_colors.get(wanted[1:], "") if wanted.startswith("$") else wanted
    bold = state in ("open", "failed", "critical", "failing")
    return Text(state.replace("_", "-"), style=f"bold {style}" if bold else style)
