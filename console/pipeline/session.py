"""The SparkSession every pipeline job runs in: Java checked first, started lean for the job
at hand, Spark's log kept in a file of this run's own, the `courier` data source registered,
the phases timed (--verbose prints them) and progress on stderr."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import platformdirs

from sqlkit.errors import CourierError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"
JAVA_HINT = ("Install a Java 17 or 21 runtime (e.g. `apt install openjdk-17-jre-headless`) "
             "or point JAVA_HOME at one")
KEEP_LOGS = 20  # the newest run logs kept; older ones are removed when a run starts
# Up to this many input rows a job is small: its Spark starts for a short life and plans its
# shuffles as one partition. Above it, Spark starts for throughput and sizes them itself.
SMALL_INPUT_ROWS = 50_000
# JVM options for a short life: C1 only (C2 compiles for minutes of work a small job never
# does) and the serial collector (no GC threads competing for the cores). Measured on a fresh
# process's get_session + spark.range(1).count() in local[2] on 2 busy cores, median of 3: none
# 13.2 s, C1 only 9.5 s, serial GC only 12.9 s, both 8.6 s. -Xshare:auto (the JDK's own class
# data sharing) is already the default: adding it changed nothing (8.3 s).
FAST_START_JVM = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


class PipelineError(CourierError):
    """A pipeline job cannot run or did not finish; the message says why."""


def java_executable() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        return str(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None
    return shutil.which("java")


LOG_DIR_ENV = "COURIER_LOG_DIR"  # a folder of its own for the run logs (the test suite sets one)


def log_dir() -> Path:
    """Where each run's Spark log goes: $COURIER_LOG_DIR, else the user's log folder."""
    folder = Path(os.environ.get(LOG_DIR_ENV) or platformdirs.user_log_dir("courier"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def new_log_path(now: datetime | None = None, keep: int = KEEP_LOGS) -> Path:
    """This run's own Spark log, spark-YYYYmmdd-HHMMSS-<pid>.log; the oldest beyond `keep` go."""
    folder = log_dir()
    old = sorted(folder.glob("spark-*.log"), key=lambda p: p.stat().st_mtime)
    for stale in old[:max(0, len(old) - (keep - 1))]:
        with contextlib.suppress(OSError):
            stale.unlink()
    return folder / f"spark-{(now or datetime.now()):%Y%m%d-%H%M%S}-{os.getpid()}.log"


@dataclass
class Run:
    """One pipeline command: its Spark log file, its phases and their times, its clock. The
    log file is named (and the oldest pruned) only when Spark starts: a run answered without
    Spark leaves the log folder alone."""
    verbose: bool = False
    started: float = field(default_factory=time.perf_counter)
    phases: list[tuple[str, float]] = field(default_factory=list)
    _log_path: Path | None = field(default=None, repr=False)

    @property
    def log_path(self) -> Path:
        if self._log_path is None:
            self._log_path = new_log_path()
        return self._log_path

    @log_path.setter
    def log_path(self, path: Path) -> None:
        self._log_path = path

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            took = time.perf_counter() - began
            self.phases.append((name, took))
            if self.verbose:
                _say(f"  {took:6.2f} s  {name}")

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started


_current: Run | None = None
_session_log: Path | None = None  # the log file of the run that started the running JVM


def current_run() -> Run:
    """The run of the command in progress (one is made if none was started)."""
    global _current
    if _current is None:
        _current = Run()
    return _current


def start_run(verbose: bool = False) -> Run:
    global _current
    _current = Run(verbose=verbose)
    return _current


def phase(name: str) -> contextlib.AbstractContextManager[None]:
    """Times a step of the current run (printed under --verbose)."""
    return current_run().phase(name) if _current is not None else contextlib.nullcontext()


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _run_log_hint() -> str:
    return str(_current.log_path) if _current is not None else str(log_dir())


