"""Instructions a PostgreSQL backend executes, counted by valgrind's callgrind: a figure of the
work a statement makes the server do that no machine's load, clock or cache can blur.

A private throwaway cluster is made in a temporary folder (initdb, the local PostgreSQL's own
binaries), prepared while it runs normally, then started again under
`valgrind --tool=callgrind --trace-children=yes`, so that every backend it forks writes the
count of its own instructions when it exits. What a piece of work costs is the count of a
backend that ran it, less that of a backend that ran only its warm-up (see cost.py).

Where valgrind or the server's binaries are missing, or only root could run them and there is no
`postgres` account to run them as, `unavailable()` says why and nothing is measured.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg

from sqlkit.connection import connect

from .scratch import free_port

SERVER_USER = "postgres"            # initdb's superuser, and the account the server runs as under root
START_TIMEOUT = 120.0               # under valgrind the postmaster takes 10-20 s to accept connections
DUMP_TIMEOUT = 120.0                # a backend's count is written as it exits
SETTINGS = {
    # Nothing but the measured work runs in its backend; autovacuum would change what it finds
    # (pruned pages, fresh statistics) at moments no run can repeat.
    "autovacuum": "off",
    "jit": "off",
    # A commit's WAL is still written and flushed through the same code, only without the
    # fsync system call, whose waits (not instructions: valgrind counts none in the kernel)
    # would make single-message runs several times longer.
    "fsync": "off",
}
# Counted from the backend's entry into PostgresMain (an exported symbol, found in stripped
# binaries too): a forked backend otherwise inherits the postmaster's count up to the fork,
# which grows with every connection the server has accepted.
COLLECT = ("--collect-atstart=no", "--toggle-collect=PostgresMain")
_TOTAL = re.compile(rb"^(?:summary|totals):\s*(\d+)", re.MULTILINE)


def valgrind() -> str | None:
    return shutil.which("valgrind")


def server_bindir() -> Path | None:
    """The folder of `postgres`, `initdb` and `pg_ctl`: `pg_config --bindir` of the pg_config on
    PATH, else the newest /usr/lib/postgresql/<version>/bin."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=True, timeout=10)
            candidates.append(Path(out.stdout.strip()))
    versions = Path("/usr/lib/postgresql")
    if versions.is_dir():
        numbered = [p for p in versions.iterdir() if p.name.replace(".", "").isdigit()]
        candidates += [p / "bin" for p in sorted(numbered, key=lambda p: float(p.name), reverse=True)]
    for folder in candidates:
        if all(os.access(folder / name, os.X_OK) for name in ("postgres", "initdb", "pg_ctl")):
            return folder
    return None


def _server_account() -> pwd.struct_passwd | None:
    """The account to run the server as when this process is root (PostgreSQL refuses root)."""
    if os.geteuid() != 0:
        return None
    return pwd.getpwnam(SERVER_USER)


def unavailable() -> str | None:
    """Why instructions cannot be counted on this machine, or None when they can."""
    if not hasattr(os, "geteuid"):
        return "instructions need valgrind and a Unix-like system"
    if valgrind() is None:
        return "instructions not measured: valgrind is not installed"
    if server_bindir() is None:
        return ("instructions not measured: no PostgreSQL server binaries (pg_config --bindir, "
                "/usr/lib/postgresql/*/bin)")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            return (f"instructions not measured: running as root, and there is no '{SERVER_USER}' account "
                    "to run PostgreSQL as")
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie has exited: its count is written.
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


@dataclass
class Cluster:
    """A running callgrind'd server of its own: `dsn` reaches its one database."""

    dsn: str
    folder: Path
    version: str = ""

    def instructions(self, work: Callable[[psycopg.Connection], None]) -> int:
        """Instructions of a whole backend (start, `work` on its connection, exit)."""
        with connect(self.dsn) as conn:
            pid = conn.info.backend_pid
            work(conn)
        return self._count(pid)

    def _count(self, pid: int) -> int:
        path = self.folder / f"cg.{pid}"
        deadline = time.monotonic() + DUMP_TIMEOUT
        while True:
            # Written at exit: complete once the process is gone and its total is in the file.
            if not _alive(pid) and path.exists():
                found = _TOTAL.findall(path.read_bytes())
                if found:
                    path.unlink()
                    return int(found[-1])
            if time.monotonic() > deadline:
                raise TimeoutError(f"callgrind wrote no count for backend {pid} in {DUMP_TIMEOUT:.0f} s")
            time.sleep(0.05)


