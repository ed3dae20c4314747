"""Issue 42, item 1: periodic schedules. A cron expression read in a time zone, a target, and
the message each tick sends; the maintenance leader sends each tick exactly once, with the tick
in the message, whatever the number of workers and leader changes; missed ticks follow the
schedule's catch-up policy. Against a real database, with real worker processes and the CLI."""

from __future__ import annotations

import itertools
import random
import threading
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from cronsim import CronSim

from tests.helpers import scalar
from tests.test_cli import run
from tests.workers import start_worker_process, wait_for


def ticks_sent(conn, schedule: str) -> list[str]:
    return [row[0] for row in conn.execute(
        "SELECT metadata ->> 'courier_tick' FROM courier.queue WHERE metadata ->> 'courier_schedule' = %s "
        "UNION ALL SELECT metadata ->> 'courier_tick' FROM courier.archive "
        "WHERE metadata ->> 'courier_schedule' = %s ORDER BY 1", (schedule, schedule))]


def missed(conn, schedule: str, minutes: int) -> None:
    """As if no leader had run for `minutes`: the schedule's next tick lies that far back."""
    conn.execute("UPDATE courier.schedules SET next_run_at = date_trunc('minute', now()) - make_interval(mins => %s) "
                 "WHERE name = %s", (minutes, schedule))


def run_due(conn) -> int:
    return scalar(conn, "SELECT courier.run_due_schedules()")


def _field(rnd: random.Random, low: int, high: int) -> str:
    kind = rnd.random()
    if kind < 0.3:
        return "*"
    if kind < 0.45:
        return f"*/{rnd.randint(1, 7)}"
    if kind < 0.65:
        return ",".join(str(rnd.randint(low, high)) for _ in range(rnd.randint(1, 3)))
    start = rnd.randint(low, high)
    if kind < 0.85:
        return f"{start}-{rnd.randint(start, high)}"
    return f"{start}/{rnd.randint(1, 5)}"


def test_the_next_and_previous_ticks_agree_with_cronsim(conn):
    """The SQL cron reader against cronsim (which the delete reaper's schedule already used), on
    random expressions of every field form, from random instants: 400 cases, read in UTC."""
    rnd = random.Random(42)
    checked = 0
    while checked < 400:
        cron = " ".join([_field(rnd, 0, 59), _field(rnd, 0, 23), _field(rnd, 1, 31), _field(rnd, 1, 12),
                         _field(rnd, 0, 7)])
        start = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=rnd.randint(0, 3_000_000),
                                                             seconds=rnd.randint(0, 59))
        try:
            expected = next(CronSim(cron, start))
        except Exception:  # a day that never comes: create_schedule refuses those (below)
            continue
        following = conn.execute("SELECT courier._cron_next(%s, 'UTC', %s)", (cron, start)).fetchone()[0]
        assert following == expected, cron
        assert conn.execute("SELECT courier._cron_prev(%s, 'UTC', %s)", (cron, following)).fetchone()[0] == following
        before = conn.execute("SELECT courier._cron_prev(%s, 'UTC', %s - interval '1 microsecond')",
                              (cron, following)).fetchone()[0]
        assert before is None or before <= start, cron
        checked += 1


def test_ticks_follow_the_clock_of_their_time_zone_across_daylight_saving(conn):
    berlin = [row[0] for row in conn.execute(
        "SELECT courier.cron_next_runs('30 2 * * *', 'Europe/Berlin', 3, '2026-03-28 12:00+00')")]
    # 02:30 does not happen on 29 March: the tick is at the same distance past the change.
    assert [t.isoformat() for t in berlin] == ["2026-03-29T01:30:00+00:00", "2026-03-30T00:30:00+00:00",
                                               "2026-03-31T00:30:00+00:00"]
    autumn = [row[0] for row in conn.execute(
        "SELECT courier.cron_next_runs('30 2 * * *', 'Europe/Berlin', 3, '2026-10-24 12:00+00')")]
    # 02:30 happens twice on 25 October: one tick.
    assert [t.isoformat() for t in autumn] == ["2026-10-25T01:30:00+00:00", "2026-10-26T01:30:00+00:00",
                                               "2026-10-27T01:30:00+00:00"]
    new_york = conn.execute("SELECT courier.cron_next_runs('0 9 * * 1-5', 'America/New_York', 1, "
                            "'2026-07-03 14:00+00')").fetchone()[0]  # Friday 10:00 EDT: next is Monday 09:00
    assert new_york.isoformat() == "2026-07-06T13:00:00+00:00"


