"""Regenerate screenshots/: every pane (and the main dialogs) of the console, drawn from the
showcase data in a scratch database, as SVG, plus PNG where rsvg-convert is installed.

    python -m console.app.screenshots [--dsn SERVER_DSN] [--out screenshots]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from collections.abc import Awaitable, Callable
from datetime import UTC
from pathlib import Path

from textual.pilot import Pilot

from console.bench.scratch import scratch_database
from sqlkit import embedded

from . import showcase
from .app import make_app
from .widgets.token_forms import NewToken, TokenSecretModal

SIZE = (110, 32)
# Pictures show a made-up secret: a real one is random, and is shown only to whoever made it.
EXAMPLE_SECRET = "courier_EXAMPLE-not-a-real-secret-0123456789abcdefghi"


def _pane(name: str, *keys: str, history: int = 0) -> Callable[[Pilot, str], Awaitable[None]]:
    """Open a pane, play `history` polls of the showcase's recent past in it (its charts and
    rates come from those), then press keys."""
    async def before(pilot: Pilot, dsn: str) -> None:
        await showcase.open_pane(pilot, name)
        if history:
            await showcase.play_history(pilot, dsn, history)
        for key in keys:
            await pilot.press(key)
            await pilot.pause(0.3)
        await showcase.steady(pilot)
    return before


async def _token_secret(pilot: Pilot, dsn: str) -> None:
    await showcase.open_pane(pilot, "tokens")
    pilot.app.push_screen(TokenSecretModal(NewToken("ci-deploy", EXAMPLE_SECRET)))
    await pilot.pause(0.3)
    await showcase.steady(pilot)


SHOTS: dict[str, Callable[[Pilot, str], Awaitable[None]]] = {
    "overview": _pane("overview", history=showcase.HISTORY_STEPS),
    "endpoints": _pane("endpoints", history=1),
    "endpoint-create": _pane("endpoints", "n", history=1),
    "topic-limits": _pane("endpoints", *["down"] * 5, "l", history=1),
    "messages": _pane("messages"),
    "message-detail": _pane("messages", "enter"),
    "dlq": _pane("dlq"),
    "dlq-redrive-all": _pane("dlq", "A"),
    "archive": _pane("archive"),
    "archive-replay-wizard": _pane("archive", "p"),
    "events": _pane("events"),
    "workers": _pane("workers"),
    "analytics": _pane("analytics"),
    "tokens": _pane("tokens"),
    "token-create": _pane("tokens", "n"),
    "token-secret": _token_secret,
    "schedules": _pane("schedules"),
    "schedule-detail": _pane("schedules", "enter"),
    "help": _pane("overview", "question_mark"),
}


def take(dsn: str, name: str, size: tuple[int, int] = SIZE) -> str:
    app = make_app(dsn, clock=showcase.fixed_clock, tz=UTC, refresh_scale=1000, database_label="showcase")
    before = SHOTS[name]

    async def auto_pilot(pilot: Pilot) -> None:
        await before(pilot, dsn)
        await pilot.pause(0.2)
        await pilot.wait_for_scheduled_animations()
        app.exit(app.export_screenshot(title=f"courier · {name}"))

    return app.run(headless=True, auto_pilot=auto_pilot, size=size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="server to create the scratch database on (default: the embedded one)")
    parser.add_argument("--out", default="screenshots", type=Path)
    args = parser.parse_args()
    server = args.dsn or embedded.start()
    args.out.mkdir(parents=True, exist_ok=True)
    converter = shutil.which("rsvg-convert")
    with scratch_database(server) as dsn:
        showcase.seed(dsn)
        for name in SHOTS:
            svg_path = args.out / f"{name}.svg"
            svg = take(dsn, name)
            svg_path.write_text(svg, encoding="utf-8")
            if converter:
                render_png(converter, svg, svg_path.with_suffix(".png"))
            print(svg_path)


def render_png(converter: str, svg: str, png_path: Path) -> None:
    """rsvg-convert draws a no-break space narrower than a cell (it does not stretch a run of
    text to its textLength as browsers do), which shifted every cell after one: Textual keeps
    spaces as U+00A0, so the PNG is drawn from a copy with plain spaces, kept as written."""
    plain = svg.replace("&#160;", " ").replace("<svg ", '<svg xml:space="preserve" ', 1)
    with tempfile.NamedTemporaryFile("w", suffix=".svg", encoding="utf-8") as copy:
        copy.write(plain)
        copy.flush()
        subprocess.run([converter, "-w", "1200", copy.name, "-o", str(png_path)], check=True)


if __name__ == "__main__":
    main()
