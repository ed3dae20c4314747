"""Drive a SQL script with pgbench (shipped with the embedded PostgreSQL) and read its rate.

Both Courier and its ceiling run through the same client, so the ratio measures the
database work and not Python's overhead.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sqlkit import embedded
from sqlkit.dsn import without_password
from sqlkit.errors import CourierError

_TPS = re.compile(r"^tps = ([0-9.]+)", re.MULTILINE)
_LATENCY = re.compile(r"^latency average = ([0-9.]+) ms", re.MULTILINE)
_FAILED = re.compile(r"^number of failed transactions: (\d+)", re.MULTILINE)
_PROCESSED = re.compile(r"^number of transactions actually processed: (\d+)", re.MULTILINE)


def _pgbench(command: list[str], dsn: str) -> subprocess.CompletedProcess[str]:
    """Run pgbench `command` against dsn, whose password (if any) goes in PGPASSWORD rather
    than on the command line, which any local user can read (`ps`)."""
    conninfo, password = without_password(dsn)
    env = {**os.environ, "PGPASSWORD": password} if password else None
    return subprocess.run([*command, conninfo], capture_output=True, text=True, check=False, env=env)


@dataclass(frozen=True)
class PgbenchRun:
    transactions_per_second: float
    latency_ms: float
    failed: int
    transactions: int


def run_script(dsn: str, script: str, *, clients: int, seconds: float | None = None, transactions: int | None = None,
               threads: int = 2, defines: dict[str, str] | None = None, rate: float | None = None) -> PgbenchRun:
    """Run script for `seconds`, or `transactions` times per client; `defines` are pgbench
    variables each client starts with (-D). With `rate`, pgbench starts that many
    transactions per second over all clients on its own schedule (-R), rather than each
    client starting its next as soon as the last one ends."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "script.sql"
        path.write_text(script)
        path.chmod(0o644)
        Path(folder).chmod(0o755)
        command = [
            str(embedded.client_binary("pgbench")), "-n", "-M", "prepared",
            "-c", str(clients), "-j", str(min(threads, clients)),
            *(["-t", str(transactions)] if transactions else ["-T", str(max(1, round(seconds or 1)))]),
            *[f"-D{name}={value}" for name, value in (defines or {}).items()],
            *(["-R", f"{rate:g}"] if rate else []),
            "-f", str(path),
        ]
        done = _pgbench(command, dsn)
    output = done.stdout + done.stderr
    tps = _TPS.search(output)
    if done.returncode != 0 or tps is None:
        last = output.strip().splitlines()[-1] if output.strip() else f"exit {done.returncode}"
        raise CourierError(f"pgbench failed: {last}")
    latency = _LATENCY.search(output)
    failed = _FAILED.search(output)
    processed = _PROCESSED.search(output)
    return PgbenchRun(float(tps[1]), float(latency[1]) if latency else 0.0,
                      int(failed[1]) if failed else 0, int(processed[1]) if processed else 0)


_PROGRESS = re.compile(
    r"^progress: ([0-9.]+) s, ([0-9.]+) tps, lat [0-9.]+ ms stddev [0-9.na]+(?:, \d+ failed)?(?:, lag ([0-9.]+) ms)?",
    re.MULTILINE)


@dataclass(frozen=True)
class Progress:
    """One second of a paced run: when, its rate, and how far behind its schedule it started
    transactions (pgbench's lag, from -R)."""

    at: float
    transactions_per_second: float
    lag_ms: float


def run_paced(dsn: str, script: str, *, clients: int, seconds: float, rate: float) -> list[Progress]:
    """Run `script` at `rate` transactions a second for `seconds`, and return pgbench's report of
    every second (-P 1)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "script.sql"
        path.write_text(script)
        path.chmod(0o644)
        Path(folder).chmod(0o755)
        command = [str(embedded.client_binary("pgbench")), "-n", "-M", "prepared", "-c", str(clients),
                   "-j", str(min(2, clients)), "-T", str(max(1, round(seconds))), "-R", f"{rate:g}", "-P", "1",
                   "-f", str(path)]
        done = _pgbench(command, dsn)
    output = done.stdout + done.stderr
    if done.returncode != 0:
        last = output.strip().splitlines()[-1] if output.strip() else f"exit {done.returncode}"
        raise CourierError(f"pgbench failed: {last}")
    return [Progress(float(m[1]), float(m[2]), float(m[3] or 0)) for m in _PROGRESS.finditer(output)]
