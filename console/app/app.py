"""The Courier console: k9s-style panes over the queue, with an optional embedded worker pool.

One factory, `make_app`, builds it for the CLI, the tests and the screenshots.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, tzinfo
from typing import TYPE_CHECKING, ClassVar

import psycopg
from textual.app import App, SystemCommand
from textual.binding import Binding, BindingType
from textual.notifications import SeverityLevel
from textual.reactive import reactive
from textual.screen import Screen

from sqlkit.errors import CourierError

from ..literal import printable
from .database import ConsoleDatabase
from .live import LivePane
from .main_screen import MainScreen
from .panes import PANES
from .widgets.help import HelpScreen
from .widgets.jump import JumpPrompt
from .widgets.topbar import TopBar

if TYPE_CHECKING:
    from console.workers.supervisor import EmbeddedPool


def _utc_now() -> datetime:
    return datetime.now(UTC)


class CourierApp(App[None]):
    TITLE = "Courier"
    CSS_PATH = "courier.tcss"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True, id="quit.ctrl_c"),
        Binding("question_mark", "help", "Help", id="help"),
        Binding("q", "quit", "Quit", id="quit"),
        Binding("colon", "jump", "Jump", show=False, id="jump"),
        *[Binding(spec.key, f"show_pane('{name}')", spec.title, show=False, id=f"goto.{name}")
          for name, spec in PANES.items()],
    ]

    connection_error: reactive[str] = reactive("")
    pool_summary: reactive[str] = reactive("")

    def __init__(self, dsn: str, *, pool: EmbeddedPool | None = None,
                 clock: Callable[[], datetime] = _utc_now, tz: tzinfo | None = None,
                 refresh_scale: float = 1.0, database_label: str | None = None,
                 exit_after: float = 0, exit_on_sigterm: bool = False) -> None:
        super().__init__()
        self.exit_after = exit_after
        self.exit_on_sigterm = exit_on_sigterm
        self.dsn = dsn
        self.pool = pool
        self.clock = clock
        self.tz = tz
        self.refresh_scale = refresh_scale
        self.database_label = database_label or _describe(dsn)
        self.database = ConsoleDatabase(dsn, on_state=self._database_state)

    @property
    def connection_lost(self) -> bool:
        return bool(self.connection_error)

    def on_mount(self) -> None:
        self.push_screen(MainScreen("overview"))
        self.database.open()
        self._show_pool_state()
        self.set_interval(1.0, self._show_pool_state)
        if self.exit_after:
            self.set_timer(self.exit_after, self.exit)
        if self.exit_on_sigterm:  # systemd, docker stop, kill: quit as q does, so the caller drains
            with contextlib.suppress(NotImplementedError, RuntimeError):
                asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, self.exit)

    def on_unmount(self) -> None:
        self.database.close()

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = False) -> None:
        """Notifications carry database text (errors, names): literal by default, never markup."""
        super().notify(printable(message, lines=True), title=printable(title), severity=severity, timeout=timeout,
                       markup=markup)

    def _database_state(self, error: CourierError | None) -> None:
        # Called from worker threads by ConsoleDatabase.
        self.call_from_thread(self._set_connection_error, "" if error is None else error.one_line())

    def _set_connection_error(self, text: str) -> None:
        if text and not self.connection_error:
            self.notify(text, title="database unreachable", severity="error", timeout=6)
        elif not text and self.connection_error:
            self.notify("database connection restored", timeout=4)
        self.connection_error = text

    def _show_pool_state(self) -> None:
        if self.pool is None:
            self.pool_summary = ""
            return
        state = self.pool.state
        self.pool_summary = (f"pool: {state.concurrency} in flight, running" if state.running
                             else "pool: stopped")

    # Panes -----------------------------------------------------------------------------

    @property
    def main(self) -> MainScreen:
        return next(s for s in self.screen_stack if isinstance(s, MainScreen))

    @property
    def pane(self) -> LivePane:
        """The pane on display."""
        return self.main.pane

    @property
    def current_pane(self) -> str:
        return self.pane.id or ""

    def action_show_pane(self, name: str) -> None:
        self.main.show_pane(name)

    def polled(self, pane: LivePane) -> None:
        """A visible pane finished a poll: the top bar says when."""
        self.main.query_one(TopBar).touch(self.clock())

    # Actions ---------------------------------------------------------------------------

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            self.screen.dismiss()
        else:
            self.push_screen(HelpScreen())

    def action_jump(self) -> None:
        def go(name: str | None) -> None:
            if name:
                self.action_show_pane(name)
        self.push_screen(JumpPrompt(), go)

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        for name, spec in PANES.items():
            yield SystemCommand(f"Go to {spec.title}", spec.summary,
                                lambda name=name: self.action_show_pane(name))
        if self.pool is not None:
            yield SystemCommand("Start the embedded worker pool", "deliver from this console",
                                lambda: self.pool.start())  # type: ignore[union-attr]
            yield SystemCommand("Stop the embedded worker pool", "drain in-flight messages, then stop",
                                lambda: self.run_worker(self.pool.stop, thread=True))  # type: ignore[union-attr]
        yield from super().get_system_commands(screen)


def _describe(dsn: str) -> str:
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "database"
    host = params.get("host") or "localhost"
    if str(host).startswith("/"):
        host = "local socket"
    port = params.get("port")
    return f"{params.get('dbname', '')}@{host}{':' + str(port) if port and not str(host).startswith('local') else ''}"


def make_app(dsn: str, *, pool: EmbeddedPool | None = None, clock: Callable[[], datetime] = _utc_now,
             tz: tzinfo | None = None, refresh_scale: float = 1.0,
             database_label: str | None = None, exit_after: float = 0,
             exit_on_sigterm: bool = False) -> CourierApp:
    """The console as the CLI runs it; tests pass a fixed clock, UTC and a slow refresh."""
    return CourierApp(dsn, pool=pool, clock=clock, tz=tz, refresh_scale=refresh_scale,
                      database_label=database_label, exit_after=exit_after, exit_on_sigterm=exit_on_sigterm)