@pytest.mark.parametrize(("arguments", "sqlstate", "field"), [
    ({"p_cron": "0 0 30 2 *"}, "22023", "cron"),
    ({"p_cron": "61 * * * *"}, "22023", "cron"),
    ({"p_cron": "@sometimes"}, "22023", "cron"),
    ({"p_cron": ""}, "22023", "cron"),
    ({"p_time_zone": "UTC+3"}, "22023", "time_zone"),
    ({"p_time_zone": "Mars/Olympus"}, "22023", "time_zone"),
    ({"p_endpoint_name": "nowhere"}, "42704", "endpoint"),
    ({"p_headers": '{"X-Bad": "a\\nb"}'}, "22023", "headers.X-Bad"),
    ({"p_metadata": "[1]"}, "22023", "metadata"),
    ({"p_priority": 11}, "22023", "priority"),
    ({"p_catch_up": "never"}, "22023", "catch_up"),
    ({"p_catch_up_limit": 0}, "22023", "catch_up_limit"),
    ({"p_grace_seconds": 0}, "22023", "grace_seconds"),
    ({"p_name": "bad name"}, "22023", "name"),
])
def test_create_refuses_what_could_never_tick_naming_the_field(conn, arguments, sqlstate, field):
    conn.execute("SELECT courier.create_endpoint('jobs', 'pull')")
    given = {"p_name": "nightly", "p_cron": "0 3 * * *", "p_endpoint_name": "jobs", **arguments}
    names = ", ".join(f"{name} => %({name})s" for name in given)
    with pytest.raises(psycopg.Error) as raised:
        conn.execute(f"SELECT courier.create_schedule({names})", given)
    assert raised.value.sqlstate == sqlstate
    assert raised.value.diag.column_name == field
    assert scalar(conn, "SELECT count(*) FROM courier.schedules") == 0


