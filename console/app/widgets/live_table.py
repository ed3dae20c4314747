"""A DataTable that a poll updates in place by row key: no flicker, and the cursor stays on
the row it was on (by key, wherever new rows push it). Every string cell is shown as literal
text: DataTable would read a str as markup.

One column may be flexible: it takes the width the others leave (at least its minimum), so
the text that explains a row (a last error, an event's details) is read at 80 columns rather
than cut to its first letters off the right edge; a cut cell ends with an ellipsis, and the
pane's enter opens the row whole."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rich.text import Text
from textual._two_way_dict import TwoWayDict
from textual.widgets import DataTable
from textual.widgets.data_table import CellDoesNotExist, RowDoesNotExist

from ...literal import clip, literal

# A cell shows one line of a value; a stored megabyte would only slow the table down.
CELL_LIMIT = 200


class LiveTable(DataTable):
    DEFAULT_CSS = """
    LiveTable { height: 1fr; }
    """

    def __init__(self, columns: Sequence[tuple[str, str]], *, flex: str | None = None, flex_min: int = 20,
                 **kwargs: Any) -> None:
        """columns: (key, label) pairs; flex: the key of the column that takes the width left
        over (flex_min cells at least, its widest cell at most)."""
        super().__init__(cursor_type="row", zebra_stripes=False, **kwargs)
        self.flex = flex
        self.flex_min = flex_min
        self._column_keys = [key for key, _ in columns]
        self._labels = dict(columns)
        self.filter_text = ""
        self._all_rows: list[tuple[str, list[Any]]] = []
        self._widths: tuple[int, ...] = ()

    def on_mount(self) -> None:
        self._ensure_columns()

    def on_idle(self) -> None:
        self._fit_flex()
        # DataTable widens columns when idle but keeps the cursor row it drew before at the
        # old widths; redraw everything once the widths have changed.
        widths = tuple(column.get_render_width(self) for column in self.columns.values())
        if widths != self._widths:
            self._widths = widths
            self._clear_caches()
            self.refresh()

    def on_resize(self) -> None:
        self._fit_flex()

    def _fit_flex(self) -> None:
        column = self.columns.get(self.flex) if self.flex else None  # type: ignore[call-overload]
        if column is None:
            return
        label = column.label.cell_len
        natural = max(column.content_width, label)
        others = sum(c.get_render_width(self) for key, c in self.columns.items() if key != self.flex)
        room = self.scrollable_content_region.width - others - 2 * self.cell_padding
        width = natural if natural <= room else max(room, min(self.flex_min, natural))
        if column.auto_width or column.width != width:
            column.auto_width = False
            column.width = width
            self._require_update_dimensions = True
            self._clear_caches()
            self.refresh()

    def _ensure_columns(self) -> None:
        # A fast first poll can arrive before on_mount: rows need their columns first.
        if not self.columns:
            for key in self._column_keys:
                self.add_column(self._labels[key], key=key)

    def sync(self, rows: Iterable[tuple[str, Sequence[Any]]]) -> None:
        """Make the table show exactly these rows, in this order, touching only what changed."""
        self._ensure_columns()
        self._all_rows = [(key, [_cell(c) for c in cells]) for key, cells in rows]
        self._apply()

    def update_cell(self, row_key: Any, column_key: Any, value: Any, *, update_width: bool = False) -> None:
        super().update_cell(row_key, column_key, _cell(value), update_width=update_width)

    def set_filter(self, text: str) -> None:
        self.filter_text = text.strip().lower()
        self._apply()

    def _matches(self, cells: list[Any]) -> bool:
        if not self.filter_text:
            return True
        return any(self.filter_text in (c.plain if isinstance(c, Text) else str(c)).lower() for c in cells)

    def _apply(self) -> None:
        # DataTable's cursor is a screen row: remember the row's key (and, should that row go,
        # the ones that followed it) so an action hits the row the operator chose.
        before = [row_key.value for row_key in self._ordered_row_keys()]
        chosen = self.cursor_coordinate.row if before else None
        wanted = [(k, c) for k, c in self._all_rows if self._matches(c)]
        wanted_keys = {k for k, _ in wanted}
        for row_key in list(self.rows):
            if row_key.value not in wanted_keys:
                self.remove_row(row_key)
        order_changed = False
        for position, (key, cells) in enumerate(wanted):
            try:
                index = self.get_row_index(key)
            except RowDoesNotExist:
                self.add_row(*cells, key=key)
                order_changed = order_changed or position != self.row_count - 1
                continue
            order_changed = order_changed or index != position
            for column, value in zip(self._column_keys, cells, strict=True):
                try:
                    if self.get_cell(key, column) != value:
                        self.update_cell(key, column, value, update_width=True)
                except CellDoesNotExist:
                    pass
        if order_changed:
            self._order_like([k for k, _ in wanted])
        if chosen is not None and chosen < len(before):
            self._follow(before, chosen, wanted_keys)

    def _ordered_row_keys(self) -> list[Any]:
        return sorted(self._row_locations, key=self._row_locations.get)

    def _follow(self, before: list[Any], chosen: int, present: set[str]) -> None:
        """Put the cursor back on the row it was on; if that row went, on the nearest one that
        stayed (the next, else the previous), so a removed row does not send it to the top."""
        for key in before[chosen:] + before[:chosen][::-1]:
            if key in present:
                index = self.get_row_index(key)
                if index != self.cursor_coordinate.row:
                    self.move_cursor(row=index)
                return

    def _order_like(self, keys: list[str]) -> None:
        # DataTable.sort's key sees only cell values, so reorder its row index directly.
        rank = {key: i for i, key in enumerate(keys)}
        ordered = sorted(self.rows, key=lambda row_key: rank.get(row_key.value, 0))
        self._row_locations = TwoWayDict({row_key: i for i, row_key in enumerate(ordered)})
        self._update_count += 1
        self.refresh()

    @property
    def current_key(self) -> str | None:
        if self.row_count == 0:
            return None
        try:
            return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        except CellDoesNotExist:
            return None


def _cell(value: Any) -> Any:
    if isinstance(value, str):
        value = literal(clip(value, CELL_LIMIT))
    if isinstance(value, Text) and value.overflow is None:
        value.overflow = "ellipsis"  # a cell cut to its column's width says so
    return value
