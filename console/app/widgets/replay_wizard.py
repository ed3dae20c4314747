"""The archive replay wizard: endpoint, time range and status; a dry-run count; confirm;
then a progress bar while the replay runs in batches, and the result.

A message is replayed once, by whichever replay (the CLI's, this wizard, the pipeline's):
one replayed before is skipped unless "fresh copies" is ticked. Replays keep a cursor per
range in the database, so cancelling half-way (escape) and running the same range again
resumes where it stopped.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta, tzinfo
from typing import ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, ProgressBar, Select, Static

from sqlkit import archive
from sqlkit.archive import ReplayRange
from sqlkit.errors import CourierError

from ...literal import literal
from .confirm import ConfirmModal
from .tickbox import Tickbox

BATCH = 500
STATUSES = ("completed", "failed", "expired", "cancelled", "purged")


def parse_moment(text: str, field: str, tz: tzinfo | None) -> datetime:
    """YYYY-MM-DD or an ISO date-time; without an offset it is in the console's time zone."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{field}: expected YYYY-MM-DD or YYYY-MM-DD HH:MM, got {text.strip()!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=tz) if tz is not None else moment.astimezone()
    return moment


class ReplayWizard(ModalScreen[int | None]):
    """Dismisses with the number of messages replayed, or None when cancelled first."""

    # The fields scroll; the count, the error, the progress bar and the buttons are docked
    # below them, so each is in sight at 80x24.
    DEFAULT_CSS = """
    ReplayWizard { align: center middle; }
    ReplayWizard > #dialog {
        width: 72; max-width: 100%; height: auto; max-height: 100%;
        border: thick $accent; background: $surface; padding: 0 1;
    }
    ReplayWizard #wizard-body { height: auto; max-height: 100%; }
    ReplayWizard #wizard-footer { dock: bottom; height: auto; }
    ReplayWizard #replay-fields {
        grid-size: 2; grid-columns: 14 1fr; grid-gutter: 0 1; grid-rows: 1; height: auto; margin-top: 1;
    }
    ReplayWizard #replay-fields Input, ReplayWizard #replay-fields Select > SelectCurrent { background: $boost; }
    ReplayWizard #replay-fields Input:focus { background: $primary 30%; }
    ReplayWizard #range { height: 1; }
    ReplayWizard #range Input { width: 1fr; }
    ReplayWizard #range Label { width: auto; }
    ReplayWizard .hint { color: $text-muted; margin-top: 1; }
    ReplayWizard #replay-count { margin-top: 1; height: auto; text-style: bold; }
    ReplayWizard #replay-error { color: $text-error; text-style: bold; height: auto; margin-top: 1; }
    ReplayWizard ProgressBar { margin-top: 1; }
    ReplayWizard Horizontal.buttons { height: auto; align-horizontal: right; margin-top: 1; }
    ReplayWizard Button { margin-left: 2; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="replay.cancel"),
        Binding("ctrl+d", "dry_run", "Dry run", id="replay.dry_run"),
        Binding("ctrl+r", "replay", "Replay", id="replay.replay"),
    ]

    def __init__(self, endpoint_names: list[str], now: datetime, tz: tzinfo | None) -> None:
        super().__init__()
        self.endpoint_names = endpoint_names
        self.now = now
        self.tz = tz
        self.counted: tuple[ReplayRange, int] | None = None
        self.replayed = 0
        self._cancel_requested = threading.Event()
        self._replaying = False

    def compose(self) -> ComposeResult:
        start = (self.now - timedelta(days=1)).astimezone(self.tz).strftime("%Y-%m-%d %H:%M")
        end = self.now.astimezone(self.tz).strftime("%Y-%m-%d %H:%M")
        with Vertical(id="dialog"):
            with Vertical(id="wizard-footer"):
                yield Static("", id="replay-count")
                yield Static("", id="replay-error")
                yield ProgressBar(total=None, show_eta=False, id="replay-progress")
                with Horizontal(classes="buttons"):
                    yield Button("Cancel (esc)", id="cancel", compact=True)
                    yield Button("Dry run (ctrl+d)", id="dry-run", variant="primary", compact=True)
                    yield Button("Replay… (ctrl+r)", id="replay", variant="warning", disabled=True, compact=True)
            with VerticalScroll(id="wizard-body"):
                yield Label("Replay archived messages", classes="title")
                with Grid(id="replay-fields"):
                    yield Label("1. endpoint")
                    yield Select([(n, n) for n in self.endpoint_names], prompt="choose an endpoint", compact=True,
                                 id="replay-endpoint")
                    yield Label("2. created")
                    with Horizontal(id="range"):
                        yield Input(start, compact=True, id="replay-from")
                        yield Label(" to ")
                        yield Input(end, compact=True, id="replay-to")
                    yield Label("3. status")
                    yield Select([(s, s) for s in STATUSES], prompt="any status", compact=True, id="replay-status")
                    yield Label("")
                    yield Tickbox("fresh copies of messages replayed before", compact=True, id="replay-again")
                yield Static("Times: YYYY-MM-DD or YYYY-MM-DD HH:MM, in the console's time zone. "
                             "Dry run counts; replay enqueues copies.", classes="hint")

    def on_mount(self) -> None:
        for quiet in ("#replay-progress", "#replay-count", "#replay-error"):
            self.query_one(quiet).display = False
        self.query_one("#replay-endpoint", Select).focus()

    def selection(self) -> ReplayRange | None:
        """The range the form describes; shows the problem and returns None if it is invalid."""
        endpoint_select = self.query_one("#replay-endpoint", Select)
        endpoint = endpoint_select.value
        if endpoint_select.is_blank():
            self._error("endpoint: choose one")
            return None
        try:
            start = parse_moment(self.query_one("#replay-from", Input).value, "from", self.tz)
            end = parse_moment(self.query_one("#replay-to", Input).value, "to", self.tz)
        except ValueError as error:
            self._error(str(error))
            return None
        if end <= start:
            self._error("to: must be after from")
            return None
        status_select = self.query_one("#replay-status", Select)
        status = None if status_select.is_blank() else str(status_select.value)
        self._error("")
        self._endpoint_name = str(endpoint)
        again = self.query_one("#replay-again", Tickbox).value
        return ReplayRange(0, start.astimezone(UTC), end.astimezone(UTC), status, again)

    def _error(self, text: str) -> None:
        self._say("#replay-error", literal(text, lines=True))

    def _count(self, text: str) -> None:
        self._say("#replay-count", text)

    def _say(self, selector: str, text) -> None:
        """Fill a line of the footer; an empty one takes no room."""
        line = self.query_one(selector, Static)
        line.update(text)
        line.display = bool(text)

    def on_select_changed(self, event: Select.Changed) -> None:
        self._invalidate()

    def on_input_changed(self, event: Input.Changed) -> None:
        self._invalidate()

    def on_checkbox_changed(self, event: Tickbox.Changed) -> None:
        self._invalidate()

    def _invalidate(self) -> None:
        if not self._replaying:
            self.counted = None
            self.query_one("#replay", Button).disabled = True

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "cancel":
            self.action_cancel()
        elif event.button.id == "dry-run":
            self.action_dry_run()
        elif event.button.id == "replay":
            self.confirm_replay()

    def action_cancel(self) -> None:
        self._cancel_requested.set()
        if not self._replaying:
            self.dismiss(self.replayed if self.replayed else None)

    def action_dry_run(self) -> None:
        selection = self.selection()
        if selection is not None:
            self._count("counting…")
            self.dry_run(self._endpoint_name, selection)

    @work(thread=True, exclusive=True, group="replay", exit_on_error=False)
    def dry_run(self, endpoint: str, selection: ReplayRange) -> None:
        def count(conn):
            chosen = ReplayRange(archive.endpoint_id(conn, endpoint), selection.from_ts, selection.to_ts,
                                 selection.status, selection.again)
            return chosen, archive.count_replayable(conn, chosen), archive.running_replay(conn, chosen)
        try:
            chosen, total, running = self.app.database.run(count)  # type: ignore[attr-defined]
        except CourierError as error:
            self.app.call_from_thread(self._error, error.one_line())
            self.app.call_from_thread(self._count, "")
            return
        self.app.call_from_thread(self._counted, chosen, total, running)

    def _counted(self, chosen: ReplayRange, counted: archive.ReplayCount, running) -> None:
        total = counted.would_enqueue
        self.counted = (chosen, total)
        text = f"dry run: {total:,} message(s) would be replayed"
        if counted.already_replayed:
            text += (f"; {counted.already_replayed:,} replayed before"
                     + (", copied again" if chosen.again else ", skipped (tick fresh copies to copy them again)"))
        if running is not None:
            text += " (resuming an interrupted replay)"
        self._count(text)
        self.query_one("#replay", Button).disabled = total == 0
        if total:
            self.query_one("#replay", Button).focus()

    def action_replay(self) -> None:
        if not self.query_one("#replay", Button).disabled:
            self.confirm_replay()

    def confirm_replay(self) -> None:
        if self.counted is None:
            return
        chosen, total = self.counted

        def answered(yes: bool | None) -> None:
            if yes:
                self._start(chosen, total)
        self.app.push_screen(ConfirmModal(f"Replay {total:,} archived message(s) of {self._endpoint_name}? "
                                          "They are enqueued again as new messages.", "Replay"), answered)

    def _start(self, chosen: ReplayRange, total: int) -> None:
        self._replaying = True
        bar = self.query_one("#replay-progress", ProgressBar)
        bar.display = True
        bar.update(total=total, progress=0)
        for button in self.query(Button):
            button.disabled = button.id != "cancel"
        self.replay(chosen)

    @work(thread=True, exclusive=True, group="replay", exit_on_error=False)
    def replay(self, chosen: ReplayRange) -> None:
        error: CourierError | None = None
        try:
            while not self._cancel_requested.is_set():
                n, finished = self.app.database.run(  # type: ignore[attr-defined]
                    lambda conn: archive.replay_batch(conn, chosen, BATCH))
                self.replayed += n
                self.app.call_from_thread(self.query_one("#replay-progress", ProgressBar).update,
                                          progress=self.replayed)
                if finished:  # the range is done: another call would start it over
                    break
        except CourierError as exc:
            error = exc
        self.app.call_from_thread(self._finished, error)

    def _finished(self, error: CourierError | None) -> None:
        self._replaying = False
        if error is not None:
            self._error(error.one_line() + " — run the same range again to resume")
        if self._cancel_requested.is_set():
            self.dismiss(self.replayed)
            return
        self._count(f"replayed {self.replayed:,} message(s)")
        cancel = self.query_one("#cancel", Button)
        cancel.label = "Close (esc)"
        cancel.disabled = False
        cancel.focus()
