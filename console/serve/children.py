"""Child processes `courier serve` keeps running beside itself (its `--workers` pool, its
`--processes` siblings): each restarted when it dies, after the pause `courier worker` gives its
pools (growing while it keeps dying young), and every exit logged; stopped with SIGTERM, and
killed if it will not go."""

from __future__ import annotations

import logging
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence

from console.workers.processes import HEALTHY_AFTER, restart_pause

log = logging.getLogger("courier.serve")



class Supervised:
    """`argv` run as a child, kept running until stop()."""

    def __init__(self, name: str, argv: Sequence[str], env: Mapping[str, str]) -> None:
        self.name = name
        self._argv, self._env = list(argv), dict(env)
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # no child is started once stop() has begun
        self._process: subprocess.Popen[bytes] | None = None
        self._thread = threading.Thread(target=self._keep_running, name=f"supervise-{name}", daemon=True)

    def start(self) -> Supervised:
        self._thread.start()
        return self

    def _keep_running(self) -> None:
        failures = 0
        while True:
            with self._lock:
                if self._stopping.is_set():
                    return
                started = time.monotonic()
                try:
                    self._process = subprocess.Popen(self._argv, env=self._env)
                except OSError as error:
                    self._process = None
                    log.error(f"{self.name} could not start", extra={"error": str(error)})
            code = self._process.wait() if self._process is not None else None
            if self._stopping.is_set():
                return
            failures = 1 if time.monotonic() - started >= HEALTHY_AFTER else failures + 1
            pause = restart_pause(failures)
            log.warning(f"{self.name} exited; restarting it", extra={
                "exit_code": code, "signal": _signal_name(code), "restart_in_seconds": pause})
            if self._stopping.wait(pause):
                return

    def request_stop(self) -> None:
        """SIGTERM, once, and no restart after it (stop() then waits for it). Once: a second
        SIGTERM could reach the child while it closes its event loop."""
        with self._lock:
            first = not self._stopping.is_set()
            self._stopping.set()
            process = self._process
        if first and process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)

    def stop(self, timeout: float) -> None:
        """SIGTERM, then SIGKILL after `timeout` seconds; no restart after it."""
        self.request_stop()
        process = self._process
        if process is not None and process.poll() is None:
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                log.warning(f"{self.name} did not stop in {timeout:g} s; killed")
                process.kill()
                process.wait()
        self._thread.join(timeout=5)


def _signal_name(code: int | None) -> str | None:
    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return None
