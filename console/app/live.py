"""The base of every pane: polled in a background thread, rendered on the UI thread.

A poll never overlaps the previous one (the next is scheduled only when the last one has
been rendered), never runs while the pane is hidden or covered by a modal, and a database
that goes away shows the app's banner instead of an exception.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import psycopg
from textual import work
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.timer import Timer

from sqlkit.errors import CourierError

if TYPE_CHECKING:
    from .app import CourierApp


class LivePane(Vertical):
    """Subclasses implement compose, fetch (worker thread, through sqlkit) and show (UI thread)."""

    TITLE_TEXT: ClassVar[str] = ""
    REFRESH_SECONDS: ClassVar[float] = 2.0
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("r", "refresh_now", "Refresh", show=False, id="refresh"),
    ]

    def __init__(self, *, id: str) -> None:
        super().__init__(id=id)
        self._poll_timer: Timer | None = None
        self._polling = False
        self._poll_again = False
        self.active = False
        self.loaded = False
        """True once the first poll has been rendered (tests and screenshots wait for it)."""

    @property
    def polling(self) -> bool:
        """A poll is under way (read or not yet rendered)."""
        return self._polling

    @property
    def courier(self) -> CourierApp:
        return self.app  # type: ignore[return-value]

    # Subclass hooks ---------------------------------------------------------------------

    def fetch(self, conn: psycopg.Connection) -> Any:
        """Read what the pane shows. Runs in a worker thread: no widget access here."""
        return None

    def show(self, data: Any) -> None:
        """Render what fetch returned, updating widgets in place."""

    # Scheduling -------------------------------------------------------------------------

    def resume(self) -> None:
        """The pane is on screen again: poll now (after the repaint, so the pane shows first)."""
        self.active = True
        self.call_after_refresh(self.poll_now)

    def suspend(self) -> None:
        self.active = False
        self._stop_timer()

    def action_refresh_now(self) -> None:
        self.poll_now()

    def poll_now(self) -> None:
        self._stop_timer()
        if self._polling:
            self._poll_again = True  # one more poll right after this one, never two at once
            return
        self._polling = True
        self._load()

    def _stop_timer(self) -> None:
        if self._poll_timer is not None:
            self._poll_timer.stop()
            self._poll_timer = None

    @work(thread=True, exit_on_error=False)
    def _load(self) -> None:
        try:
            data = self.courier.database.run(self.fetch)
        except CourierError as error:
            self.app.call_from_thread(self._finish, None, error)
            return
        except Exception as error:  # a bug in one pane must not take the console down
            self.app.call_from_thread(self._finish, None, CourierError(f"{type(error).__name__}: {error}"))
            return
        self.app.call_from_thread(self._finish, data, None)

    def _finish(self, data: Any, error: CourierError | None) -> None:
        self._polling = False
        if error is None:
            try:
                self.show(data)
                self.loaded = True
            except Exception as exc:  # rendering bad data: say so, keep polling
                self.notify(f"could not show {self.TITLE_TEXT}: {exc}", severity="error", timeout=6)
        elif not self.courier.connection_lost:
            self.notify(error.one_line(), title=f"{self.TITLE_TEXT} refresh failed", severity="error", timeout=6)
        if self.active:
            self.courier.polled(self)
        if self._poll_again:
            self._poll_again = False
            self.poll_now()
            return
        if self.active:
            delay = self.REFRESH_SECONDS * self.courier.refresh_scale
            if self.courier.connection_lost:
                delay = max(delay, 2.0)
            self._poll_timer = self.set_timer(delay, self.poll_now)

    # Actions that write ----------------------------------------------------------------

    @work(thread=True, exit_on_error=False, group="write")
    def write(self, action, done_message: str | None = None) -> None:  # action: (conn) -> Any
        """Run a database change off the UI thread; report it, then refresh the pane."""
        try:
            result = self.courier.database.run(action)
        except CourierError as error:
            self.app.call_from_thread(self.notify, error.one_line(), title="failed", severity="error", timeout=8)
            return
        if done_message:
            text = done_message.format(result=result)
            self.app.call_from_thread(self.notify, text, timeout=4)
        self.app.call_from_thread(self.poll_now)
