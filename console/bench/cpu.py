"""CPU time of process trees from Linux's /proc, for what a benchmark's work costs: the worker's
processes, and the PostgreSQL server's when it runs on this machine. None where /proc cannot
tell (another OS, a server elsewhere)."""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> list[str] | None:
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    return text[text.rindex(")") + 2:].split()


def _children() -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None:
                found.setdefault(int(fields[1]), []).append(int(entry.name))
    return found


def tree_seconds(pid: int, *, reaped: bool = False) -> float | None:
    """User + system CPU seconds of `pid` and every live descendant; with `reaped`, also what
    the children it has waited for used (a server's finished backends)."""
    fields = _stat(pid)
    if fields is None:
        return None
    children = _children()
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        stat = fields if current == pid else _stat(current)
        if stat is not None:
            # utime, stime, cutime, cstime are fields 14-17 (1-based), 11-14 here.
            total += int(stat[11]) + int(stat[12])
            if reaped and current == pid:
                total += int(stat[13]) + int(stat[14])
        stack.extend(children.get(current, []))
    return total / _TICKS


def server_seconds(backend_pid: int) -> float | None:
    """CPU seconds of the whole PostgreSQL server one of whose backends is `backend_pid`
    (its postmaster and every process under it, finished backends included), or None if that
    backend is not a process of this machine."""
    fields = _stat(backend_pid)
    if fields is None:
        return None
    return tree_seconds(int(fields[1]), reaped=True)