def test_a_due_tick_is_sent_once_with_its_time_and_a_key(conn):
    conn.execute("SELECT courier.create_endpoint('jobs', 'pull')")
    conn.execute("SELECT courier.create_schedule('minutely', '* * * * *', 'jobs', '{\"job\": \"sync\"}', "
                 "p_metadata => '{\"team\": \"ops\"}', p_priority => 3)")
    next_run = scalar(conn, "SELECT next_run_at FROM courier.schedules")
    assert next_run > scalar(conn, "SELECT now()")
    assert run_due(conn) == 0  # not due yet
    missed(conn, "minutely", 0)
    assert run_due(conn) == 1
    tick = scalar(conn, "SELECT date_trunc('minute', now())")
    row = conn.execute("SELECT payload, metadata, priority, idempotency_key FROM courier.queue").fetchone()
    assert row[0] == {"job": "sync"}
    assert row[1] == {"team": "ops", "courier_schedule": "minutely",
                      "courier_tick": tick.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
    assert row[2] == 3
    schedule_id = scalar(conn, "SELECT id FROM courier.schedules")
    assert row[3] == f"schedule:{schedule_id}:{row[1]['courier_tick']}"
    assert run_due(conn) == 0
    state = conn.execute("SELECT sent_ticks, skipped_ticks, last_tick_at, next_run_at > now() "
                         "FROM courier.schedules").fetchone()
    assert state == (1, 0, tick, True)
    # Handed the same tick again (as a second leader would be, had the first not moved
    # next_run_at on), the idempotency key keeps it to one message.
    missed(conn, "minutely", 0)
    assert run_due(conn) == 1
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 1


def test_catch_up_skip_sends_only_the_latest_missed_tick_within_grace(conn):
    conn.execute("SELECT courier.create_endpoint('jobs', 'pull')")
    conn.execute("SELECT courier.create_schedule('minutely', '* * * * *', 'jobs')")
    missed(conn, "minutely", 30)
    run_due(conn)
    assert ticks_sent(conn, "minutely") == [scalar(conn, "SELECT to_char(date_trunc('minute', now()) AT TIME ZONE "
                                                         "'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')")]
    assert scalar(conn, "SELECT skipped_ticks FROM courier.schedules") == 30
    event = scalar(conn, "SELECT details FROM courier.event_log WHERE event_type = 'schedule.ticks_skipped'")
    assert event["skipped"] == 30 and event["sent"] == 1 and event["catch_up"] == "skip"

    # A daily job whose tick is older than its grace waits for its next day.
    conn.execute("SELECT courier.create_schedule('daily', '0 3 * * *', 'jobs', p_grace_seconds => 60)")
    conn.execute("UPDATE courier.schedules SET next_run_at = courier._cron_prev(cron, time_zone, now()) "
                 "WHERE name = 'daily'")
    conn.execute("UPDATE courier.schedules SET next_run_at = next_run_at - interval '1 day' WHERE name = 'daily' "
                 "AND now() - next_run_at <= interval '60 seconds'")  # today's 03:00 just passed: yesterday's
    run_due(conn)
    assert ticks_sent(conn, "daily") == []
    assert conn.execute("SELECT skipped_ticks >= 1, next_run_at > now() FROM courier.schedules "
                        "WHERE name = 'daily'").fetchone() == (True, True)


def test_catch_up_all_sends_every_missed_tick_oldest_first_up_to_its_limit(conn):
    conn.execute("SELECT courier.create_endpoint('jobs', 'pull')")
    conn.execute("SELECT courier.create_schedule('minutely', '* * * * *', 'jobs', p_catch_up => 'all', "
                 "p_catch_up_limit => 5)")
    missed(conn, "minutely", 3)
    run_due(conn)
    assert len(ticks_sent(conn, "minutely")) == 4  # three minutes back, and this minute's
    ids_in_tick_order = [row[0] for row in conn.execute(
        "SELECT id FROM courier.queue ORDER BY metadata ->> 'courier_tick'")]
    assert ids_in_tick_order == sorted(ids_in_tick_order)  # sent oldest first
    conn.execute("SELECT courier.create_schedule('bounded', '* * * * *', 'jobs', p_catch_up => 'all', "
                 "p_catch_up_limit => 5)")
    missed(conn, "bounded", 20)
    run_due(conn)
    sent = ticks_sent(conn, "bounded")
    now_tick = scalar(conn, "SELECT date_trunc('minute', now())").astimezone(UTC)
    assert sent == [(now_tick - timedelta(minutes=back)).strftime("%Y-%m-%dT%H:%M:%SZ") for back in range(4, -1, -1)]
    assert conn.execute("SELECT sent_ticks, skipped_ticks FROM courier.schedules WHERE name = 'bounded'"
                        ).fetchone() == (5, 16)


def test_one_failing_schedule_fails_alone_and_is_retried(conn):
    conn.execute("SELECT courier.create_endpoint('jobs', 'pull')")
    conn.execute("SELECT courier.create_endpoint('closed', 'pull')")
    conn.execute("SELECT courier.create_schedule('good', '* * * * *', 'jobs')")
    conn.execute("SELECT courier.create_schedule('bad', '* * * * *', 'closed')")
    conn.execute("SELECT courier.disable_endpoint('closed')")
    missed(conn, "good", 0)
    missed(conn, "bad", 0)
    assert run_due(conn) == 2
    assert len(ticks_sent(conn, "good")) == 1
    bad = conn.execute("SELECT last_error, sent_ticks, next_run_at <= now() FROM courier.schedules "
                       "WHERE name = 'bad'").fetchone()
    assert "disabled" in bad[0] and bad[1:] == (0, True)
    assert run_due(conn) == 0  # not retried at once
    listed = conn.execute("SELECT late, last_error IS NOT NULL FROM courier.list_schedules() "
                          "WHERE name = 'bad'").fetchone()
    assert listed == (False, True)
    assert scalar(conn, "SELECT count(*) FROM courier.event_log WHERE event_type = 'schedule.failed'") == 1

    conn.execute("SELECT courier.enable_endpoint('closed')")
    conn.execute("UPDATE courier.schedules SET last_error_at = now() - interval '11 seconds' WHERE name = 'bad'")
    assert run_due(conn) == 1
    assert len(ticks_sent(conn, "bad")) == 1
    assert scalar(conn, "SELECT last_error FROM courier.schedules WHERE name = 'bad'") is None


def test_pause_resume_replace_and_drop(conn):
    conn.execute("SELECT courier.create_endpoint('jobs', 'pull')")
    conn.execute("SELECT courier.create_schedule('minutely', '* * * * *', 'jobs')")
    assert scalar(conn, "SELECT courier.pause_schedule('minutely')") is True
    assert scalar(conn, "SELECT courier.pause_schedule('minutely')") is False
    missed(conn, "minutely", 5)
    assert run_due(conn) == 0
    assert scalar(conn, "SELECT courier.resume_schedule('minutely')") is True
    assert scalar(conn, "SELECT next_run_at > now() FROM courier.schedules") is True  # no catching up a pause
    with pytest.raises(psycopg.errors.DuplicateObject):
        conn.execute("SELECT courier.create_schedule('minutely', '0 * * * *', 'jobs')")
    conn.execute("SELECT courier.create_schedule('minutely', '@hourly', 'jobs', p_replace => true)")
    assert conn.execute("SELECT cron, date_part('minute', next_run_at) FROM courier.schedules").fetchone() == (
        "0 * * * *", 0)
    assert scalar(conn, "SELECT courier.drop_schedule('minutely')") is True
    assert scalar(conn, "SELECT courier.drop_schedule('minutely', true)") is False
    with pytest.raises(psycopg.errors.UndefinedObject):
        conn.execute("SELECT courier.drop_schedule('minutely')")
    kinds = [row[0] for row in conn.execute("SELECT event_type FROM courier.event_log "
                                            "WHERE event_type LIKE 'schedule.%' ORDER BY id")]
    assert kinds == ["schedule.created", "schedule.paused", "schedule.resumed", "schedule.replaced",
                     "schedule.dropped"]
    # A schedule goes with its target.
    conn.execute("SELECT courier.create_schedule('again', '* * * * *', 'jobs')")
    conn.execute("SELECT courier.drop_endpoint('jobs')")
    assert scalar(conn, "SELECT count(*) FROM courier.schedules") == 0


def test_concurrent_leaders_send_every_tick_exactly_once(dsn, conn):
    """Eight sessions run the leader's job at once over forty schedules with half an hour of
    missed ticks each (catch_up all): every tick goes out once, none twice, none lost. The
    schedule's count of sent ticks equals its messages, so a tick sent twice and then folded
    by the idempotency key would show too."""
    conn.execute("SELECT courier.create_endpoint('jobs', 'pull')")
    for n in range(40):
        conn.execute("SELECT courier.create_schedule(%s, '* * * * *', 'jobs', p_catch_up => 'all')", (f"s{n}",))
    conn.execute("UPDATE courier.schedules SET next_run_at = date_trunc('minute', now()) - interval '30 minutes'")
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def leader() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as own:
                start.wait()
                for _ in range(10):
                    own.execute("SELECT courier.run_due_schedules(3)")
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=leader) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    run_due(conn)  # what the eight left, if any
    for n in range(40):
        sent = ticks_sent(conn, f"s{n}")
        assert len(sent) == len(set(sent)) >= 31
        assert scalar(conn, "SELECT sent_ticks FROM courier.schedules WHERE name = %s", (f"s{n}",)) == len(sent)
        spaced = [datetime.fromisoformat(t) for t in sent]
        assert all(b - a == timedelta(minutes=1) for a, b in itertools.pairwise(spaced))


