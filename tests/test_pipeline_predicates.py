"""--where predicates: typed as PostgreSQL's jsonb_path (lax mode) types them, checked against
PostgreSQL itself, and a path that cannot be read is one clear error line (no Spark needed)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from console.pipeline import predicates
from console.pipeline.session import PipelineError

DOCUMENTS = [
    {"v": 10}, {"v": "10"}, {"v": 10.5}, {"v": "abc"}, {"v": True}, {"v": False}, {"v": None}, {},
    {"v": [1, 200, "x"]}, {"v": [[200]]}, {"v": {"w": 1}}, {"v": []},
    {"order": {"total": 150, "currency": "EUR"}}, {"order": [{"total": 50}, {"total": 300}]},
    {"order": {"total": "150"}}, {"items": [{"sku": "a"}, {"sku": "b"}]}, {"odd key": {"x": 2}}, [1, 2, 3],
]
PREDICATES = [
    "$.v == 10", '$.v == "10"', "$.v > 5", '$.v > "5"', "$.v != 10", "$.v != null", "$.v == null", "$.v <= null",
    "$.v == true", "$.v > false", "$.v >= 10.5", '$.v < "b"', "$.v[0] == 10", "$.v[1] > 100", "$.v[5] == 1",
    "$.order.total > 100", '$.order.currency == "EUR"', "$.order[0].total < 100", '$.items.sku == "b"',
    '$."odd key".x == 2', "$[0] == 1", "$[2] >= 3", "$.missing != 1",
]


def test_predicates_match_exactly_what_postgres_jsonpath_matches(conn):
    for text in PREDICATES:
        test = predicates.parse(text)
        want = [conn.execute("SELECT coalesce(%s::jsonb @@ %s::jsonpath, false)",
                             (json.dumps(document), test.jsonpath)).fetchone()[0] for document in DOCUMENTS]
        got = [test.matches(document) for document in DOCUMENTS]
        assert got == want, (text, test.jsonpath)


def test_a_numeric_string_and_a_number_are_told_apart():
    number, string = {"total": 10}, {"total": "10"}
    assert predicates.parse("$.total == 10").matches(number) and not predicates.parse("$.total == 10").matches(string)
    assert predicates.parse('$.total == "10"').matches(string)
    assert not predicates.parse('$.total == "10"').matches(number)
    assert not predicates.parse("$.total > 5").matches(string)


@pytest.mark.parametrize(("text", "message"), [
    ("$.order..total > 1", "cannot read the JSON path '$.order..total' at '..total'"),
    ("$.order.total", "cannot read the predicate '$.order.total'"),
    ("$.order.total > EUR", "is not a number, a quoted string, true, false or null"),
    ("$.order.total > NaN", "is not a number"),
    ("$.a == [1]", "must be a number, a string, true, false or null"),
])
def test_a_bad_predicate_is_one_clear_error(text, message):
    with pytest.raises(PipelineError, match=re.escape(message)):
        predicates.parse(text)


def test_the_cli_refuses_a_bad_path_in_one_line_before_spark_starts(dsn):
    courier = [sys.executable, "-c", "from console.cli import main; main()"]
    args = ["pipeline", "replay", "--dsn", dsn, "--where", "$.order..total > 1", "--dry-run"]
    result = subprocess.run([*courier, *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "error: cannot read the JSON path '$.order..total' at '..total'. "
        'Hint: Use $.name, $."odd name" and $.list[0]']
    assert result.stdout == ""