def _as_server(account: pwd.struct_passwd | None) -> dict[str, object]:
    """Popen arguments running a program as the server's account (when root) in a session of
    its own, so a Ctrl-C at the terminal reaches only this process, which then stops it."""
    extra: dict[str, object] = {"start_new_session": True}
    if account is not None:
        extra.update(user=account.pw_uid, group=account.pw_gid, extra_groups=[],
                     env={**os.environ, "HOME": account.pw_dir, "USER": account.pw_name, "LOGNAME": account.pw_name})
    return extra


def _run(command: list[str], account: pwd.struct_passwd | None) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False, **_as_server(account))
    if done.returncode:
        output = (done.stderr or done.stdout).strip()
        raise RuntimeError(f"{Path(command[0]).name} failed ({done.returncode}): {output}")


def _options(port: int, sockets: Path) -> list[str]:
    settings = {"listen_addresses": "127.0.0.1", "unix_socket_directories": str(sockets), **SETTINGS}
    return [arg for name, value in settings.items() for arg in ("-c", f"{name}={value}")] + ["-p", str(port)]


def _wait_ready(dsn: str, server: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        try:
            with psycopg.connect(dsn, connect_timeout=5):
                return
        except psycopg.OperationalError:
            if server.poll() is not None:
                raise RuntimeError(f"the server under valgrind exited ({server.returncode}): "
                                   f"{log.read_text(errors='replace')[-2000:]}") from None
            if time.monotonic() > deadline:
                raise TimeoutError("the server under valgrind did not accept connections "
                                   f"in {START_TIMEOUT:.0f} s") from None
            time.sleep(0.5)


@contextlib.contextmanager
def cluster(prepare: Callable[[str], None]) -> Iterator[Cluster]:
    """A private cluster, set up by `prepare(dsn)` while it runs normally, then running under
    callgrind until the block ends; stopped and removed whatever happens."""
    reason = unavailable()
    if reason:
        raise RuntimeError(reason)
    bindir, account = server_bindir(), _server_account()
    assert bindir is not None
    folder = Path(tempfile.mkdtemp(prefix="courier-bench-instructions-"))
    server: subprocess.Popen[bytes] | None = None
    try:
        if account is not None:
            os.chown(folder, account.pw_uid, account.pw_gid)
        data, log, port = folder / "data", folder / "server.log", free_port()
        dsn = f"host=127.0.0.1 port={port} user={SERVER_USER} dbname=postgres"
        _run([str(bindir / "initdb"), "-D", str(data), "-U", SERVER_USER, "-A", "trust", "-E", "UTF8",
              "--locale=C", "--no-sync"], account)
        options = _options(port, folder)
        _run([str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "60",
              "-o", " ".join(options), "start"], account)
        try:
            prepare(dsn)
        finally:
            _run([str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"], account)
        # --vgdb=no: PostgreSQL rewrites its environment for the process title, and valgrind's
        # gdbserver, looking for its FIFO there, then crashes the backend.
        with log.open("ab") as out:
            server = subprocess.Popen(
                [valgrind() or "valgrind", "--tool=callgrind", "--vgdb=no", "--trace-children=yes", *COLLECT,
                 f"--callgrind-out-file={folder}/cg.%p", "--log-file=" + str(folder / "valgrind.%p.log"),
                 str(bindir / "postgres"), "-D", str(data), *options],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, **_as_server(account))
        _wait_ready(dsn, server, log)
        # A first backend after a start writes the relation cache's init files, which the
        # backends measured then read: this one does it, and is not counted.
        with connect(dsn) as conn:
            version = conn.execute("SELECT current_setting('server_version') FROM pg_class LIMIT 1").fetchone()[0]
        yield Cluster(dsn, folder, version.split()[0])
    finally:
        if server is not None:
            _stop(server)
        shutil.rmtree(folder, ignore_errors=True)


def _stop(server: subprocess.Popen[bytes]) -> None:
    """Fast shutdown (SIGINT to the postmaster); SIGKILL if it does not end within a minute."""
    if server.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGKILL)
            server.wait()