def test_leader_killed_mid_catch_up_loses_and_repeats_no_tick(dsn, conn):
    """Real `courier worker` processes: the leader is killed with SIGKILL while it works through
    three hundred schedules' missed ticks; the next leader finishes, and every tick is sent
    exactly once."""
    conn.execute("SELECT courier.create_endpoint('jobs', 'pull')")
    conn.execute("SELECT courier.create_schedule('s' || n, '* * * * *', 'jobs', p_catch_up => 'all') "
                 "FROM generate_series(1, 300) n")
    # Held until the leader is known (paused, no tick is sent), then twenty minutes behind.
    conn.execute("UPDATE courier.schedules SET paused_at = now(), "
                 "next_run_at = date_trunc('minute', now()) - interval '20 minutes'")
    workers = {name: start_worker_process(dsn, "--worker-id", name) for name in ("first", "second", "third")}
    try:
        def leader() -> str | None:
            return scalar(conn, "SELECT worker_id FROM courier.get_worker_status() WHERE alive AND maintenance_leader")

        wait_for(lambda: leader() is not None, timeout=30)
        first = leader()
        conn.execute("UPDATE courier.schedules SET paused_at = NULL")
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM courier.schedules WHERE sent_ticks > 0") > 0,
                 timeout=30, interval=0.01)
        workers[first].kill()
        workers[first].wait(10)
        wait_for(lambda: leader() not in (None, first), timeout=30)
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM courier.schedules WHERE next_run_at <= now()") == 0,
                 timeout=60)
        counts = conn.execute("SELECT s.name, s.sent_ticks, count(q.id), count(DISTINCT q.metadata ->> 'courier_tick') "
                              "FROM courier.schedules s LEFT JOIN courier.queue q "
                              "ON q.metadata ->> 'courier_schedule' = s.name GROUP BY s.name, s.sent_ticks").fetchall()
        assert len(counts) == 300
        for name, sent_ticks, messages, distinct in counts:
            assert sent_ticks == messages == distinct >= 21, name
    finally:
        for process in workers.values():
            if process.poll() is None:
                process.terminate()
                process.wait(30)