def get_session(master: str | None = None, *, verbose: bool = False,
                input_rows: int | None = None) -> SparkSession:
    """The running session if its master matches (tests share one), else a new one, started
    for the job at hand: input_rows (an estimate; None if unknown) up to SMALL_INPUT_ROWS
    starts it lean. Spark's own log goes to this run's log file."""
    global _session_log
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None and (master is None or active.sparkContext.master == master):
        if _session_log is not None:  # its JVM still writes to the log of the run that started it
            current_run().log_path = _session_log
        return active  # as it was started: its settings are its owner's
    if active is not None:
        active.stop()
    if java_executable() is None:
        raise PipelineError("Java was not found: the pipeline runs on Apache Spark, which needs a Java runtime",
                            hint=JAVA_HINT)
    run = current_run()
    _session_log = run.log_path
    with run.phase("start the JVM and the Py4J gateway"):
        from pyspark import SparkConf, SparkContext
        from pyspark.java_gateway import launch_gateway

        # Executors (local or on a cluster of this machine) run the same Python as the driver.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        small = small_input(input_rows)
        conf = SparkConf().setMaster(master or DEFAULT_MASTER).setAppName("courier pipeline")
        for key, value in session_conf(small, verbose).items():
            conf.set(key, value)
        if small:  # spark-submit's launcher is a JVM of its own, started before Spark's
            os.environ.setdefault("SPARK_LAUNCHER_OPTS", " ".join(FAST_START_JVM))
        with run.log_path.open("ab") as log_file:
            log_file.write(log_header(master or DEFAULT_MASTER, input_rows).encode())
            log_file.flush()
            try:
                gateway = launch_gateway(conf, popen_kwargs={"stdout": log_file, "stderr": log_file})
            except Exception as error:
                raise _did_not_start(error) from None
    with run.phase("start the SparkContext"):
        try:
            context = SparkContext(conf=conf, gateway=gateway)
        except Exception as error:
            raise _did_not_start(error) from None
        context.setLogLevel("WARN")  # into this run's log file, never the terminal
    with run.phase("start the SparkSession, register the courier data source"):
        session = SparkSession(context)
        register(session)
    return session


def log_header(master: str, input_rows: int | None) -> str:
    """The first lines of a run's log: what ran, and what the file holds."""
    import click

    context = click.get_current_context(silent=True)  # its name only: an option may hold a password
    command = context.command_path if context is not None else "a pipeline job (no command)"
    rows = "unknown" if input_rows is None else f"{input_rows:,}"
    return (f"# courier pipeline run: {command}\n"
            f"# started {datetime.now().astimezone():%Y-%m-%d %H:%M:%S %z}, pid {os.getpid()}, master {master}, "
            f"input rows {rows}\n"
            "# This file holds what the Spark JVM of this run printed (its start-up banner) and Spark's own\n"
            "# warnings and errors (log4j, level WARN), then any failed job's whole error as Python saw it.\n")


def append_to_log(text: str) -> None:
    """Adds a note to the current run's log, if Spark started and so made one."""
    run = _current
    if run is None or run._log_path is None:
        return
    with contextlib.suppress(OSError), run._log_path.open("a", encoding="utf-8") as log_file:
        log_file.write(text if text.endswith("\n") else text + "\n")


def _did_not_start(error: Exception) -> PipelineError:
    first = (str(error).strip().splitlines() or [type(error).__name__])[0]
    append_to_log(f"# Spark did not start ({type(error).__name__}):\n{error}")
    return PipelineError(f"Spark did not start: {first}", hint=f"Spark's log of this run: {_run_log_hint()}")


def session_conf(small: bool, verbose: bool) -> dict[str, str]:
    """What a session starts with: no UI, Arrow on, UTC. For a small job also a JVM that starts
    fast, shuffles in one partition without adaptive query execution's extra job per shuffle
    stage, and no whole-stage code generation; for a large or unknown one, shuffles that
    adaptive execution sizes and generated code."""
    log4j = resources.files("console.pipeline").joinpath("log4j2-quiet.properties")
    java = [f"-Dlog4j2.configurationFile=file:{log4j}", "-Dcourier.log.level=warn"]
    if small:
        java += FAST_START_JVM
    return {
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.python.filterPushdown.enabled": "true",
        "spark.sql.shuffle.partitions": "1" if small else "8",
        "spark.sql.adaptive.enabled": "false" if small else "true",
        # A few thousand rows are evaluated faster than each stage's generated code compiles.
        "spark.sql.codegen.wholeStage": "false" if small else "true",
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.driver.memory": "1g",
        "spark.executor.memory": "1g",
        "spark.driver.extraJavaOptions": " ".join(java),
        "spark.executor.extraJavaOptions": " ".join(java[:2]),
    }


def small_input(input_rows: int | None) -> bool:
    return input_rows is not None and input_rows <= SMALL_INPUT_ROWS


def register(session: SparkSession) -> None:
    """Makes `spark.read.format("courier")` and `df.write.format("courier")` available."""
    from .source import CourierDataSource

    session.dataSource.register(CourierDataSource)


