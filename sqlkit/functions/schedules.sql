-- Periodic schedules (issue 42, item 1; the table is migration 0045). A schedule's cron
-- expression is read in its time zone; the maintenance leader calls run_due_schedules() every
-- second or so, which sends each due tick in the transaction that moves next_run_at past it.
--
-- Exactly once, across any number of workers and leader changes: the tick's message and the
-- schedule's next_run_at commit together or not at all, and a second leader (a hung one whose
-- lease lapsed) skips the row the first holds locked, then finds next_run_at moved on. The
-- idempotency key schedule:<id>:<tick> fences even a tick sent by hand beside the leader.
--
-- Ticks missed while no leader ran (catch_up): 'skip' sends at most the latest missed tick,
-- and only if it is no older than grace_seconds (a daily job missed by 20 hours waits for
-- tomorrow; a tick missed during a leader change of a minute goes out late); 'all' sends every
-- missed tick, oldest first, at most catch_up_limit of them (the most recent). Skipped ticks
-- are counted on the schedule and logged.

-- The values of day-of-week field, 7 read as Sunday (0), as extract(dow) gives them.
CREATE OR REPLACE FUNCTION courier._cron_weekdays(p_field text) RETURNS integer[]
LANGUAGE sql IMMUTABLE
AS $$ SELECT array_agg(DISTINCT d % 7 ORDER BY d % 7) FROM unnest(courier._cron_field_values(p_field, 0, 7)) d $$;

-- Whether the local day p_day matches the schedule's day fields: both when either field starts
-- with * (Debian cron and cronsim), either one otherwise.
CREATE OR REPLACE FUNCTION courier._cron_day_matches(p_day timestamp, p_days integer[], p_weekdays integer[],
                                                    p_either boolean) RETURNS boolean
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE WHEN p_either
                THEN extract(day FROM p_day)::integer = ANY (p_days) OR extract(dow FROM p_day)::integer = ANY (p_weekdays)
                ELSE extract(day FROM p_day)::integer = ANY (p_days) AND extract(dow FROM p_day)::integer = ANY (p_weekdays)
           END
$$;

-- The values each field of a valid cron schedule names, and whether its two day fields are
-- either-or (neither starts with *), read once per call of _cron_next or _cron_prev.
CREATE OR REPLACE FUNCTION courier._cron_fields(p_cron text, OUT minutes integer[], OUT hours integer[],
                                               OUT days integer[], OUT months integer[], OUT weekdays integer[],
                                               OUT either boolean)
LANGUAGE sql IMMUTABLE
AS $$
    SELECT courier._cron_field_values(f[1], 0, 59), courier._cron_field_values(f[2], 0, 23),
           courier._cron_field_values(f[3], 1, 31), courier._cron_field_values(f[4], 1, 12),
           courier._cron_weekdays(f[5]), left(f[3], 1) <> '*' AND left(f[5], 1) <> '*'
    FROM string_to_array(p_cron, ' ') AS f
$$;

