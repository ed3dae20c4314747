"""courier pipeline export and replay, in Spark local mode: the Parquet round trip verified,
drop only after verification, resume after an interruption, replay from Parquet twice."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest

from console.pipeline import export
from tests.test_pipeline import archive_dsn, seed_archive, spark  # noqa: F401 - shared fixtures

BEFORE = datetime(2026, 10, 1, tzinfo=UTC)


def _partitions(conn: psycopg.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT partition_name FROM courier.archive_partitions()").fetchall()}


def test_export_round_trip_is_verified_then_dropped(spark, archive_dsn, conn, tmp_path):  # noqa: F811
    per_month = dict(conn.execute(
        "SELECT to_char(created_at, 'YYYY-MM'), count(*) FROM courier.archive GROUP BY 1").fetchall())
    done = export.run(spark, archive_dsn, BEFORE, tmp_path, drop=True)
    assert [(m.month, m.rows, m.state, m.dropped) for m in done] == [
        ("2026-08", per_month["2026-08"], "exported", True), ("2026-09", per_month["2026-09"], "exported", True)]
    assert {"archive_2026_08", "archive_2026_09"}.isdisjoint(_partitions(conn))
    assert conn.execute("SELECT count(*) FROM courier.archive").fetchone()[0] == per_month["2026-10"]

    files = spark.read.parquet(str(tmp_path))
    assert files.count() == per_month["2026-08"] + per_month["2026-09"]
    assert sorted(p.name for p in (tmp_path / "month=2026-08").iterdir() if p.is_dir()) == [
        "endpoint=audit", "endpoint=billing", "endpoint=shipping"]
    manifest = json.loads((tmp_path / "month=2026-08" / export.MANIFEST).read_text())
    assert manifest["rows"] == per_month["2026-08"] and manifest["checksum"] == done[0].checksum
    assert export.frame_checksum(spark.read.parquet(str(tmp_path / "month=2026-08"))) \
        == (manifest["rows"], manifest["checksum"])
    again = export.run(spark, archive_dsn, BEFORE, tmp_path, drop=True)
    assert [m.state for m in again] == []  # nothing left before October


def test_a_failed_verification_drops_nothing(spark, archive_dsn, conn, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setattr(export, "frame_checksum", lambda df: (df.count() - 1, "0"))
    with pytest.raises(export.PipelineError, match="did not verify"):
        export.run(spark, archive_dsn, BEFORE, tmp_path, drop=True)
    assert {"archive_2026_08", "archive_2026_09"} <= _partitions(conn)
    assert not list(tmp_path.iterdir())
    assert conn.execute("SELECT count(*) FROM courier.archive_exports").fetchone()[0] == 0


def test_an_interrupted_export_resumes(spark, archive_dsn, conn, tmp_path, monkeypatch):  # noqa: F811
    published = export._publish
    calls = []

    def crash_on_second(staging: Path, final: Path, manifest: dict) -> None:
        calls.append(manifest["month"])
        if len(calls) == 2:  # the process dies with September's files written but unverified
            raise KeyboardInterrupt
        published(staging, final, manifest)

    monkeypatch.setattr(export, "_publish", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        export.run(spark, archive_dsn, BEFORE, tmp_path)
    assert list(tmp_path.glob(".staging-*")) and not (tmp_path / "month=2026-09").exists()
    monkeypatch.setattr(export, "_publish", published)

    done = export.run(spark, archive_dsn, BEFORE, tmp_path, drop=True)
    assert [(m.month, m.state) for m in done] == [("2026-08", "already exported"), ("2026-09", "exported")]
    assert not list(tmp_path.glob(".staging-*"))
    total = conn.execute("SELECT sum(rows) FROM courier.archive_exports WHERE dropped_at IS NOT NULL").fetchone()[0]
    assert spark.read.parquet(str(tmp_path)).count() == total


def test_replay_from_parquet_with_a_json_predicate_twice_enqueues_once(spark, archive_dsn, conn, tmp_path):  # noqa: F811
    from click.testing import CliRunner

    from console.cli.pipeline import pipeline_group

    export.run(spark, archive_dsn, BEFORE, tmp_path, drop=True)
    billing = conn.execute("SELECT id FROM courier.endpoints WHERE name = 'billing'").fetchone()[0]
    want = conn.execute("SELECT count(*) FROM courier.archive_exports").fetchone()[0]
    assert want == 2
    expected = sorted(json.loads(r.payload)["i"] for r in spark.read.parquet(str(tmp_path)).collect()
                      if r.endpoint == "billing" and json.loads(r.payload)["order"]["total"] > 100
                      and r.status == "completed")
    assert expected

    args = ["replay", "--dsn", archive_dsn, "--master", "local[2]", "--from", str(tmp_path), "--endpoint", "billing",
            "--status", "completed", "--where", "$.order.total > 100", "--json"]
    runner = CliRunner()
    dry = runner.invoke(pipeline_group, [*args, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.stdout)["matched"] == len(expected)
    assert conn.execute("SELECT count(*) FROM courier.queue").fetchone()[0] == 0

    first = runner.invoke(pipeline_group, args)
    second = runner.invoke(pipeline_group, args)
    assert first.exit_code == second.exit_code == 0, first.output + second.output
    assert (json.loads(first.stdout)["enqueued"], json.loads(second.stdout)["enqueued"]) == (len(expected), 0)
    queued = conn.execute("SELECT endpoint_id, (payload->>'i')::int FROM courier.queue ORDER BY 2").fetchall()
    assert [i for _, i in queued] == expected and {e for e, _ in queued} == {billing}
    again = runner.invoke(pipeline_group, [*args, "--dry-run"])
    assert json.loads(again.stdout)["already_replayed"] == len(expected)


def test_replay_from_the_archive_agrees_with_postgres_jsonpath(spark, archive_dsn, conn):  # noqa: F811
    from console.pipeline import replay

    selection = replay.Selection(endpoints=("billing",), where=('$.order.currency == "EUR"', "$.order.total <= 40"))
    result = replay.run(spark, archive_dsn, selection)
    want = conn.execute("SELECT count(*) FROM courier.archive a JOIN courier.endpoints e ON e.id = a.endpoint_id "
                        "WHERE e.name = 'billing' AND a.payload @@ '$.order.currency == \"EUR\"' "
                        "AND a.payload @@ '$.order.total <= 40'").fetchone()[0]
    assert result.matched == result.enqueued == want > 0
    assert replay.run(spark, archive_dsn, selection).enqueued == 0
    assert conn.execute("SELECT count(*) FROM courier.queue").fetchone()[0] == want


def test_pipeline_and_archive_replays_of_one_message_enqueue_one_copy_unless_again(spark, archive_dsn, conn):  # noqa: F811
    """One rule for every replay: replay-message, `courier pipeline replay` and `courier
    archive replay` of the same archived message enqueue it once; --again a fresh copy."""
    from console.pipeline import replay

    selection = replay.Selection(endpoints=("billing",), where=('$.order.currency == "EUR"', "$.order.total <= 40"))
    picked = [r[0] for r in conn.execute(
        "SELECT a.id FROM courier.archive a JOIN courier.endpoints e ON e.id = a.endpoint_id WHERE e.name = 'billing' "
        "AND a.payload @@ '$.order.currency == \"EUR\"' AND a.payload @@ '$.order.total <= 40' ORDER BY 1")]
    assert len(picked) > 1
    conn.execute("SELECT courier.replay_message(%s)", (picked[0],))

    assert replay.run(spark, archive_dsn, selection, dry_run=True).would_enqueue == len(picked) - 1
    done = replay.run(spark, archive_dsn, selection)
    assert (done.matched, done.already_replayed, done.enqueued) == (len(picked), 1, len(picked) - 1)
    billing = conn.execute("SELECT id, count(*) FROM courier.archive WHERE endpoint_id = "
                           "(SELECT id FROM courier.endpoints WHERE name = 'billing') GROUP BY 1").fetchall()
    ranged = conn.execute("SELECT courier.replay_range(e.id, '2000-01-01', '2100-01-01') FROM courier.endpoints e "
                          "WHERE e.name = 'billing'").fetchone()[0]
    assert ranged == len(billing) - len(picked)
    copies = dict(conn.execute("SELECT (metadata ->> 'replayed_from')::bigint, count(*) FROM courier.queue "
                               "GROUP BY 1").fetchall())
    assert sorted(copies) == sorted(i for i, _ in billing) and set(copies.values()) == {1}
    unrecorded = "SELECT count(*) FROM courier.replayed_messages WHERE message_id IS NULL"
    assert conn.execute(unrecorded).fetchone()[0] == 0  # every copy's id is known, whoever made it

    fresh = replay.run(spark, archive_dsn, selection, again=True)
    assert (fresh.already_replayed, fresh.enqueued) == (len(picked), len(picked))
    again = dict(conn.execute("SELECT (metadata ->> 'replayed_from')::bigint, count(*) FROM courier.queue "
                              "WHERE (metadata ->> 'replayed_from')::bigint = ANY (%s) GROUP BY 1", (picked,)))
    assert again == {i: 2 for i in picked}


def test_a_replayed_message_keeps_every_field(spark, archive_dsn, conn):  # noqa: F811
    from console.pipeline import replay

    picked = conn.execute(
        "UPDATE courier.archive SET headers = '{\"X-Tenant\": \"acme\"}', metadata = '{\"source\": \"shop\"}', "
        "ordering_key = 'customer-1', idempotency_key = 'once-' || id, expires_at = created_at + interval '1 day' "
        "WHERE correlation_id IS NOT NULL AND status = 'completed' AND id % 300 = 0 "
        "RETURNING id, correlation_id, priority, payload").fetchall()
    assert len({month for month, in conn.execute(
        "SELECT DISTINCT date_trunc('month', created_at) FROM courier.archive WHERE id = ANY(%s)",
        ([id_ for id_, *_ in picked],)).fetchall()}) > 1  # read by several Spark tasks
    selection = replay.Selection(correlation_ids=tuple(str(c) for _, c, _, _ in picked))
    assert replay.run(spark, archive_dsn, selection).enqueued == len(picked)
    queued = conn.execute("SELECT payload, priority, headers, metadata, ordering_key, correlation_id, "
                          "idempotency_key, expires_at, scheduled_at FROM courier.queue ORDER BY id").fetchall()
    assert queued == [(payload, priority, {"X-Tenant": "acme"}, {"source": "shop", "replayed_from": id_},
                       "customer-1", correlation, None, None, None)
                      for id_, correlation, priority, payload in sorted(picked)]  # one ordering key: archive order


def test_replay_predicates_are_typed_on_the_archive_and_on_parquet(spark, archive_dsn, conn, tmp_path):  # noqa: F811
    from console.pipeline import replay

    conn.execute("INSERT INTO courier.archive (id, endpoint_id, payload, status, completed_at, created_at) "
                 "SELECT 90000 + n, (SELECT id FROM courier.endpoints WHERE name = 'audit'), "
                 "jsonb_build_object('total', CASE WHEN n = 1 THEN to_jsonb('10'::text) ELSE to_jsonb(10) END), "
                 "'completed', timestamptz '2026-08-02', timestamptz '2026-08-02' FROM generate_series(1, 2) n")
    export.run(spark, archive_dsn, BEFORE, tmp_path)
    for source in (None, tmp_path):
        matched = {text: replay.run(spark, archive_dsn, replay.Selection(endpoints=("audit",), where=(text,)),
                                    source, dry_run=True).matched
                   for text in ("$.total == 10", '$.total == "10"', "$.total >= 9")}
        assert matched == {"$.total == 10": 1, '$.total == "10"': 1, "$.total >= 9": 1}, source


def test_an_export_killed_mid_run_resumes_and_never_drops_an_unverified_month(spark, archive_dsn, conn, tmp_path):  # noqa: F811
    """kill -9 of `courier pipeline export --drop` (and its Spark JVM) while September is
    being written: August stays exported, September is neither published nor dropped, and
    a second run clears the unverified files and finishes the job."""
    import os
    import signal
    import subprocess
    import sys
    import time

    per_month = dict(conn.execute(
        "SELECT to_char(created_at, 'YYYY-MM'), count(*) FROM courier.archive GROUP BY 1").fetchall())
    out = tmp_path / "cold"
    command = [sys.executable, "-c", "from console.cli import main; main()", "pipeline", "export", "--dsn",
               archive_dsn, "--before", "2026-10-01", "--to", str(out), "--drop", "--master", "local[1]"]
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not list(out.glob(".staging-month=2026-09-*")):
            assert job.poll() is None, "the export finished before it could be killed: " + job.stdout.read().decode()
            assert time.monotonic() < deadline, "the export never started on September"
            time.sleep(0.01)
        os.killpg(job.pid, signal.SIGKILL)  # the CLI and the JVM it started
        job.wait(timeout=30)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        job.stdout.close()

    exports = {month.strftime("%Y-%m"): (rows, checksum, dropped is not None) for month, rows, checksum, dropped in
               conn.execute("SELECT month, rows, checksum, dropped_at FROM courier.archive_exports").fetchall()}
    assert "2026-09" not in exports and not (out / "month=2026-09").exists()
    assert "archive_2026_09" in _partitions(conn)  # September was never verified, so never dropped
    manifest = json.loads((out / "month=2026-08" / export.MANIFEST).read_text())
    assert manifest["rows"] == per_month["2026-08"]
    assert exports["2026-08"][:2] == (manifest["rows"], manifest["checksum"])
    assert exports["2026-08"][2] and "archive_2026_08" not in _partitions(conn)  # verified, recorded, dropped

    again = export.run(spark, archive_dsn, BEFORE, out, drop=True)  # what the command runs, in this session
    assert [(m.month, m.state, m.dropped) for m in again] == [("2026-09", "exported", True)]
    assert not list(out.glob(".staging-*"))
    assert "archive_2026_09" not in _partitions(conn)
    for month in ("2026-08", "2026-09"):
        assert export.frame_checksum(spark.read.parquet(str(out / f"month={month}")))[0] == per_month[month]
