-- The archive: monthly partitions, moving finished messages out of the queue, expiry and
-- replay.

-- Partitions ----------------------------------------------------------------------------

-- Month boundaries are UTC, whatever the session's TimeZone, so partition names and
-- bounds do not depend on who ran the maintenance.
CREATE OR REPLACE FUNCTION courier._month_start(p_at timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE
AS $$ SELECT date_trunc('month', p_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' $$;

-- The first instant of the month a partition named archive_YYYY_MM holds.
CREATE OR REPLACE FUNCTION courier._archive_partition_month(p_partition text) RETURNS timestamptz
LANGUAGE sql IMMUTABLE
AS $$ SELECT make_timestamptz(substr(p_partition, 9, 4)::integer, substr(p_partition, 14, 2)::integer, 1, 0, 0, 0, 'UTC') $$;

CREATE OR REPLACE FUNCTION courier._archive_partition_name(p_month timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE
AS $$ SELECT 'archive_' || to_char(courier._month_start(p_month) AT TIME ZONE 'UTC', 'YYYY_MM') $$;

-- Creates the partition of the month containing p_month unless it exists; returns whether it
-- did. Rows of that month already in the default partition would clash with the new bounds,
-- so they step aside into a temporary table and come back through the parent.
CREATE OR REPLACE FUNCTION courier._ensure_archive_partition(p_month timestamptz) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_from timestamptz := courier._month_start(p_month);
    v_to timestamptz := courier._month_start(v_from + interval '32 days');
    v_name text := courier._archive_partition_name(v_from);
BEGIN
    IF to_regclass(format('courier.%I', v_name)) IS NOT NULL THEN
        RETURN false;
    END IF;
    -- A row only the owner can lock (courier.internal_locks): an advisory key, which any database user
    -- can hold, stopped the maintenance leader here.
    PERFORM 1 FROM courier.internal_locks WHERE name = 'archive_partitions' FOR UPDATE;
    IF to_regclass(format('courier.%I', v_name)) IS NOT NULL THEN
        RETURN false;  -- another session made it while we waited
    END IF;

    EXECUTE 'CREATE TEMP TABLE courier_archive_moving (LIKE courier.archive) ON COMMIT DROP';
    EXECUTE 'WITH moved AS (DELETE FROM courier.archive_default WHERE created_at >= $1 AND created_at < $2 RETURNING *)
             INSERT INTO courier_archive_moving SELECT * FROM moved' USING v_from, v_to;
    EXECUTE format('CREATE TABLE courier.%I PARTITION OF courier.archive FOR VALUES FROM (%L) TO (%L)',
                   v_name, v_from, v_to);
    EXECUTE 'INSERT INTO courier.archive SELECT * FROM courier_archive_moving';
    EXECUTE 'DROP TABLE courier_archive_moving';
    RETURN true;
END
$$;

-- Creates the partitions of this month and months_ahead more, and of every month that has
-- rows waiting in the default partition (moving them in); returns how many it created.
CREATE OR REPLACE FUNCTION courier.maintain_archive_partitions(months_ahead integer DEFAULT 3) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
-- CREATE TABLE ... PARTITION OF locks the archive: wait briefly, fail, and let the caller retry,
-- rather than queue every report behind a lock that waits on a long reader.
SET lock_timeout = '100ms'
AS $$
DECLARE
    v_month timestamptz;
    v_created text[] := '{}';
BEGIN
    IF months_ahead IS NULL OR months_ahead NOT BETWEEN 0 AND 120 THEN
        PERFORM courier._raise_invalid(format('months_ahead must be between 0 and 120, got %s',
                                              coalesce(months_ahead::text, 'NULL')));
    END IF;
    FOR v_month IN
        SELECT courier._month_start(now()) + make_interval(months => n) FROM generate_series(0, months_ahead) AS n
        UNION
        SELECT DISTINCT courier._month_start(created_at) FROM courier.archive_default
        ORDER BY 1
    LOOP
        IF courier._ensure_archive_partition(v_month) THEN
            v_created := v_created || courier._archive_partition_name(v_month);
        END IF;
    END LOOP;
    IF cardinality(v_created) > 0 THEN
        PERFORM courier._log_event('archive.partitions_created', NULL, jsonb_build_object('partitions', v_created));
    END IF;
    RETURN cardinality(v_created);
END
$$;

-- The first month archive retention keeps: monthly partitions before it are dropped.
CREATE OR REPLACE FUNCTION courier._archive_retention_cutoff(p_retention_months integer) RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_months integer := coalesce(p_retention_months, courier._setting_int('archive_retention_months')::integer);
BEGIN
    IF v_months NOT BETWEEN 1 AND 120 THEN
        PERFORM courier._raise_invalid(format('retention_months must be between 1 and 120, got %s', v_months));
    END IF;
    RETURN courier._month_start(now()) - make_interval(months => v_months);
END
$$;

-- Monthly partitions past retention, oldest first, each with its state: attached, detaching (a
-- DETACH ... CONCURRENTLY interrupted half way) or detached (not yet dropped).
CREATE OR REPLACE FUNCTION courier.archive_partitions_past_retention(retention_months integer DEFAULT NULL)
RETURNS TABLE (partition_name text, state text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_cutoff timestamptz := courier._archive_retention_cutoff(retention_months);
BEGIN
    RETURN QUERY
    SELECT c.relname::text,
           CASE WHEN i.inhrelid IS NULL THEN 'detached' WHEN i.inhdetachpending THEN 'detaching' ELSE 'attached' END
    FROM pg_class c
    LEFT JOIN pg_inherits i ON i.inhrelid = c.oid AND i.inhparent = 'courier.archive'::regclass
    WHERE c.relnamespace = 'courier'::regnamespace AND c.relkind = 'r'
      AND c.relname ~ '^archive_[0-9]{4}_[0-9]{2}$'
      AND courier._archive_partition_month(c.relname) < v_cutoff
    ORDER BY c.relname;
END
$$;

-- Drops monthly partitions that ended more than retention_months (default: the setting
-- archive_retention_months) before the start of this month, and deletes default-partition
-- rows that old and the replay markers of their messages; returns how many partitions it dropped. Dropping a partition costs the same
-- at any size, unlike deleting its rows.
--
-- Dropping a partition takes ACCESS EXCLUSIVE on the archive, and while that waits, every
-- report (which inserts into the archive) queues behind it: a DROP waiting on a long reader
-- stalled delivery for seconds. So a partition another session holds (a reader of old months:
-- reports only touch the current month's) is not tried at all, and each DROP waits at most
-- lock_timeout; either way the partition is reported busy and left for the next run.
-- DETACH PARTITION ... CONCURRENTLY, which would need no lock that reports wait for, is not
-- possible here: PostgreSQL refuses it while the archive has a default partition.
CREATE OR REPLACE FUNCTION courier.cleanup_old_archive_partitions(retention_months integer DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
SET lock_timeout = '100ms'
AS $$
DECLARE
    v_cutoff timestamptz := courier._archive_retention_cutoff(retention_months);
    v_partition record;
    v_dropped text[] := '{}';
    v_busy text[] := '{}';
    v_deleted bigint;
    v_markers bigint := 0;
BEGIN
    FOR v_partition IN SELECT * FROM courier.archive_partitions_past_retention(retention_months) LOOP
        IF v_partition.state = 'detaching'
           OR EXISTS (SELECT 1 FROM pg_locks l
                      WHERE l.locktype = 'relation' AND l.database = (SELECT oid FROM pg_database
                                                                      WHERE datname = current_database())
                        AND l.relation = format('courier.%I', v_partition.partition_name)::regclass
                        AND l.pid <> pg_backend_pid()) THEN
            v_busy := v_busy || v_partition.partition_name;
            CONTINUE;
        END IF;
        BEGIN
            EXECUTE format('DROP TABLE courier.%I', v_partition.partition_name);
            v_dropped := v_dropped || v_partition.partition_name;
        EXCEPTION WHEN lock_not_available THEN
            v_busy := v_busy || v_partition.partition_name;
        END;
    END LOOP;
    DELETE FROM courier.archive_default WHERE created_at < v_cutoff;
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    -- Replay markers (claim_replays) of messages whose archive rows are gone: a message replayed
    -- before the cutoff was created before it, so once no partition past retention is left, its
    -- row is gone and its marker guards nothing. Markers live at most retention plus a month.
    IF cardinality(v_busy) = 0 THEN
        DELETE FROM courier.replayed_messages WHERE replayed_at < v_cutoff;
        GET DIAGNOSTICS v_markers = ROW_COUNT;
    END IF;
    IF cardinality(v_dropped) > 0 OR v_deleted > 0 OR cardinality(v_busy) > 0 OR v_markers > 0 THEN
        PERFORM courier._log_event('archive.partitions_dropped', NULL, jsonb_build_object(
            'partitions', v_dropped, 'default_rows_deleted', v_deleted, 'busy', v_busy,
            'replay_markers_deleted', v_markers,
            'retention_months', coalesce(retention_months, courier._setting_int('archive_retention_months'))));
    END IF;
    RETURN cardinality(v_dropped);
END
$$;

-- Partitions with their sizes. Row counts are the planner's estimates, which stay free at
-- any size (`courier archive partitions --exact` counts instead).
CREATE OR REPLACE FUNCTION courier.archive_partitions()
RETURNS TABLE (partition_name text, range_from timestamptz, range_to timestamptz,
               estimated_rows bigint, total_bytes bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
    SELECT c.relname::text,
           CASE WHEN c.relname <> 'archive_default' THEN courier._archive_partition_month(c.relname) END,
           CASE WHEN c.relname <> 'archive_default'
                THEN courier._month_start(courier._archive_partition_month(c.relname) + interval '32 days') END,
           greatest(c.reltuples, 0)::bigint,
           pg_total_relation_size(c.oid)
    FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = 'courier.archive'::regclass
    ORDER BY c.relname = 'archive_default', c.relname
$$;

-- The exact row count of one archive partition (a full scan of it: for operators who ask).
CREATE OR REPLACE FUNCTION courier.count_archive_partition(p_partition text) RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_rows bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                   WHERE i.inhparent = 'courier.archive'::regclass AND c.relname = p_partition) THEN
        RAISE EXCEPTION '[courier] % is not an archive partition', coalesce(p_partition, 'NULL')
            USING ERRCODE = 'P0002', HINT = 'List them with courier.archive_partitions()';
    END IF;
    EXECUTE format('SELECT count(*) FROM courier.%I', p_partition) INTO v_rows;
    RETURN v_rows;
END
$$;

-- Moving messages out of the queue -------------------------------------------------------

-- Moves the given messages from the queue into the archive in one statement; returns how
-- many moved. Only rows whose status is in p_from_statuses move (NULL: any status).
-- p_status, when given, is the status they are archived with; p_responses, parallel to
-- p_ids, records captured responses.
CREATE OR REPLACE FUNCTION courier._archive_messages(p_ids bigint[], p_from_statuses text[], p_status text DEFAULT NULL,
                                          p_responses jsonb[] DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
    v_moved integer;
BEGIN
    WITH moved AS (
        DELETE FROM courier.queue q
        WHERE q.id = ANY (p_ids) AND (p_from_statuses IS NULL OR q.status = ANY (p_from_statuses))
        RETURNING q.*
    )
    INSERT INTO courier.archive (id, endpoint_id, payload, headers, metadata, status, priority, retry_count,
                                 max_retries, scheduled_at, expires_at, idempotency_key, correlation_id,
                                 ordering_key, last_error, error_history, worker_id, response, completed_at,
                                 created_at, key, payload_binary, body)
    SELECT m.id, m.endpoint_id, m.payload, m.headers, m.metadata, coalesce(p_status, m.status), m.priority,
           m.retry_count, m.max_retries, m.scheduled_at, m.expires_at, m.idempotency_key, m.correlation_id,
           m.ordering_key, m.last_error, m.error_history, m.worker_id, coalesce(r.response, m.response),
           coalesce(m.completed_at, now()), m.created_at, m.key, m.payload_binary, m.body
    FROM moved m
    LEFT JOIN unnest(p_ids, p_responses) AS r(id, response) ON r.id = m.id AND p_responses IS NOT NULL;
    GET DIAGNOSTICS v_moved = ROW_COUNT;
    RETURN v_moved;
END
$$;

-- The report path's move of delivered messages is _report_delivered's now (delivery.sql), for
-- both kinds of report.
DROP FUNCTION IF EXISTS courier._archive_delivered(bigint[], integer[], jsonb[]);

-- The delivered, archived message of this endpoint that still holds p_key: delivered less than
-- idempotency_retention_seconds ago. A duplicate of it returns its id, as a duplicate of a
-- queued message does; the same key with another payload is a conflict. NULL: none.
CREATE OR REPLACE FUNCTION courier._delivered_key_holder(p_endpoint_name text, p_key text, p_hash text)
RETURNS bigint
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_retention bigint := courier._setting_int('idempotency_retention_seconds');
    v_id bigint;
    v_hash text;
BEGIN
    IF v_retention = 0 THEN
        RETURN NULL;
    END IF;
    SELECT a.id, md5(a.payload::text) INTO v_id, v_hash
    FROM courier.archive a JOIN courier.endpoints e ON e.id = a.endpoint_id
    WHERE e.name = p_endpoint_name AND a.idempotency_key = p_key AND a.status = 'completed'
      AND a.completed_at > now() - make_interval(secs => v_retention)
    ORDER BY a.completed_at DESC LIMIT 1;
    IF v_id IS NOT NULL AND v_hash IS DISTINCT FROM p_hash THEN
        RAISE EXCEPTION 'Idempotency key ''%'' conflict: same key with different payload', p_key
            USING ERRCODE = '23505',
                  HINT = format('Message %s was delivered under this key; keys are kept idempotency_retention_seconds (%s) after delivery',
                                v_id, v_retention);
    END IF;
    RETURN v_id;
END
$$;

-- Moves up to batch_size finished messages (completed, failed, expired) that finished more
-- than older_than_seconds ago into the archive; returns how many. Call it until it returns
-- less than batch_size; the maintenance leader does.
CREATE OR REPLACE FUNCTION courier.archive_completed_messages(older_than_seconds integer DEFAULT 3600,
                                                   batch_size integer DEFAULT 1000)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
SET jit = off
AS $$
DECLARE
    v_ids bigint[];
BEGIN
    IF older_than_seconds IS NULL OR older_than_seconds < 0 OR batch_size IS NULL OR batch_size NOT BETWEEN 1 AND 100000 THEN
        PERFORM courier._raise_invalid('older_than_seconds must be >= 0 and batch_size between 1 and 100000');
    END IF;
    SELECT array_agg(id) INTO v_ids FROM (
        SELECT q.id FROM courier.queue q
        WHERE q.status IN ('completed', 'failed', 'expired')
          AND coalesce(q.completed_at, q.updated_at) <= now() - make_interval(secs => older_than_seconds)
        ORDER BY q.id
        LIMIT batch_size
        FOR UPDATE SKIP LOCKED
    ) picked;
    RETURN courier._archive_messages(coalesce(v_ids, '{}'), '{completed,failed,expired}');
END
$$;

-- Expiry ----------------------------------------------------------------------------------

-- Marks pending messages whose expires_at has passed as expired, at most p_batch_size per
-- call (the leader calls again while it gets a full batch); returns how many. Claims skip
-- expired messages anyway; this makes them visible and moves them on to the archive.
-- The batch is picked as an array (an InitPlan, run once), never as `id IN (SELECT ...
-- LIMIT ... FOR UPDATE SKIP LOCKED)`: as the inner side of a semi join that subquery runs
-- again for every row, skips the rows this statement has already changed, and so takes the
-- next ones, until every expired message is changed in one statement. Its ctids hold: the
-- rows are locked.
CREATE OR REPLACE FUNCTION courier.mark_expired_messages(p_batch_size integer DEFAULT 10000) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_endpoint_ids integer[];
BEGIN
    WITH expired AS (
        UPDATE courier.queue q
        SET status = 'expired', completed_at = now(), updated_at = now(),
            last_error = 'Expired before delivery'
        WHERE q.ctid = ANY (ARRAY(SELECT c.ctid FROM courier.queue c
                                  WHERE c.status = 'pending' AND c.expires_at <= now() AND c.completed_at IS NULL
                                  ORDER BY c.expires_at LIMIT greatest(p_batch_size, 1)
                                  FOR UPDATE SKIP LOCKED))
          AND q.status = 'pending'
        RETURNING q.endpoint_id
    )
    SELECT array_agg(endpoint_id) INTO v_endpoint_ids FROM expired;
    PERFORM courier._count_outcomes(v_endpoint_ids, 'expired');
    RETURN coalesce(cardinality(v_endpoint_ids), 0);
END
$$;

-- Replay ----------------------------------------------------------------------------------

-- The one replay rule, shared by replay_range, replay_message (and so the CLI and the
-- console's wizard) and `courier pipeline replay`: an archived message is enqueued again
-- once. Claims p_archive_ids in courier.replayed_messages, in the caller's transaction, and
-- returns the ones to enqueue now: those never replayed, or with p_again (a fresh copy the
-- operator asked for) all of them. A concurrent replay of the same message waits on the
-- claim, and skips the message once the first commits.
CREATE OR REPLACE FUNCTION courier.claim_replays(p_archive_ids bigint[], p_again boolean DEFAULT false)
RETURNS bigint[]
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_claimed bigint[];
BEGIN
    IF coalesce(p_again, false) THEN
        WITH claimed AS (
            INSERT INTO courier.replayed_messages AS r (archive_id)
            SELECT DISTINCT u.id FROM unnest(p_archive_ids) AS u(id) WHERE u.id IS NOT NULL
            ON CONFLICT (archive_id) DO UPDATE SET copies = r.copies + 1, replayed_at = now(), message_id = NULL
            RETURNING archive_id
        )
        SELECT array_agg(archive_id ORDER BY archive_id) INTO v_claimed FROM claimed;
    ELSE
        WITH claimed AS (
            INSERT INTO courier.replayed_messages (archive_id)
            SELECT DISTINCT u.id FROM unnest(p_archive_ids) AS u(id) WHERE u.id IS NOT NULL
            ON CONFLICT (archive_id) DO NOTHING
            RETURNING archive_id
        )
        SELECT array_agg(archive_id ORDER BY archive_id) INTO v_claimed FROM claimed;
    END IF;
    RETURN coalesce(v_claimed, '{}');
END
$$;

-- Enqueues the given archived messages created in [p_from_ts, p_to_ts) that claim_replays
-- lets through as new pending messages, in their original order, with their idempotency key
-- and expiry cleared (ulak) and metadata.replayed_from naming the archived id; records each
-- copy's id; returns how many it enqueued.
CREATE OR REPLACE FUNCTION courier._replay(p_archive_ids bigint[], p_from_ts timestamptz, p_to_ts timestamptz,
                                           p_again boolean)
RETURNS integer
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
    v_fresh bigint[];
    v_endpoint_ids integer[];
BEGIN
    v_fresh := courier.claim_replays(ARRAY(SELECT a.id FROM courier.archive a
                                           WHERE a.id = ANY (p_archive_ids)
                                             AND a.created_at >= p_from_ts AND a.created_at < p_to_ts), p_again);
    PERFORM courier._require_room(cardinality(v_fresh));
    WITH replayed AS (
        -- A pull message comes back without its key, as without its idempotency key.
        INSERT INTO courier.queue (endpoint_id, payload, headers, metadata, priority, ordering_key, correlation_id,
                                   payload_binary, body, visible_at)
        SELECT a.endpoint_id, a.payload, a.headers, a.metadata || jsonb_build_object('replayed_from', a.id),
               a.priority, a.ordering_key, a.correlation_id, a.payload_binary, a.body,
               courier._pull_visible_at(e.protocol, NULL)
        FROM courier.archive a JOIN courier.endpoints e ON e.id = a.endpoint_id
        WHERE a.id = ANY (v_fresh) AND a.created_at >= p_from_ts AND a.created_at < p_to_ts
        ORDER BY a.id
        RETURNING id, endpoint_id, (metadata ->> 'replayed_from')::bigint AS archive_id
    ), recorded AS (
        UPDATE courier.replayed_messages r SET message_id = c.id
        FROM replayed c WHERE r.archive_id = c.archive_id
    )
    SELECT array_agg(endpoint_id) INTO v_endpoint_ids FROM replayed;
    PERFORM courier._count_outcomes(v_endpoint_ids, 'replayed');
    RETURN coalesce(cardinality(v_endpoint_ids), 0);
END
$$;

-- Enqueues one archived message again, unless it was replayed before (by any replay) and
-- p_again is false: then the earlier copy stands, as a duplicate send's earlier message does.
-- Returns the copy's id (NULL for a copy made before its id was recorded) and whether this
-- call enqueued it.
CREATE OR REPLACE FUNCTION courier.replay_archived_message(p_archive_id bigint, p_again boolean DEFAULT false)
RETURNS TABLE (message_id bigint, enqueued boolean)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_row courier.archive;
    v_enqueued boolean;
BEGIN
    SELECT * INTO v_row FROM courier.archive a WHERE a.id = p_archive_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION '[courier] archived message % does not exist', coalesce(p_archive_id::text, 'NULL')
            USING ERRCODE = 'P0002', HINT = 'It may be in the queue still, or its partition was dropped by retention';
    END IF;
    PERFORM courier._require_endpoint(v_row.endpoint_id);
    v_enqueued := courier._replay(ARRAY[v_row.id], v_row.created_at, v_row.created_at + interval '1 microsecond',
                                  p_again) > 0;
    SELECT r.message_id INTO message_id FROM courier.replayed_messages r WHERE r.archive_id = v_row.id;
    enqueued := v_enqueued;
    IF v_enqueued THEN
        PERFORM courier._log_event('archive.replay_message', v_row.endpoint_id,
            jsonb_build_object('archive_id', v_row.id, 'message_id', message_id, 'original_status', v_row.status));
        PERFORM pg_notify('courier_new_msg', v_row.endpoint_id::text);
    END IF;
    RETURN NEXT;
END
$$;

-- The seed's replay_message: replay_archived_message's copy id.
CREATE OR REPLACE FUNCTION courier.replay_message(archive_id bigint, p_again boolean DEFAULT false) RETURNS bigint
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$ SELECT r.message_id FROM courier.replay_archived_message(replay_message.archive_id, p_again) r $$;

-- Whether an archived message of status p_archived is in a replay of status p_status. No
-- status (NULL) means every message that ended on its own: a message cancelled or purged was
-- taken out on purpose (issue 42), and a blanket replay of a time range must not send it after
-- all; naming cancelled or purged replays those.
CREATE OR REPLACE FUNCTION courier._replays_status(p_archived text, p_status text) RETURNS boolean
LANGUAGE sql IMMUTABLE
AS $$ SELECT CASE WHEN p_status IS NULL THEN p_archived NOT IN ('cancelled', 'purged') ELSE p_archived = p_status END $$;

CREATE OR REPLACE FUNCTION courier._check_replay_range(p_from_ts timestamptz, p_to_ts timestamptz, p_status text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
AS $$
BEGIN
    IF p_from_ts IS NULL OR p_to_ts IS NULL OR p_from_ts >= p_to_ts THEN
        PERFORM courier._raise_invalid(format('the replay range must have p_from_ts before p_to_ts, got %s to %s',
                                              coalesce(p_from_ts::text, 'NULL'), coalesce(p_to_ts::text, 'NULL')));
    END IF;
    IF p_status IS NOT NULL AND p_status NOT IN ('completed', 'failed', 'expired', 'cancelled', 'purged') THEN
        PERFORM courier._raise_invalid(format('p_status must be completed, failed, expired, cancelled or purged, '
                                              'got %L', p_status),
                                       'NULL replays every status but cancelled and purged');
    END IF;
END
$$;

-- What replay_range would do with this range now: how many messages it would enqueue (past
-- the cursor of an interrupted replay of the range, if any), and how many of the range's
-- messages were replayed before (by any replay), which it skips unless p_again.
CREATE OR REPLACE FUNCTION courier.count_replay_range(p_endpoint_id integer, p_from_ts timestamptz,
                                                      p_to_ts timestamptz, p_status text DEFAULT NULL,
                                                      p_again boolean DEFAULT false)
RETURNS TABLE (would_enqueue bigint, already_replayed bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_cursor bigint;
BEGIN
    PERFORM courier._require_endpoint(p_endpoint_id);
    PERFORM courier._check_replay_range(p_from_ts, p_to_ts, p_status);
    SELECT r.last_archive_id INTO v_cursor FROM courier.replays r
    WHERE r.endpoint_id = p_endpoint_id AND r.from_ts = p_from_ts AND r.to_ts = p_to_ts
      AND coalesce(r.status_filter, '') = coalesce(p_status, '') AND r.state = 'running';
    RETURN QUERY
    SELECT count(*) FILTER (WHERE a.id > coalesce(v_cursor, 0) AND (coalesce(p_again, false) OR r.archive_id IS NULL)),
           count(r.archive_id)
    FROM courier.archive a LEFT JOIN courier.replayed_messages r ON r.archive_id = a.id
    WHERE a.endpoint_id = p_endpoint_id AND a.created_at >= p_from_ts AND a.created_at < p_to_ts
      AND courier._replays_status(a.status, p_status);
END
$$;

-- Replays the endpoint's archived messages created in [p_from_ts, p_to_ts), optionally only
-- those archived with status p_status (by default all but cancelled and purged ones), oldest
-- id first; a message replayed before (by any
-- replay) is skipped unless p_again (claim_replays). Each call works on the replay of that
-- exact range that is still running, if any, so an interrupted replay resumes where it
-- stopped. p_batch_size NULL walks the whole range left in this call; a number walks at most
-- that many archived messages and returns, so a caller can run each batch in its own short
-- transaction until the replay is no longer running. p_dry_run counts what would be enqueued
-- (count_replay_range) without enqueueing. Returns the count enqueued.
CREATE OR REPLACE FUNCTION courier.replay_range(p_endpoint_id integer, p_from_ts timestamptz, p_to_ts timestamptz,
                                     p_status text DEFAULT NULL, p_batch_size integer DEFAULT NULL,
                                     p_dry_run boolean DEFAULT false, p_again boolean DEFAULT false)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_endpoint courier.endpoints := courier._require_endpoint(p_endpoint_id);
    v_replay courier.replays;
    v_chunk integer := least(coalesce(p_batch_size, 1000), 10000);
    v_limit integer;
    v_ids bigint[];
    v_seen bigint := 0;
    v_done bigint := 0;
BEGIN
    PERFORM courier._check_replay_range(p_from_ts, p_to_ts, p_status);
    IF p_batch_size IS NOT NULL AND p_batch_size < 1 THEN
        PERFORM courier._raise_invalid(format('p_batch_size must be at least 1, got %s', p_batch_size));
    END IF;
    IF p_dry_run THEN
        RETURN (SELECT c.would_enqueue FROM courier.count_replay_range(p_endpoint_id, p_from_ts, p_to_ts, p_status,
                                                                       p_again) c);
    END IF;

    SELECT * INTO v_replay FROM courier.replays r
    WHERE r.endpoint_id = p_endpoint_id AND r.from_ts = p_from_ts AND r.to_ts = p_to_ts
      AND coalesce(r.status_filter, '') = coalesce(p_status, '') AND r.state = 'running'
    FOR UPDATE;  -- a second caller of the same replay waits, then continues after our cursor

    IF v_replay.id IS NULL THEN
        INSERT INTO courier.replays (endpoint_id, from_ts, to_ts, status_filter)
        VALUES (p_endpoint_id, p_from_ts, p_to_ts, p_status)
        RETURNING * INTO v_replay;
        PERFORM courier._log_event('archive.replay_started', p_endpoint_id, jsonb_build_object(
            'replay_id', v_replay.id, 'endpoint', v_endpoint.name, 'from', p_from_ts, 'to', p_to_ts,
            'status', p_status, 'again', coalesce(p_again, false)));
    END IF;

    LOOP
        v_limit := least(v_chunk, coalesce(p_batch_size - v_seen, v_chunk));
        EXIT WHEN v_limit < 1;
        SELECT array_agg(id ORDER BY id) INTO v_ids FROM (
            SELECT a.id FROM courier.archive a
            WHERE a.endpoint_id = p_endpoint_id AND a.created_at >= p_from_ts AND a.created_at < p_to_ts
              AND courier._replays_status(a.status, p_status) AND a.id > v_replay.last_archive_id
            ORDER BY a.id
            LIMIT v_limit
        ) picked;
        EXIT WHEN v_ids IS NULL;
        v_done := v_done + courier._replay(v_ids, p_from_ts, p_to_ts, p_again);
        v_seen := v_seen + cardinality(v_ids);
        v_replay.last_archive_id := v_ids[cardinality(v_ids)];
        EXIT WHEN cardinality(v_ids) < v_limit;
    END LOOP;

    UPDATE courier.replays SET last_archive_id = v_replay.last_archive_id, replayed = replayed + v_done,
                               updated_at = now()
    WHERE id = v_replay.id
    RETURNING * INTO v_replay;

    IF v_ids IS NULL OR cardinality(v_ids) < v_limit OR p_batch_size IS NULL THEN
        UPDATE courier.replays SET state = 'finished', finished_at = now() WHERE id = v_replay.id;
        PERFORM courier._log_event('archive.replay_finished', p_endpoint_id, jsonb_build_object(
            'replay_id', v_replay.id, 'endpoint', v_endpoint.name, 'replayed', v_replay.replayed));
    END IF;
    IF v_done > 0 THEN
        PERFORM pg_notify('courier_new_msg', p_endpoint_id::text);
    END IF;
    RETURN v_done;
END
$$;
