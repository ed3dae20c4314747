"""The SparkSession every pipeline job runs in: Java checked first, Spark's log noise kept
in a log file unless --verbose, the `courier` data source registered, progress on stderr."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import threading
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import platformdirs

from sqlkit.errors import CourierError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"
JAVA_HINT = ("Install a Java 17 or 21 runtime (e.g. `apt install openjdk-17-jre-headless`) "
             "or point JAVA_HOME at one")


class PipelineError(CourierError):
    """A pipeline job cannot run or did not finish; the message says why."""


def java_executable() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        return str(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None
    return shutil.which("java")


def spark_log_path() -> Path:
    folder = Path(platformdirs.user_log_dir("courier"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder / "spark.log"


def get_session(master: str | None = None, *, verbose: bool = False) -> SparkSession:
    """The running session if its master matches (tests share one), else a new one."""
    try:
        from pyspark import SparkConf, SparkContext
        from pyspark.java_gateway import launch_gateway
        from pyspark.sql import SparkSession
    except ImportError as error:  # pragma: no cover - a broken install
        raise PipelineError(f"pyspark is not installed ({error})",
                            hint="Install Courier with `pip install -e '.[test]'`") from None

    active = SparkSession.getActiveSession()
    if active is not None and (master is None or active.sparkContext.master == master):
        return active
    if active is not None:
        active.stop()
    if java_executable() is None:
        raise PipelineError("Java was not found: the pipeline runs on Apache Spark, which needs a Java runtime",
                            hint=JAVA_HINT)
    # Executors (local or on a cluster of this machine) run the same Python as the driver.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

    conf = SparkConf().setMaster(master or DEFAULT_MASTER).setAppName("courier pipeline")
    for key, value in {
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.python.filterPushdown.enabled": "true",
        "spark.sql.shuffle.partitions": "8",
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.driver.memory": "1g",
        "spark.executor.memory": "1g",
    }.items():
        conf.set(key, value)
    popen: dict[str, object] = {}
    log_file = None
    if not verbose:
        quiet = resources.files("console.pipeline").joinpath("log4j2-quiet.properties")
        conf.set("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{quiet}")
        conf.set("spark.executor.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{quiet}")
        log_file = spark_log_path().open("ab")
        popen = {"stdout": log_file, "stderr": log_file}
    try:
        gateway = launch_gateway(conf, popen_kwargs=popen)
        context = SparkContext(conf=conf, gateway=gateway)
    except Exception as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise PipelineError(f"Spark did not start: {first}",
                            hint=f"Run again with --verbose, or read {spark_log_path()}") from None
    finally:
        if log_file is not None:
            log_file.close()
    if not verbose:
        context.setLogLevel("ERROR")
    session = SparkSession(context)
    register(session)
    return session


def register(session: SparkSession) -> None:
    """Makes `spark.read.format("courier")` and `df.write.format("courier")` available."""
    from .source import CourierDataSource

    session.dataSource.register(CourierDataSource)


@contextlib.contextmanager
def progress(session: SparkSession, label: str, *, enabled: bool = True) -> Iterator[None]:
    """Shows the running Spark stages' task counts on stderr while the block runs."""
    if not enabled or not sys.stderr.isatty():
        yield
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    tracker = session.sparkContext.statusTracker()
    stop = threading.Event()
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=Console(stderr=True), transient=True)
    task = bar.add_task(label, total=None)

    def poll() -> None:
        while not stop.wait(0.5):
            total = done = 0
            for stage_id in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage_id)
                if info is not None:
                    total += info.numTasks
                    done += info.numCompletedTasks
            if total:
                bar.update(task, total=total, completed=done)

    with bar:
        thread = threading.Thread(target=poll, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


_TASK_ERROR = re.compile(r"(?:psycopg\.errors\.\w+|sqlkit\.errors\.\w+|ValueError|\w+Error): (.+)")


@contextlib.contextmanager
def one_line_errors() -> Iterator[None]:
    """A failed Spark job as one PipelineError line: the task's own error, not the JVM trace."""
    try:
        yield
    except CourierError:
        raise
    except Exception as error:
        module = type(error).__module__ or ""
        if not (module.startswith("pyspark") or module.startswith("py4j")):
            raise
        text = str(error)
        reasons = [m.group(1).strip() for m in _TASK_ERROR.finditer(text)]
        reason = next((r for r in reversed(reasons) if "[courier]" in r), reasons[-1] if reasons else None)
        first = reason or (text.strip().splitlines() or [type(error).__name__])[0]
        raise PipelineError(f"the Spark job failed: {first.replace('[courier] ', '')}",
                            hint=f"Run again with --verbose for Spark's log ({spark_log_path()})") from None