def test_the_cli_manages_schedules_with_one_line_errors(dsn, conn):
    conn.execute("SELECT courier.create_endpoint('jobs', 'pull')")
    created = run("schedule", "create", "nightly", "0 3 * * *", "jobs", '{"report": "daily"}', "--tz",
                   "Europe/Berlin", dsn=dsn)
    assert created.code == 0, created.err
    assert "created schedule nightly: 0 3 * * * (Europe/Berlin) to jobs; next run" in created.out
    assert "03:00:00 CE" in created.out  # on its own clock (CET or CEST)
    listed = run("schedule", "list", "-o", "json", dsn=dsn)
    (row,) = listed.json()
    assert (row["name"], row["cron"], row["time_zone"], row["late"]) == ("nightly", "0 3 * * *", "Europe/Berlin",
                                                                         False)
    shown = run("schedule", "show", "nightly", dsn=dsn)
    assert '{"report": "daily"}' in shown.out and "running" in shown.out
    assert run("schedule", "pause", "nightly", dsn=dsn).out.strip() == "schedule nightly paused"
    assert "resumed; next run" in run("schedule", "resume", "nightly", dsn=dsn).out
    preview = run("schedule", "preview", "@weekly", "--count", "2", "-o", "json", dsn=dsn)
    assert len(preview.json()) == 2
    for arguments, message in [
        (["schedule", "create", "feb", "0 0 30 2 *", "jobs"], "cron names a day that never comes"),
        (["schedule", "create", "tz", "* * * * *", "jobs", "--tz", "Nowhere/Town"], "time_zone must be an IANA"),
        (["schedule", "create", "nightly", "* * * * *", "jobs"], 'schedule "nightly" already exists'),
        (["schedule", "create", "x", "* * * * *", "jobs", "not json"], "PAYLOAD"),
        (["schedule", "drop", "nope"], 'schedule "nope" does not exist'),
    ]:
        result = run(*arguments, dsn=dsn)
        assert result.code != 0, arguments
        assert message in result.err, result.err
        assert "Traceback" not in result.err, result.err
    assert run("schedule", "drop", "nightly", dsn=dsn).out.strip() == "dropped schedule nightly"


def test_a_late_schedule_is_listed_late(conn):
    conn.execute("SELECT courier.create_endpoint('jobs', 'pull')")
    conn.execute("SELECT courier.create_schedule('minutely', '* * * * *', 'jobs')")
    missed(conn, "minutely", 5)  # no leader has run for five minutes
    assert scalar(conn, "SELECT late FROM courier.list_schedules()") is True
    conn.execute("SELECT courier.pause_schedule('minutely')")
    assert scalar(conn, "SELECT late FROM courier.list_schedules()") is False
