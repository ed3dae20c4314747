"""The console's chart axes: from 0 to a round number, ticked at round times, and never an
axis around nothing (the Overview's "collecting…" is in its snapshot tests)."""

from __future__ import annotations

import re

import pytest
from textual_plotext import Plot

from console.app.widgets.chart import line_chart, nice_top


@pytest.mark.parametrize(("value", "top"), [
    (0, 1), (-3, 1), (0.2, 0.2), (0.25, 0.3), (1, 1), (1.2, 1.5), (7, 8), (63, 80), (110, 150), (240, 300),
    (1001, 1500),
])
def test_the_top_of_an_axis_is_a_round_number_at_or_above_the_highest_value(value, top):
    assert nice_top(value) == pytest.approx(top)



def _drawn(plt: Plot) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", plt.build())


def test_rates_of_zero_still_draw_from_zero_up():
    plt = Plot()
    line_chart(plt, "delivered/s", [("delivered", [-20.0, -10.0, 0.0], [0.0, 0.0, 0.0])], span=20, whole=False)
    text = _drawn(plt)
    ticks = [line.split("┤")[0].strip() for line in text.splitlines() if "┤" in line]
    assert ticks == ["1", "0.5", "0"]  # from 0 up, never -1 to 1
    assert "now" in text and "-20s" in text


def test_counts_tick_whole_numbers_and_minutes_before_now():
    plt = Plot()
    line_chart(plt, "depth", [("pending", [-300.0, -150.0, 0.0], [40, 63, 1])], span=300)
    text = _drawn(plt)
    ticks = [line.split("┤")[0].strip() for line in text.splitlines() if "┤" in line]
    assert ticks == ["80", "40", "0"]
    assert all(label in text for label in ("-5m", "-4m", "-1m", "now"))
