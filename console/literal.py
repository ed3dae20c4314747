"""Text that comes from the database, made safe to show: never read as markup, and with the
characters that would act on a terminal (escape sequences, carriage returns, bidi overrides)
shown as escapes instead of obeyed. The CLI and the console show every stored value through
here, so a payload, key or error an application wrote is displayed exactly as stored."""

from __future__ import annotations

import re
from typing import Any

from rich.console import Console
from rich.text import Text

# C0 and C1 controls and DEL drive terminals (ESC starts a sequence, CR overwrites a line);
# the bidi embeddings, overrides and isolates reorder what is shown around them (the
# "Trojan Source" trick); U+2028/2029 break lines in some terminals. Everything else,
# right-to-left scripts and zero-width joiners included, is text a user may store.
_ACTIVE = "\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_ACTIVE_IN_LINE = re.compile(f"[\t\n{_ACTIVE}]")
_ACTIVE_IN_BLOCK = re.compile(f"[{_ACTIVE}]")
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x7F else f"\\u{code:04x}"


def printable(value: Any, *, lines: bool = False) -> str:
    """value as text with its active characters escaped (\\x1b, \\u202e, \\r). A newline and
    a tab are kept where lines is true (a detail view), escaped otherwise (a table cell)."""
    text = value if isinstance(value, str) else str(value)
    return (_ACTIVE_IN_BLOCK if lines else _ACTIVE_IN_LINE).sub(_escape, text)


def literal(value: Any, style: str = "", *, lines: bool = False) -> Text:
    """A Rich Text that shows value as it is: brackets stay brackets, colons stay colons."""
    return Text(printable(value, lines=lines), style=style, end="")


def clip(text: str, limit: int) -> str:
    """At most limit characters, with an ellipsis where text was cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


class LiteralConsole(Console):
    """A Console that prints every string as literal text: no markup, no :emoji: codes, active
    characters escaped. Styling is applied with Text objects, never by markup in strings."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(markup=False, emoji=False, **kwargs)

    def render_str(self, text: str, **kwargs: Any) -> Text:
        kwargs["markup"] = False
        kwargs["emoji"] = False
        return super().render_str(printable(text, lines=True), **kwargs)