-- The first time after p_after that the cron schedule p_cron (normalized, valid) names on the
-- clocks of p_time_zone; NULL if none within nine years. Walks local time a field at a time
-- (a month, a day, an hour, then the minute), so a yearly schedule takes a few dozen steps.
-- A local time that a clock change skips is read as PostgreSQL reads it (02:30 on a spring-
-- forward night is 03:30); one that happens twice fires once.
CREATE OR REPLACE FUNCTION courier._cron_next(p_cron text, p_time_zone text, p_after timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    f record := courier._cron_fields(p_cron);
    v_local timestamp := date_trunc('minute', p_after AT TIME ZONE p_time_zone) + interval '1 minute';
    v_end timestamp := v_local + interval '9 years';
    v_minute integer;
    v_at timestamptz;
BEGIN
    WHILE v_local < v_end LOOP
        IF NOT extract(month FROM v_local)::integer = ANY (f.months) THEN
            v_local := date_trunc('month', v_local) + interval '1 month';
        ELSIF NOT courier._cron_day_matches(v_local, f.days, f.weekdays, f.either) THEN
            v_local := date_trunc('day', v_local) + interval '1 day';
        ELSIF NOT extract(hour FROM v_local)::integer = ANY (f.hours) THEN
            v_local := date_trunc('hour', v_local) + interval '1 hour';
        ELSE
            SELECT min(m) INTO v_minute FROM unnest(f.minutes) m WHERE m >= extract(minute FROM v_local);
            IF v_minute IS NULL THEN
                v_local := date_trunc('hour', v_local) + interval '1 hour';
            ELSE
                v_local := date_trunc('hour', v_local) + make_interval(mins => v_minute);
                v_at := v_local AT TIME ZONE p_time_zone;
                IF v_at > p_after THEN
                    RETURN v_at;
                END IF;
                v_local := v_local + interval '1 minute';
            END IF;
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

-- The latest time at or before p_at that the schedule names: _cron_next walked backwards.
CREATE OR REPLACE FUNCTION courier._cron_prev(p_cron text, p_time_zone text, p_at timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    f record := courier._cron_fields(p_cron);
    v_local timestamp := date_trunc('minute', p_at AT TIME ZONE p_time_zone);
    v_end timestamp := v_local - interval '9 years';
    v_minute integer;
    v_at timestamptz;
BEGIN
    WHILE v_local > v_end LOOP
        IF NOT extract(month FROM v_local)::integer = ANY (f.months) THEN
            v_local := date_trunc('month', v_local) - interval '1 minute';
        ELSIF NOT courier._cron_day_matches(v_local, f.days, f.weekdays, f.either) THEN
            v_local := date_trunc('day', v_local) - interval '1 minute';
        ELSIF NOT extract(hour FROM v_local)::integer = ANY (f.hours) THEN
            v_local := date_trunc('hour', v_local) - interval '1 minute';
        ELSE
            SELECT max(m) INTO v_minute FROM unnest(f.minutes) m WHERE m <= extract(minute FROM v_local);
            IF v_minute IS NULL THEN
                v_local := date_trunc('hour', v_local) - interval '1 minute';
            ELSE
                v_local := date_trunc('hour', v_local) + make_interval(mins => v_minute);
                v_at := v_local AT TIME ZONE p_time_zone;
                IF v_at <= p_at THEN
                    RETURN v_at;
                END IF;
                v_local := v_local - interval '1 minute';
            END IF;
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

-- The next p_count times after p_after the schedule names (for `courier schedule show` and
-- for anyone checking an expression before creating a schedule).
CREATE OR REPLACE FUNCTION courier.cron_next_runs(p_cron text, p_time_zone text DEFAULT 'UTC',
                                                  p_count integer DEFAULT 5, p_after timestamptz DEFAULT now())
RETURNS SETOF timestamptz
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_cron text := courier._cron_normalize('cron', p_cron);
    v_at timestamptz := p_after;
BEGIN
    PERFORM courier._check_time_zone(p_time_zone);
    IF v_cron = '' THEN
        RAISE EXCEPTION '[courier] cron must not be empty' USING ERRCODE = '22023', COLUMN = 'cron';
    END IF;
    IF p_count NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION '[courier] count must be between 1 and 1000, got %', p_count
            USING ERRCODE = '22023', COLUMN = 'count';
    END IF;
    FOR i IN 1..p_count LOOP
        v_at := courier._cron_next(v_cron, p_time_zone, v_at);
        EXIT WHEN v_at IS NULL;
        RETURN NEXT v_at;
    END LOOP;
END
$$;

-- A time zone by its IANA name ('UTC', 'Europe/Berlin'). Abbreviations and POSIX strings are
-- refused: 'UTC+3' is three hours west of UTC in POSIX, which no one who writes it means.
CREATE OR REPLACE FUNCTION courier._check_time_zone(p_time_zone text) RETURNS void
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF p_time_zone IS NULL OR NOT EXISTS (SELECT 1 FROM pg_catalog.pg_timezone_names WHERE name = p_time_zone) THEN
        RAISE EXCEPTION '[courier] time_zone must be an IANA time zone name, got %', coalesce(to_jsonb(p_time_zone)::text, 'NULL')
            USING ERRCODE = '22023', COLUMN = 'time_zone',
                  HINT = 'For example UTC, Europe/Berlin or America/New_York: SELECT name FROM pg_timezone_names';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION courier._schedule(p_name text) RETURNS courier.schedules
LANGUAGE plpgsql
AS $$
DECLARE
    v_schedule courier.schedules;
BEGIN
    SELECT * INTO v_schedule FROM courier.schedules WHERE name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION '[courier] schedule "%" does not exist', p_name
            USING ERRCODE = '42704', COLUMN = 'name', HINT = 'List them with: courier schedule list';
    END IF;
    RETURN v_schedule;
END
$$;

-- Creates schedule p_name, or with p_replace changes the one of that name (its next run is
-- computed anew when its cron or time zone changed; its history stays). Returns its id. The
-- message each tick sends is given as a send takes it, and checked here as a send checks it;
-- the tick's time is added to its metadata as courier_tick, with courier_schedule.
CREATE OR REPLACE FUNCTION courier.create_schedule(
    p_name           text,
    p_cron           text,
    p_endpoint_name  text,
    p_payload        jsonb       DEFAULT '{}',
    p_time_zone      text        DEFAULT 'UTC',
    p_headers        jsonb       DEFAULT NULL,
    p_metadata       jsonb       DEFAULT NULL,
    p_priority       integer     DEFAULT 0,
    p_ordering_key   text        DEFAULT NULL,
    p_catch_up       text        DEFAULT 'skip',
    p_catch_up_limit integer     DEFAULT 100,
    p_grace_seconds  integer     DEFAULT 600,
    p_description    text        DEFAULT NULL,
    p_replace        boolean     DEFAULT false
) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_cron text := courier._cron_normalize('cron', p_cron);
    v_endpoint courier.endpoints;
    v_old courier.schedules;
    v_id integer;
BEGIN
    IF p_name IS NULL OR p_name !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$' THEN
        RAISE EXCEPTION '[courier] name must be 1 to 128 letters, digits, _ . : or -, starting with a letter or digit, got %',
                coalesce(to_jsonb(p_name)::text, 'NULL')
            USING ERRCODE = '22023', COLUMN = 'name';
    END IF;
    IF v_cron = '' THEN
        RAISE EXCEPTION '[courier] cron must not be empty' USING ERRCODE = '22023', COLUMN = 'cron';
    END IF;
    PERFORM courier._check_time_zone(p_time_zone);
    SELECT * INTO v_endpoint FROM courier.endpoints WHERE name = p_endpoint_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION '[courier] endpoint or topic % does not exist', coalesce(to_jsonb(p_endpoint_name)::text, 'NULL')
            USING ERRCODE = '42704', COLUMN = 'endpoint',
                  HINT = 'Create it first (courier endpoint create, courier topic create)';
    END IF;
    IF p_payload IS NULL THEN
        RAISE EXCEPTION '[courier] payload must not be NULL' USING ERRCODE = '22004', COLUMN = 'payload';
    END IF;
    IF p_headers IS NOT NULL AND p_headers <> '{}' THEN
        IF jsonb_typeof(p_headers) <> 'object' THEN
            RAISE EXCEPTION '[courier] headers must be a JSON object of strings' USING ERRCODE = '22023', COLUMN = 'headers';
        END IF;
        PERFORM courier._check_headers(p_headers, 'headers');
    END IF;
    IF p_metadata IS NOT NULL AND jsonb_typeof(p_metadata) <> 'object' THEN
        RAISE EXCEPTION '[courier] metadata must be a JSON object, got %', jsonb_typeof(p_metadata)
            USING ERRCODE = '22023', COLUMN = 'metadata';
    END IF;
    IF p_priority IS NULL OR p_priority NOT BETWEEN 0 AND 10 THEN
        RAISE EXCEPTION '[courier] priority must be between 0 and 10, got %', coalesce(p_priority::text, 'NULL')
            USING ERRCODE = '22023', COLUMN = 'priority';
    END IF;
    IF length(p_ordering_key) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION '[courier] ordering_key must be 1 to 255 characters' USING ERRCODE = '22023', COLUMN = 'ordering_key';
    END IF;
    IF p_catch_up IS NULL OR p_catch_up NOT IN ('skip', 'all') THEN
        RAISE EXCEPTION '[courier] catch_up must be skip or all, got %', coalesce(to_jsonb(p_catch_up)::text, 'NULL')
            USING ERRCODE = '22023', COLUMN = 'catch_up',
                  HINT = 'skip: after an outage send at most the latest missed tick; all: send every missed tick, up to catch_up_limit';
    END IF;
    IF p_catch_up_limit IS NULL OR p_catch_up_limit NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION '[courier] catch_up_limit must be between 1 and 10000, got %', coalesce(p_catch_up_limit::text, 'NULL')
            USING ERRCODE = '22023', COLUMN = 'catch_up_limit';
    END IF;
    IF p_grace_seconds IS NULL OR p_grace_seconds NOT BETWEEN 1 AND 86400 THEN
        RAISE EXCEPTION '[courier] grace_seconds must be between 1 and 86400, got %', coalesce(p_grace_seconds::text, 'NULL')
            USING ERRCODE = '22023', COLUMN = 'grace_seconds';
    END IF;

    SELECT * INTO v_old FROM courier.schedules WHERE name = p_name FOR UPDATE;
    IF FOUND AND NOT coalesce(p_replace, false) THEN
        RAISE EXCEPTION '[courier] schedule "%" already exists', p_name
            USING ERRCODE = '42710', COLUMN = 'name',
                  HINT = 'Replace it (p_replace => true, courier schedule create --replace) or drop it first';
    END IF;
    IF FOUND THEN
        UPDATE courier.schedules
        SET cron = v_cron, time_zone = p_time_zone, endpoint_id = v_endpoint.id, payload = p_payload,
            headers = nullif(p_headers, '{}'), metadata = nullif(p_metadata, '{}'), priority = p_priority,
            ordering_key = p_ordering_key, catch_up = p_catch_up, catch_up_limit = p_catch_up_limit,
            grace_seconds = p_grace_seconds, description = p_description,
            next_run_at = CASE WHEN v_old.cron = v_cron AND v_old.time_zone = p_time_zone THEN v_old.next_run_at
                               ELSE courier._cron_next(v_cron, p_time_zone, now()) END,
            updated_at = now()
        WHERE id = v_old.id;
        v_id := v_old.id;
        PERFORM courier._log_event('schedule.replaced', v_endpoint.id, jsonb_build_object(
            'schedule', p_name, 'cron', v_cron, 'time_zone', p_time_zone, 'old_cron', v_old.cron));
    ELSE
        INSERT INTO courier.schedules (name, cron, time_zone, endpoint_id, payload, headers, metadata, priority,
                                       ordering_key, catch_up, catch_up_limit, grace_seconds, description, next_run_at)
        VALUES (p_name, v_cron, p_time_zone, v_endpoint.id, p_payload, nullif(p_headers, '{}'),
                nullif(p_metadata, '{}'), p_priority, p_ordering_key, p_catch_up, p_catch_up_limit, p_grace_seconds,
                p_description, courier._cron_next(v_cron, p_time_zone, now()))
        RETURNING id INTO v_id;
        PERFORM courier._log_event('schedule.created', v_endpoint.id, jsonb_build_object(
            'schedule', p_name, 'cron', v_cron, 'time_zone', p_time_zone));
    END IF;
    RETURN v_id;
END
$$;

-- Drops schedule p_name; the messages its ticks sent stay. Returns whether it existed.
CREATE OR REPLACE FUNCTION courier.drop_schedule(p_name text, p_if_exists boolean DEFAULT false) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_schedule courier.schedules;
BEGIN
    IF p_if_exists AND NOT EXISTS (SELECT 1 FROM courier.schedules WHERE name = p_name) THEN
        RETURN false;
    END IF;
    v_schedule := courier._schedule(p_name);
    DELETE FROM courier.schedules WHERE id = v_schedule.id;
    PERFORM courier._log_event('schedule.dropped', v_schedule.endpoint_id, jsonb_build_object(
        'schedule', p_name, 'cron', v_schedule.cron, 'sent_ticks', v_schedule.sent_ticks));
    RETURN true;
END
$$;

-- Pauses schedule p_name: no tick is sent until it is resumed, and the ticks in between are
-- not made up. Returns whether it was running (pausing a paused schedule changes nothing).
CREATE OR REPLACE FUNCTION courier.pause_schedule(p_name text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_schedule courier.schedules := courier._schedule(p_name);
BEGIN
    IF v_schedule.paused_at IS NOT NULL THEN
        RETURN false;
    END IF;
    UPDATE courier.schedules SET paused_at = now(), updated_at = now() WHERE id = v_schedule.id;
    PERFORM courier._log_event('schedule.paused', v_schedule.endpoint_id, jsonb_build_object('schedule', p_name));
    RETURN true;
END
$$;

-- Resumes schedule p_name from its next tick after now. Returns whether it was paused.
CREATE OR REPLACE FUNCTION courier.resume_schedule(p_name text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_schedule courier.schedules := courier._schedule(p_name);
BEGIN
    IF v_schedule.paused_at IS NULL THEN
        RETURN false;
    END IF;
    UPDATE courier.schedules
    SET paused_at = NULL, next_run_at = courier._cron_next(cron, time_zone, now()), updated_at = now()
    WHERE id = v_schedule.id;
    PERFORM courier._log_event('schedule.resumed', v_schedule.endpoint_id, jsonb_build_object('schedule', p_name));
    RETURN true;
END
$$;

-- How late a running schedule may be before it is reported late: the leader looks every
-- second, and a leader change takes up to a minute when the old leader hangs.
CREATE OR REPLACE FUNCTION courier._schedule_late_after() RETURNS interval
LANGUAGE sql IMMUTABLE
AS $$ SELECT interval '90 seconds' $$;

-- Every schedule as the CLI, the console and the HTTP API show it: no payload, headers or
-- metadata (a monitor may read this). late: running, and its next tick is more than
-- _schedule_late_after() overdue (no worker is running, or each attempt fails: last_error).
CREATE OR REPLACE FUNCTION courier.list_schedules()
RETURNS TABLE (name text, endpoint_name text, protocol text, cron text, time_zone text, catch_up text,
               catch_up_limit integer, grace_seconds integer, description text, paused_at timestamptz,
               next_run_at timestamptz, last_tick_at timestamptz, last_sent_at timestamptz,
               last_message_id bigint, sent_ticks bigint, skipped_ticks bigint, last_error text,
               last_error_at timestamptz, late boolean, created_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
    SELECT s.name, e.name, e.protocol, s.cron, s.time_zone, s.catch_up, s.catch_up_limit, s.grace_seconds,
           s.description, s.paused_at, s.next_run_at, s.last_tick_at, s.last_sent_at, s.last_message_id,
           s.sent_ticks, s.skipped_ticks, courier._redact_text(s.last_error), s.last_error_at,
           s.paused_at IS NULL AND s.next_run_at < now() - courier._schedule_late_after(),
           s.created_at
    FROM courier.schedules s JOIN courier.endpoints e ON e.id = s.endpoint_id
    ORDER BY s.name
$$;

-- The ticks of schedule s due at p_now, oldest first, and how many due ticks are skipped.
CREATE OR REPLACE FUNCTION courier._due_ticks(s courier.schedules, p_now timestamptz,
                                              OUT ticks timestamptz[], OUT skipped integer)
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_tick timestamptz := courier._cron_prev(s.cron, s.time_zone, p_now);
BEGIN
    ticks := '{}';
    skipped := 0;
    IF s.catch_up = 'skip' AND v_tick >= s.next_run_at THEN
        IF p_now - v_tick <= make_interval(secs => s.grace_seconds) THEN
            ticks := ARRAY[v_tick];
        ELSE
            skipped := 1;
        END IF;
        v_tick := courier._cron_prev(s.cron, s.time_zone, v_tick - interval '1 microsecond');
    END IF;
    WHILE v_tick >= s.next_run_at LOOP
        IF s.catch_up = 'all' AND cardinality(ticks) < s.catch_up_limit THEN
            ticks := v_tick || ticks;
        ELSE
            skipped := skipped + 1;
            -- Counting further would walk every missed minute of a long outage.
            EXIT WHEN skipped >= 10000;
        END IF;
        v_tick := courier._cron_prev(s.cron, s.time_zone, v_tick - interval '1 microsecond');
    END LOOP;
END
$$;

-- The leader's job: sends every due tick of every running schedule, p_limit schedules per
-- call (it is called again while it reports a full batch). Returns how many schedules it
-- handled. One schedule whose send fails (its endpoint disabled or full, a payload it now
-- refuses) records the error and is tried again 10 s later; the others go on.
CREATE OR REPLACE FUNCTION courier.run_due_schedules(p_limit integer DEFAULT 100) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_schedule courier.schedules;
    v_endpoint_name text;
    v_due record;
    v_tick timestamptz;
    v_tick_text text;
    v_message_id bigint;
    v_handled integer := 0;
    v_error text;
BEGIN
    FOR v_schedule IN
        SELECT * FROM courier.schedules s
        WHERE s.paused_at IS NULL AND s.next_run_at <= now()
          AND (s.last_error_at IS NULL OR s.last_error_at <= now() - interval '10 seconds'
               OR s.last_error_at < s.updated_at)
        ORDER BY s.next_run_at
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    LOOP
        v_handled := v_handled + 1;
        v_due := courier._due_ticks(v_schedule, now());
        v_endpoint_name := (SELECT e.name FROM courier.endpoints e WHERE e.id = v_schedule.endpoint_id);
        v_message_id := NULL;
        BEGIN
            FOREACH v_tick IN ARRAY v_due.ticks LOOP
                v_tick_text := to_char(v_tick AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"');
                v_message_id := courier.send_with_options(
                    v_endpoint_name, v_schedule.payload,
                    p_priority => v_schedule.priority,
                    p_idempotency_key => format('schedule:%s:%s', v_schedule.id, v_tick_text),
                    p_ordering_key => v_schedule.ordering_key,
                    p_headers => v_schedule.headers,
                    p_metadata => coalesce(v_schedule.metadata, '{}') || jsonb_build_object(
                        'courier_schedule', v_schedule.name, 'courier_tick', v_tick_text));
            END LOOP;
            UPDATE courier.schedules
            SET next_run_at = coalesce(courier._cron_next(cron, time_zone, now()), 'infinity'),
                last_tick_at = coalesce(v_due.ticks[cardinality(v_due.ticks)], last_tick_at),
                last_sent_at = CASE WHEN v_message_id IS NOT NULL THEN now() ELSE last_sent_at END,
                last_message_id = coalesce(v_message_id, last_message_id),
                sent_ticks = sent_ticks + cardinality(v_due.ticks),
                skipped_ticks = skipped_ticks + v_due.skipped,
                last_error = NULL, last_error_at = NULL
            WHERE id = v_schedule.id;
            IF v_due.skipped > 0 THEN
                PERFORM courier._log_event('schedule.ticks_skipped', v_schedule.endpoint_id, jsonb_build_object(
                    'schedule', v_schedule.name, 'skipped', v_due.skipped, 'since', v_schedule.next_run_at,
                    'catch_up', v_schedule.catch_up, 'sent', cardinality(v_due.ticks)));
            END IF;
        EXCEPTION WHEN OTHERS THEN
            -- Every tick of this schedule rolled back with the error; next_run_at stays, so
            -- the next attempt sends them (or, past grace_seconds, skips them).
            v_error := SQLERRM;
            UPDATE courier.schedules SET last_error = v_error, last_error_at = now() WHERE id = v_schedule.id;
            IF v_schedule.last_error IS DISTINCT FROM v_error THEN
                PERFORM courier._log_event('schedule.failed', v_schedule.endpoint_id, jsonb_build_object(
                    'schedule', v_schedule.name, 'error', v_error, 'sqlstate', SQLSTATE,
                    'tick', v_due.ticks[1]));
            END IF;
        END;
    END LOOP;
    RETURN v_handled;
END
$$;
