"""JSON-path predicates on payloads (`$.order.total > 100`), parsed once and evaluated with
PostgreSQL's jsonb_path semantics (SQL/JSON path, lax mode): in PostgreSQL itself with `@@`
when reading the archive, and by `matches` below for Parquet. Comparisons are typed: "10"
(a string) never equals or exceeds 10 (a number); a missing path matches nothing. The grammar
is SQL/JSON's simplest form: a path, a comparison (== != > >= < <=) and a literal (number,
"string", true, false or null)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .session import PipelineError

_PREDICATE = re.compile(r'^\s*(?P<path>\$(?:"[^"]*"|[^<>=!\s"])*)\s*'
                        r"(?P<op>==|!=|<>|>=|<=|>|<)\s*(?P<literal>.+?)\s*$")
_STEP = re.compile(r'\.(?P<name>[A-Za-z_][A-Za-z0-9_]*)|\."(?P<quoted>[^"]+)"|\[(?P<index>\d+)\]')
_HOLDS = {"==": lambda c: c == 0, "!=": lambda c: c != 0, ">": lambda c: c > 0, ">=": lambda c: c >= 0,
          "<": lambda c: c < 0, "<=": lambda c: c <= 0}


@dataclass(frozen=True)
class Predicate:
    text: str
    steps: tuple[str | int, ...]
    op: str
    literal: Any

    @property
    def jsonpath(self) -> str:
        """The predicate as a PostgreSQL jsonpath, for `payload @@ jsonpath`."""
        path = "".join(f"[{step}]" if isinstance(step, int) else "." + json.dumps(step) for step in self.steps)
        return f"${path} {self.op} {json.dumps(self.literal)}"

    def matches(self, document: Any) -> bool:
        """True when `document @@ self.jsonpath` is true in PostgreSQL (false or unknown: False)."""
        found = [document]
        for step in self.steps:
            found = [item for value in found for item in _step(value, step)]
        # Lax mode unwraps an array operand once; a pair that cannot be compared is unknown.
        items = [item for value in found for item in (value if isinstance(value, list) else [value])]
        return any(_compare(item, self.literal, self.op) for item in items)


def _step(value: Any, step: str | int) -> list[Any]:
    if isinstance(step, int):  # lax: a non-array is an array of itself; out of range is nothing
        items = value if isinstance(value, list) else [value]
        return [items[step]] if step < len(items) else []
    targets = value if isinstance(value, list) else [value]  # lax: member access unwraps an array once
    return [t[step] for t in targets if isinstance(t, dict) and step in t]


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return "string" if isinstance(value, str) else "container"


def _compare(item: Any, literal: Any, op: str) -> bool:
    left, right = _kind(item), _kind(literal)
    if left != right:
        # As PostgreSQL: null against a non-null is unequal; other mixed types are not comparable.
        return op == "!=" and "null" in (left, right)
    if left == "container":
        return False
    order = 0 if item == literal else (1 if item > literal else -1) if left != "null" else 0
    return _HOLDS[op](order)


def matcher(tests: Sequence[Predicate]) -> Any:
    """A function of a payload's JSON text: do all the tests hold? (For a Spark UDF.)"""
    def match(text: str | None) -> bool:
        if text is None:
            return False
        try:
            document = json.loads(text)
        except ValueError:
            return False
        return all(test.matches(document) for test in tests)
    return match


def column(tests: Sequence[Predicate], payload: str = "payload") -> Any:
    """A Spark column: all the tests hold on the payload (JSON text), typed as in PostgreSQL."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType

    test = matcher(tests)  # (a lambda: PySpark reads type hints as a request for a pandas UDF)
    return F.udf(lambda text: test(text), BooleanType(), useArrow=False)(F.col(payload))


def parse(text: str) -> Predicate:
    match = _PREDICATE.match(text)
    if not match:
        raise PipelineError(f"cannot read the predicate {text!r}",
                            hint="Write it as a path, a comparison and a value, e.g. '$.order.total > 100'")
    path = match["path"]
    steps: list[str | int] = []
    position = 1
    while position < len(path):
        step = _STEP.match(path, position)
        if not step:
            raise PipelineError(f"cannot read the JSON path {path!r} at {path[position:]!r}",
                                hint='Use $.name, $."odd name" and $.list[0]')
        steps.append(int(step["index"]) if step["index"] is not None else step["name"] or step["quoted"])
        position = step.end()
    def refuse(constant: str) -> Any:
        raise ValueError(constant)

    try:
        literal = json.loads(match["literal"].replace("'", '"') if match["literal"].startswith("'")
                             else match["literal"], parse_constant=refuse)
    except ValueError:
        raise PipelineError(f"the value in {text!r} is not a number, a quoted string, true, false or null",
                            hint='Quote strings: $.currency == "EUR"') from None
    if isinstance(literal, dict | list):
        raise PipelineError(f"the value in {text!r} must be a number, a string, true, false or null")
    if isinstance(literal, float) and literal in (float("inf"), float("-inf")):
        raise PipelineError(f"the number in {text!r} is out of range")
    op = "!=" if match["op"] == "<>" else match["op"]
    return Predicate(text, tuple(steps), op, literal)