@dataclass(frozen=True)
class Done:
    """How far the Spark jobs started since a point are: stages and tasks, done and known."""
    jobs: int = 0
    stages: int = 0
    stages_done: int = 0
    tasks: int = 0
    tasks_done: int = 0


def job_ids(session: SparkSession) -> set[int]:
    return set(session.sparkContext.statusTracker().getJobIdsForGroup(None))


def done_since(session: SparkSession, before: set[int]) -> Done:
    """Spark's status tracker on the jobs not in `before`: a stage counts as done when all its
    tasks are, or when its job succeeded without running it (its output was reused)."""
    tracker = session.sparkContext.statusTracker()
    jobs = stages = stages_done = tasks = tasks_done = 0
    for job_id in set(tracker.getJobIdsForGroup(None)) - before:
        job = tracker.getJobInfo(job_id)
        if job is None:
            continue
        jobs += 1
        for stage_id in job.stageIds:
            stages += 1
            info = tracker.getStageInfo(stage_id)
            if info is None:  # not run: skipped, or not started yet
                stages_done += job.status == "SUCCEEDED"
                continue
            tasks += info.numTasks
            tasks_done += info.numCompletedTasks
            stages_done += info.numCompletedTasks >= info.numTasks
    return Done(jobs, stages, stages_done, tasks, tasks_done)


@contextlib.contextmanager
def progress(session: SparkSession, label: str, *, enabled: bool = True, console: Any = None,
             interval: float = 0.25) -> Iterator[None]:
    """A bar on stderr (when it is a terminal) fed by Spark's status tracker: the tasks of
    the stages started so far, done and known, and the stages done."""
    from rich.console import Console

    console = console or Console(stderr=True)
    if not enabled or not console.is_terminal:
        yield
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    before = job_ids(session)
    stop = threading.Event()
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("tasks"),
                   TextColumn("{task.fields[stages]}"), TimeElapsedColumn(), console=console, transient=True)
    task = bar.add_task(label, total=None, stages="")

    def poll() -> None:
        while not stop.wait(interval):
            with contextlib.suppress(Exception):  # the tracker is best effort; the job's error is not ours
                now = done_since(session, before)
                if now.tasks:
                    bar.update(task, total=now.tasks, completed=now.tasks_done,
                               stages=f"stage {now.stages_done}/{now.stages} of {now.jobs} job(s)")

    with bar:
        thread = threading.Thread(target=poll, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


def print_jobs(session: SparkSession, before: set[int] | None = None) -> None:
    """Each Spark job of this run with its time and tasks, from Spark's status store (--verbose)."""
    with contextlib.suppress(Exception):  # an internal API: best effort
        jobs = session.sparkContext._jsc.sc().statusStore().jobsList(None)
        found = []
        for index in range(jobs.size()):
            job = jobs.apply(index)
            if before is not None and job.jobId() in before:
                continue
            took = None
            if job.submissionTime().isDefined() and job.completionTime().isDefined():
                took = (job.completionTime().get().getTime() - job.submissionTime().get().getTime()) / 1000
            description = job.description().get() if job.description().isDefined() else job.name()
            found.append((job.jobId(), took, job.numTasks(), str(job.status()), description))
        for job_id, took, tasks, status, description in sorted(found):
            timing = f"{took:6.2f} s" if took is not None else "     - "
            _say(f"  {timing}    Spark job {job_id}: {description} ({tasks} task(s), {status.lower()})")


_TASK_ERROR = re.compile(r"(?:psycopg\.errors\.\w+|sqlkit\.errors\.\w+|ValueError|\w+Error): (.+)")


@contextlib.contextmanager
def one_line_errors() -> Iterator[None]:
    """A failed Spark job as one PipelineError line: the task's own error, not the JVM trace;
    its hint names this run's Spark log."""
    try:
        yield
    except CourierError:
        raise
    except Exception as error:
        module = type(error).__module__ or ""
        if not (module.startswith("pyspark") or module.startswith("py4j")):
            raise
        text = str(error)
        append_to_log(f"# {datetime.now():%H:%M:%S} the Spark job failed ({type(error).__name__}):\n{text}\n"
                      + "".join(traceback.format_exception(error)))
        reasons = [m.group(1).strip() for m in _TASK_ERROR.finditer(text)]
        reason = next((r for r in reversed(reasons) if "[courier]" in r), reasons[-1] if reasons else None)
        first = reason or (text.strip().splitlines() or [type(error).__name__])[0]
        raise PipelineError(f"the Spark job failed: {first.replace('[courier] ', '')}",
                            hint=f"Spark's log of this run: {_run_log_hint()}") from None
