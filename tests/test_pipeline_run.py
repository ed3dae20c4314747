"""What a user sees of a pipeline run: its own Spark log file, named when a job fails; the
phases and their times under --verbose; the final line with rows and time; progress fed by
Spark's status tracker; one line naming the extra when pyspark is not installed. The small
input path (the archive read in the driver) gives the rows the data source gives."""

from __future__ import annotations

import importlib.util
import io
import os
import re
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.test_pipeline import archive_dsn, seed_archive, spark  # noqa: F401 - shared fixtures

pytest.importorskip("pyspark")

from console.pipeline import session as run_session

LOG_NAME = re.compile(r"spark-\d{8}-\d{6}-\d+\.log")


def _pipeline(*args: str):
    from console.cli.pipeline import pipeline_group

    return CliRunner().invoke(pipeline_group, [*args, "--master", "local[2]"])


def test_each_run_logs_to_a_file_of_its_own_and_old_ones_are_pruned(tmp_path, monkeypatch):
    monkeypatch.setattr(run_session, "log_dir", lambda: tmp_path)
    for n in range(5):
        old = tmp_path / f"spark-2026010{n}-000000-{100 + n}.log"
        old.write_text("old run\n")
        os.utime(old, (1_700_000_000 + n, 1_700_000_000 + n))
    path = run_session.new_log_path(keep=3)
    assert LOG_NAME.fullmatch(path.name) and str(os.getpid()) in path.name
    # With this run's file, three are kept: the two newest old ones and this one.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spark-20260103-000000-103.log",
                                                          "spark-20260104-000000-104.log"]


def test_a_failed_job_names_this_runs_log_file(spark, dsn, tmp_path):  # noqa: F811
    folder = tmp_path / "not-an-export"
    folder.mkdir()
    spark.createDataFrame([(1,)], "x int").write.parquet(str(folder / "part"))
    result = _pipeline("replay", "--from", str(folder), "--dry-run", "--dsn", dsn)
    assert result.exit_code == 1
    error = result.exception
    assert isinstance(error, run_session.PipelineError) and "the Spark job failed" in str(error)
    named = Path(re.search(r"Spark's log of this run: (\S+)", error.one_line()).group(1))
    assert LOG_NAME.fullmatch(named.name) and named.parent == run_session.log_dir()
    assert named.exists()  # the file the JVM of this session writes its log to
    assert named == run_session.current_run().log_path


def test_verbose_prints_the_phases_and_every_command_ends_with_rows_and_time(spark, archive_dsn,  # noqa: F811
                                                                             monkeypatch):
    quiet = _pipeline("replay", "--dry-run", "--dsn", archive_dsn)
    assert quiet.exit_code == 0, quiet.output
    assert re.search(r"replay \(dry run\): 3,000 row\(s\) in \d+\.\d s\n$", quiet.stderr)
    assert "Spark job" not in quiet.stderr and " s  " not in quiet.stderr

    monkeypatch.setenv("COURIER_PIPELINE_TINY_ROWS", "0")  # 3,000 rows would be aggregated in SQL, without Spark
    verbose = _pipeline("analytics", "--dsn", archive_dsn, "--verbose")
    assert verbose.exit_code == 0, verbose.output
    phases = re.findall(r"^ +(\d+\.\d\d) s  (.+)$", verbose.stderr, re.MULTILINE)
    names = [name for _, name in phases]
    assert "count the archive's rows in range (SQL)" in names
    assert "analytics: read the archive here, in the driver" in names  # 3,000 rows: a small input
    assert {"analytics: summary (Spark job)", "analytics: hourly (Spark job)", "analytics: attempts (Spark job)",
            "analytics: errors (Spark job)", "analytics: store the results in PostgreSQL"} <= set(names)
    for job in ("summary", "hourly", "attempts", "errors"):  # each Spark job with its time
        assert any(re.fullmatch(rf"Spark job \d+: analytics: {job} \(\d+ task\(s\), succeeded\)", n.strip())
                   for n in names), names
    assert verbose.stderr.rstrip().splitlines()[-1].startswith("analytics: 3,000 row(s) in ")


def test_the_progress_bar_follows_spark_s_status_tracker(spark):  # noqa: F811
    from rich.console import Console

    def slow(rows):
        time.sleep(0.4)
        return [sum(1 for _ in rows)]

    before = run_session.job_ids(spark)
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with run_session.progress(spark, "counting slowly", console=console, interval=0.05):
        assert sum(spark.sparkContext.parallelize(range(40), 4).mapPartitions(slow).collect()) == 40
    done = run_session.done_since(spark, before)
    assert (done.jobs, done.stages, done.stages_done, done.tasks, done.tasks_done) == (1, 1, 1, 4, 4)
    drawn = out.getvalue()
    assert "counting slowly" in drawn and "tasks" in drawn and "stage" in drawn and re.search(r"\d/4", drawn)
    assert not run_session.done_since(spark, run_session.job_ids(spark)).jobs  # nothing new since


def test_the_small_path_reads_what_the_data_source_reads(spark, archive_dsn):  # noqa: F811
    from console.pipeline.source import load

    options = {"dsn": archive_dsn, "table": "archive", "since": "2026-09-01T00:00:00+00:00"}
    through_spark = load(spark, options)
    in_driver = load(spark, options, local=True)
    assert in_driver.schema == through_spark.schema
    assert sorted(in_driver.collect()) == sorted(through_spark.collect())
    assert in_driver.count() > 1000


def test_without_pyspark_every_pipeline_command_names_the_extra(dsn, tmp_path, monkeypatch):
    from console.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name.split(".")[0] == "pyspark" else real(name, *a, **k))
    source = tmp_path / "rows.jsonl"
    source.write_text('{"n": 1}\n')
    for args in (["pipeline", "analytics"], ["pipeline", "export", "--before", "2026-01-01", "--to", str(tmp_path)],
                 ["pipeline", "replay", "--dry-run"], ["pipeline", "ingest", str(source), "--endpoint", "x"],
                 ["bench", "spark"]):
        result = CliRunner().invoke(main, [*args, "--dsn", dsn])
        assert result.exit_code == 1, (args, result.output)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "pip install 'courier[spark]'" in lines[0] and "pyspark" in lines[0], lines


def test_replay_from_a_folder_without_parquet_says_so_before_spark_starts(tmp_path):
    started = time.monotonic()
    result = _pipeline("replay", "--from", str(tmp_path), "--endpoint", "billing", "--dry-run",
                       "--dsn", "postgresql://nobody@127.0.0.1:1/none")
    assert isinstance(result.exception, run_session.PipelineError)  # the CLI prints it as one line, exit 1
    assert result.exception.message == f"{tmp_path} holds no Parquet files: nothing to replay"
    assert time.monotonic() - started < 3  # no Spark, no database: the folder is checked first
