"""JSON-path predicates on payloads (`$.order.total > 100`), parsed once and turned into a
Spark column over the payload's JSON text. The grammar is SQL/JSON's simplest form: a path,
a comparison (== != > >= < <=) and a literal (number, "string", true, false or null)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .session import PipelineError

_PREDICATE = re.compile(r"^\s*(?P<path>\$[^<>=!\s]*)\s*(?P<op>==|!=|<>|>=|<=|>|<)\s*(?P<literal>.+?)\s*$")
_STEP = re.compile(r'\.(?P<name>[A-Za-z_][A-Za-z0-9_]*)|\."(?P<quoted>[^"]+)"|\[(?P<index>\d+)\]')


@dataclass(frozen=True)
class Predicate:
    text: str
    steps: tuple[str | int, ...]
    op: str
    literal: Any

    @property
    def spark_path(self) -> str:
        """The path in get_json_object's syntax."""
        parts = ["$"]
        for step in self.steps:
            if isinstance(step, int):
                parts.append(f"[{step}]")
            elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", step):
                parts.append(f".{step}")
            else:
                parts.append(f"['{step}']")
        return "".join(parts)

    def column(self, payload: str = "payload") -> Any:
        from pyspark.sql import functions as F

        found = F.get_json_object(F.col(payload), self.spark_path)
        if self.literal is None:
            return found.isNull() if self.op == "==" else found.isNotNull()
        if isinstance(self.literal, bool):
            found, literal = found, F.lit("true" if self.literal else "false")
        elif isinstance(self.literal, int | float):
            found, literal = found.cast("double"), F.lit(float(self.literal))
        else:
            literal = F.lit(self.literal)
        compare = {"==": found == literal, "!=": found != literal, ">": found > literal, ">=": found >= literal,
                   "<": found < literal, "<=": found <= literal}
        return compare[self.op] & found.isNotNull()


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
    try:
        literal = json.loads(match["literal"].replace("'", '"') if match["literal"].startswith("'")
                             else match["literal"])
    except ValueError:
        raise PipelineError(f"the value in {text!r} is not a number, a quoted string, true, false or null",
                            hint='Quote strings: $.currency == "EUR"') from None
    if isinstance(literal, dict | list):
        raise PipelineError(f"the value in {text!r} must be a number, a string, true, false or null")
    op = "!=" if match["op"] == "<>" else match["op"]
    if literal is None and op not in ("==", "!="):
        raise PipelineError(f"{text!r}: null compares only with == or !=")
    return Predicate(text, tuple(steps), op, literal)
