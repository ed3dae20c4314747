-- The archive (ulak-reliability): finished messages leave the hot queue for a table
-- partitioned by month, from which they can be replayed. Delivered and dead-lettered
-- messages move there in the same statement that records their outcome; expired ones (and
-- anything finished through the older primitives) are swept by archive_completed_messages().

CREATE TABLE courier.archive (
    id              bigint NOT NULL,             -- the message's id while it was queued
    endpoint_id     integer NOT NULL,
    payload         jsonb NOT NULL,
    headers         jsonb NOT NULL DEFAULT '{}',
    metadata        jsonb NOT NULL DEFAULT '{}',
    status          text NOT NULL CHECK (status IN ('completed', 'failed', 'expired')),
    priority        smallint NOT NULL DEFAULT 0,
    retry_count     integer NOT NULL DEFAULT 0,
    max_retries     integer,
    scheduled_at    timestamptz,
    expires_at      timestamptz,
    idempotency_key text,
    correlation_id  uuid,
    ordering_key    text,
    last_error      text,
    error_history   jsonb NOT NULL DEFAULT '[]',
    worker_id       text,
    response        jsonb,
    completed_at    timestamptz NOT NULL,        -- delivered, dead-lettered or expired
    created_at      timestamptz NOT NULL,
    archived_at     timestamptz NOT NULL DEFAULT now(),
    -- Replays walk a range in id order, which this index serves partition by partition.
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);

CREATE TABLE courier.archive_default PARTITION OF courier.archive DEFAULT;

-- BRIN, as ulak measured: tiny next to a B-tree and as good for time ranges of an
-- append-mostly table.
CREATE INDEX archive_created_brin ON courier.archive USING brin (created_at)
    WITH (pages_per_range = 64, autosummarize = on);
CREATE INDEX archive_correlation_idx ON courier.archive (correlation_id) WHERE correlation_id IS NOT NULL;

-- Resumable range replays: the cursor advances in the same transaction as the messages it
-- enqueues, so an interrupted replay resumes where it stopped and never enqueues twice.
CREATE TABLE courier.replays (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    endpoint_id   integer NOT NULL,
    from_ts       timestamptz NOT NULL,
    to_ts         timestamptz NOT NULL,
    status_filter text,
    state         text NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'finished')),
    last_archive_id bigint NOT NULL DEFAULT 0,
    replayed      bigint NOT NULL DEFAULT 0,
    started_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz
);
CREATE UNIQUE INDEX replays_running_idx ON courier.replays (endpoint_id, from_ts, to_ts, coalesce(status_filter, ''))
    WHERE state = 'running';

-- The worker whose connection holds the maintenance lock records that connection here, so
-- get_worker_status() can check the lock itself rather than trust a heartbeat.
ALTER TABLE courier.workers ADD COLUMN leader_backend_pid integer;

-- Partitions ----------------------------------------------------------------------------

-- Month boundaries are UTC, whatever the session's TimeZone, so partition names and
-- bounds do not depend on who ran the maintenance.
CREATE FUNCTION courier._month_start(p_at timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE
AS $$ SELECT date_trunc('month', p_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' $$;

-- The first instant of the month a partition named archive_YYYY_MM holds.
CREATE FUNCTION courier._archive_partition_month(p_partition text) RETURNS timestamptz
LANGUAGE sql IMMUTABLE
AS $$ SELECT make_timestamptz(substr(p_partition, 9, 4)::integer, substr(p_partition, 14, 2)::integer, 1, 0, 0, 0, 'UTC') $$;

CREATE FUNCTION courier._archive_partition_name(p_month timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE
AS $$ SELECT 'archive_' || to_char(courier._month_start(p_month) AT TIME ZONE 'UTC', 'YYYY_MM') $$;

-- Creates the partition of the month containing p_month unless it exists; returns whether it
-- did. Rows of that month already in the default partition would clash with the new bounds,
-- so they step aside into a temporary table and come back through the parent.
CREATE FUNCTION courier._ensure_archive_partition(p_month timestamptz) RETURNS boolean
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
    PERFORM pg_advisory_xact_lock(hashtext('courier.archive_partitions'));
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
CREATE FUNCTION courier.maintain_archive_partitions(months_ahead integer DEFAULT 3) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
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

-- Drops monthly partitions that ended more than retention_months (default: the setting
-- archive_retention_months) before the start of this month, and deletes default-partition
-- rows that old; returns how many partitions it dropped. Dropping a partition costs the same
-- at any size, unlike deleting its rows.
CREATE FUNCTION courier.cleanup_old_archive_partitions(retention_months integer DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_months integer := coalesce(retention_months, courier._setting_int('archive_retention_months')::integer);
    v_cutoff timestamptz;
    v_partition text;
    v_dropped text[] := '{}';
    v_deleted bigint;
BEGIN
    IF v_months NOT BETWEEN 1 AND 120 THEN
        PERFORM courier._raise_invalid(format('retention_months must be between 1 and 120, got %s', v_months));
    END IF;
    v_cutoff := courier._month_start(now()) - make_interval(months => v_months);
    FOR v_partition IN
        SELECT c.relname FROM pg_inherits i
        JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'courier.archive'::regclass AND c.relname ~ '^archive_[0-9]{4}_[0-9]{2}$'
          AND courier._archive_partition_month(c.relname) < v_cutoff
        ORDER BY c.relname
    LOOP
        EXECUTE format('DROP TABLE courier.%I', v_partition);
        v_dropped := v_dropped || v_partition;
    END LOOP;
    DELETE FROM courier.archive_default WHERE created_at < v_cutoff;
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    IF cardinality(v_dropped) > 0 OR v_deleted > 0 THEN
        PERFORM courier._log_event('archive.partitions_dropped', NULL, jsonb_build_object(
            'partitions', v_dropped, 'default_rows_deleted', v_deleted, 'retention_months', v_months));
    END IF;
    RETURN cardinality(v_dropped);
END
$$;

-- Partitions with their sizes. Row counts are the planner's estimates, which stay free at
-- any size (`courier archive partitions --exact` counts instead).
CREATE FUNCTION courier.archive_partitions()
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
CREATE FUNCTION courier.count_archive_partition(p_partition text) RETURNS bigint
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
CREATE FUNCTION courier._archive_messages(p_ids bigint[], p_from_statuses text[], p_status text DEFAULT NULL,
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
                                 created_at)
    SELECT m.id, m.endpoint_id, m.payload, m.headers, m.metadata, coalesce(p_status, m.status), m.priority,
           m.retry_count, m.max_retries, m.scheduled_at, m.expires_at, m.idempotency_key, m.correlation_id,
           m.ordering_key, m.last_error, m.error_history, m.worker_id, coalesce(r.response, m.response),
           coalesce(m.completed_at, now()), m.created_at
    FROM moved m
    LEFT JOIN unnest(p_ids, p_responses) AS r(id, response) ON r.id = m.id AND p_responses IS NOT NULL;
    GET DIAGNOSTICS v_moved = ROW_COUNT;
    RETURN v_moved;
END
$$;

-- Adds one to outcome p_outcome's counter of each endpoint, once per element of p_endpoint_ids
-- (an endpoint per message): the counters behind metrics()' *_total series.
CREATE FUNCTION courier._count_outcomes(p_endpoint_ids integer[], p_outcome text) RETURNS void
LANGUAGE sql
AS $$
    INSERT INTO courier.delivery_totals AS d (endpoint_id, outcome, backend_pid, total)
    SELECT endpoint_id, p_outcome, pg_backend_pid(), count(*)
    FROM unnest(p_endpoint_ids) AS endpoint_id GROUP BY endpoint_id
    ON CONFLICT (endpoint_id, outcome, backend_pid) DO UPDATE SET total = d.total + excluded.total
$$;

-- Dead-letters messages (by id, in any state): the DLQ gets the whole message with its
-- history, and the archive records it as failed; returns how many.
CREATE OR REPLACE FUNCTION courier._dead_letter(p_ids bigint[]) RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    v_endpoint_ids integer[];
BEGIN
    WITH dead AS (
        INSERT INTO courier.dlq (original_message_id, endpoint_id, endpoint_name, payload, headers, metadata,
                                 priority, ordering_key, idempotency_key, correlation_id, scheduled_at, expires_at,
                                 retry_count, last_error, error_history, original_created_at)
        SELECT m.id, m.endpoint_id, coalesce(e.name, '#' || m.endpoint_id), m.payload, m.headers, m.metadata,
               m.priority, m.ordering_key, m.idempotency_key, m.correlation_id, m.scheduled_at, m.expires_at,
               m.retry_count, m.last_error, m.error_history, m.created_at
        FROM courier.queue m LEFT JOIN courier.endpoints e ON e.id = m.endpoint_id
        WHERE m.id = ANY (p_ids)
        ORDER BY m.id
        RETURNING endpoint_id
    )
    SELECT array_agg(endpoint_id) INTO v_endpoint_ids FROM dead;
    PERFORM courier._count_outcomes(v_endpoint_ids, 'dead_lettered');
    RETURN courier._archive_messages(p_ids, NULL, 'failed');
END
$$;

-- The same policy as before (see 0008), except that a delivered message is archived at once
-- instead of being marked completed in place: one write per message instead of two, and the
-- hot table holds only active messages.
CREATE OR REPLACE FUNCTION courier.report_outcomes_v1(p_ids bigint[], p_outcomes text[], p_errors text[],
                                                      p_retry_after integer[] DEFAULT NULL,
                                                      p_responses jsonb[] DEFAULT NULL)
RETURNS TABLE (delivered integer, retried integer, dead_lettered integer)
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
    v_n integer := coalesce(cardinality(p_ids), 0);
    v_bad text;
    v_success_ids bigint[];
    v_success_responses jsonb[];
    v_failed_ids bigint[];
    v_failed_outcomes text[];
    v_failed_errors text[];
    v_failed_delays integer[];
    v_failed_retry_after integer[];
    v_dead_ids bigint[];
    v_endpoints jsonb;
    v_endpoint jsonb;
    v_default_max_retries integer := courier._setting_int('default_max_retries');
BEGIN
    IF v_n IS DISTINCT FROM coalesce(cardinality(p_outcomes), 0) OR v_n IS DISTINCT FROM coalesce(cardinality(p_errors), 0)
       OR v_n IS DISTINCT FROM coalesce(cardinality(p_retry_after), v_n)
       OR v_n IS DISTINCT FROM coalesce(cardinality(p_responses), v_n) THEN
        RAISE EXCEPTION '[courier] report_outcomes_v1 needs one outcome, error, retry-after and response per id'
            USING ERRCODE = '22023';
    END IF;
    SELECT string_agg(DISTINCT coalesce(o, 'NULL'), ', ') INTO v_bad FROM unnest(p_outcomes) AS o
    WHERE o IS NULL OR o NOT IN ('success', 'retryable', 'permanent', 'disable');
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION '[courier] unknown outcome(s): %', v_bad
            USING ERRCODE = '22023', HINT = 'Outcomes are success, retryable, permanent and disable';
    END IF;

    -- Decide everything up front from one read of the claimed rows.
    WITH reported AS (
        SELECT u.id, u.outcome, u.error, u.response, q.endpoint_id,
               CASE WHEN u.retry_after IS NOT NULL THEN least(greatest(u.retry_after, 0), 86400) END AS retry_after,
               q.retry_count + 1 > coalesce(q.max_retries, (e.retry_policy ->> 'max_retries')::integer,
                                            v_default_max_retries) AS exhausted,
               CASE WHEN u.outcome = 'retryable' THEN
                   CASE WHEN u.retry_after IS NOT NULL THEN least(greatest(u.retry_after, 0), 86400)
                        ELSE courier.retry_delay(e.retry_policy, q.retry_count) END
               END AS delay
        FROM unnest(p_ids, p_outcomes, p_errors,
                    coalesce(p_retry_after, array_fill(NULL::integer, ARRAY[v_n])),
                    coalesce(p_responses, array_fill(NULL::jsonb, ARRAY[v_n])))
             AS u(id, outcome, error, retry_after, response)
        JOIN courier.queue q ON q.id = u.id AND q.status = 'processing'
        JOIN courier.endpoints e ON e.id = q.endpoint_id
    ),
    per_endpoint AS (
        SELECT r.endpoint_id, e.name, e.config,
               count(*) FILTER (WHERE r.outcome = 'success') AS successes,
               count(*) FILTER (WHERE r.outcome = 'retryable') AS failures,
               count(*) FILTER (WHERE r.outcome <> 'success') AS all_failures,
               bool_or(r.outcome = 'disable') AS gone,
               (array_agg(r.error ORDER BY r.id DESC) FILTER (WHERE r.outcome <> 'success'))[1] AS last_error
        FROM reported r JOIN courier.endpoints e ON e.id = r.endpoint_id
        GROUP BY r.endpoint_id, e.name, e.config
    )
    SELECT array_agg(id ORDER BY id) FILTER (WHERE outcome = 'success'),
           array_agg(response ORDER BY id) FILTER (WHERE outcome = 'success'),
           array_agg(id ORDER BY id) FILTER (WHERE outcome <> 'success'),
           array_agg(outcome ORDER BY id) FILTER (WHERE outcome <> 'success'),
           array_agg(error ORDER BY id) FILTER (WHERE outcome <> 'success'),
           array_agg(delay ORDER BY id) FILTER (WHERE outcome <> 'success'),
           array_agg(retry_after ORDER BY id) FILTER (WHERE outcome <> 'success'),
           array_agg(id ORDER BY id) FILTER (WHERE outcome IN ('permanent', 'disable')
                                                  OR (outcome = 'retryable' AND exhausted)),
           (SELECT jsonb_agg(to_jsonb(p)) FROM per_endpoint p)
    INTO v_success_ids, v_success_responses, v_failed_ids, v_failed_outcomes, v_failed_errors,
         v_failed_delays, v_failed_retry_after, v_dead_ids, v_endpoints
    FROM reported;

    IF v_success_ids IS NOT NULL THEN
        -- Delivered messages go straight to the archive with their captured responses. Only
        -- rows still in processing count, so a late report after stale recovery is void.
        delivered := courier._archive_messages(v_success_ids, '{processing}', 'completed', v_success_responses);
    ELSE
        delivered := 0;
    END IF;
    IF v_failed_ids IS NULL THEN  -- the common case: skip the failure statements altogether
        retried := 0;
        dead_lettered := 0;
    ELSE
        -- Every failure lands in the message's history first, so a DLQ row carries it too.
        UPDATE courier.queue q
        SET retry_count = q.retry_count + 1,
            last_error = f.error,
            error_history = q.error_history || jsonb_strip_nulls(jsonb_build_object(
                'attempt', q.retry_count + 1, 'at', now(), 'outcome', f.outcome, 'error', f.error,
                'worker_id', q.worker_id, 'retry_after', f.retry_after)),
            status = 'pending', processing_started_at = NULL,
            next_retry_at = now() + make_interval(secs => coalesce(f.delay, 0)),
            updated_at = now()
        FROM unnest(v_failed_ids, v_failed_outcomes, v_failed_errors, v_failed_delays, v_failed_retry_after)
             AS f(id, outcome, error, delay, retry_after)
        WHERE q.id = f.id AND q.id = ANY (v_failed_ids);

        dead_lettered := CASE WHEN v_dead_ids IS NULL THEN 0 ELSE courier._dead_letter(v_dead_ids) END;
        retried := cardinality(v_failed_ids) - dead_lettered;
    END IF;

    FOR v_endpoint IN SELECT value FROM jsonb_array_elements(coalesce(v_endpoints, '[]')) LOOP
        UPDATE courier.endpoints
        SET last_success_at = CASE WHEN (v_endpoint ->> 'successes')::integer > 0 THEN now() ELSE last_success_at END,
            last_failure_at = CASE WHEN (v_endpoint ->> 'all_failures')::integer > 0 THEN now() ELSE last_failure_at END,
            last_error = coalesce(v_endpoint ->> 'last_error', last_error)
        WHERE id = (v_endpoint ->> 'endpoint_id')::integer;
        PERFORM courier._update_circuit_breaker((v_endpoint ->> 'endpoint_id')::integer,
                                                (v_endpoint ->> 'successes')::integer,
                                                (v_endpoint ->> 'failures')::integer);
        PERFORM courier._add_delivery_totals((v_endpoint ->> 'endpoint_id')::integer, 'delivered',
                                             (v_endpoint ->> 'successes')::bigint);
        PERFORM courier._add_delivery_totals((v_endpoint ->> 'endpoint_id')::integer, 'failed_attempt',
                                             (v_endpoint ->> 'all_failures')::bigint);
        IF (v_endpoint ->> 'gone')::boolean
           AND coalesce((v_endpoint #>> '{config,auto_disable_on_gone}')::boolean, false) THEN
            UPDATE courier.endpoints SET enabled = false, updated_at = now()
            WHERE id = (v_endpoint ->> 'endpoint_id')::integer AND enabled;
            IF FOUND THEN
                PERFORM courier._log_event('endpoint.auto_disabled', (v_endpoint ->> 'endpoint_id')::integer,
                    jsonb_build_object('name', v_endpoint ->> 'name', 'reason', v_endpoint ->> 'last_error'));
            END IF;
        END IF;
    END LOOP;
    RETURN NEXT;
END
$$;

-- Moves up to batch_size finished messages (completed, failed, expired) that finished more
-- than older_than_seconds ago into the archive; returns how many. Call it until it returns
-- less than batch_size; the maintenance leader does.
CREATE FUNCTION courier.archive_completed_messages(older_than_seconds integer DEFAULT 3600,
                                                   batch_size integer DEFAULT 1000)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
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
CREATE FUNCTION courier.mark_expired_messages(p_batch_size integer DEFAULT 10000) RETURNS integer
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
        WHERE q.id IN (SELECT id FROM courier.queue
                       WHERE status = 'pending' AND expires_at <= now()
                       ORDER BY expires_at LIMIT greatest(p_batch_size, 1)
                       FOR UPDATE SKIP LOCKED)
          AND q.status = 'pending'
        RETURNING q.endpoint_id
    )
    SELECT array_agg(endpoint_id) INTO v_endpoint_ids FROM expired;
    PERFORM courier._count_outcomes(v_endpoint_ids, 'expired');
    RETURN coalesce(cardinality(v_endpoint_ids), 0);
END
$$;

-- Replay ----------------------------------------------------------------------------------

CREATE FUNCTION courier._require_room(p_incoming bigint) RETURNS void
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF NOT courier._has_room(p_incoming) THEN
        RAISE EXCEPTION '[courier] Queue backpressure: % more message(s) would exceed max_queue_size %',
                p_incoming, courier._setting_int('max_queue_size')
            USING ERRCODE = '53400',
                  HINT = 'Wait for workers to drain the queue, then run the replay again to resume';
    END IF;
END
$$;

CREATE FUNCTION courier._require_endpoint(p_endpoint_id integer) RETURNS courier.endpoints
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_endpoint courier.endpoints;
BEGIN
    SELECT * INTO v_endpoint FROM courier.endpoints WHERE id = p_endpoint_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION '[courier] endpoint id % does not exist', coalesce(p_endpoint_id::text, 'NULL')
            USING ERRCODE = 'P0002', HINT = 'Recreate the endpoint, or list them with `courier endpoint list`';
    END IF;
    RETURN v_endpoint;
END
$$;

-- Enqueues archived messages again as new pending messages, in their original order, with
-- their idempotency key and expiry cleared (ulak) and metadata.replayed_from naming the
-- archived id; returns how many it enqueued.
CREATE FUNCTION courier._replay(p_archive_ids bigint[], p_from_ts timestamptz, p_to_ts timestamptz)
RETURNS integer
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
    v_endpoint_ids integer[];
BEGIN
    PERFORM courier._require_room(cardinality(p_archive_ids));
    WITH replayed AS (
        INSERT INTO courier.queue (endpoint_id, payload, headers, metadata, priority, ordering_key, correlation_id)
        SELECT a.endpoint_id, a.payload, a.headers, a.metadata || jsonb_build_object('replayed_from', a.id),
               a.priority, a.ordering_key, a.correlation_id
        FROM courier.archive a
        WHERE a.id = ANY (p_archive_ids) AND a.created_at >= p_from_ts AND a.created_at < p_to_ts
        ORDER BY a.id
        RETURNING endpoint_id
    )
    SELECT array_agg(endpoint_id) INTO v_endpoint_ids FROM replayed;
    PERFORM courier._count_outcomes(v_endpoint_ids, 'replayed');
    RETURN coalesce(cardinality(v_endpoint_ids), 0);
END
$$;

CREATE FUNCTION courier.replay_message(archive_id bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_row courier.archive;
    v_message_id bigint;
BEGIN
    SELECT * INTO v_row FROM courier.archive a WHERE a.id = replay_message.archive_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION '[courier] archived message % does not exist', replay_message.archive_id
            USING ERRCODE = 'P0002', HINT = 'It may be in the queue still, or its partition was dropped by retention';
    END IF;
    PERFORM courier._require_endpoint(v_row.endpoint_id);
    PERFORM courier._replay(ARRAY[v_row.id], v_row.created_at, v_row.created_at + interval '1 microsecond');
    v_message_id := currval(pg_get_serial_sequence('courier.queue', 'id'));
    PERFORM courier._log_event('archive.replay_message', v_row.endpoint_id,
        jsonb_build_object('archive_id', v_row.id, 'message_id', v_message_id, 'original_status', v_row.status));
    PERFORM pg_notify('courier_new_msg', v_row.endpoint_id::text);
    RETURN v_message_id;
END
$$;

-- Replays the endpoint's archived messages created in [p_from_ts, p_to_ts), optionally only
-- those archived with status p_status, oldest id first. Each call works on the replay of
-- that exact range that is still running, if any, so an interrupted replay resumes where
-- it stopped. p_batch_size NULL replays everything left in this call; a number replays at
-- most that many and returns, so a caller can run each batch in its own short
-- transaction. p_dry_run counts what is left without enqueueing. Returns the count.
CREATE FUNCTION courier.replay_range(p_endpoint_id integer, p_from_ts timestamptz, p_to_ts timestamptz,
                                     p_status text DEFAULT NULL, p_batch_size integer DEFAULT NULL,
                                     p_dry_run boolean DEFAULT false)
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
    v_done bigint := 0;
BEGIN
    IF p_from_ts IS NULL OR p_to_ts IS NULL OR p_from_ts >= p_to_ts THEN
        PERFORM courier._raise_invalid(format('the replay range must have p_from_ts before p_to_ts, got %s to %s',
                                              coalesce(p_from_ts::text, 'NULL'), coalesce(p_to_ts::text, 'NULL')));
    END IF;
    IF p_status IS NOT NULL AND p_status NOT IN ('completed', 'failed', 'expired') THEN
        PERFORM courier._raise_invalid(format('p_status must be completed, failed or expired, got %L', p_status),
                                       'NULL replays every status');
    END IF;
    IF p_batch_size IS NOT NULL AND p_batch_size < 1 THEN
        PERFORM courier._raise_invalid(format('p_batch_size must be at least 1, got %s', p_batch_size));
    END IF;

    SELECT * INTO v_replay FROM courier.replays r
    WHERE r.endpoint_id = p_endpoint_id AND r.from_ts = p_from_ts AND r.to_ts = p_to_ts
      AND coalesce(r.status_filter, '') = coalesce(p_status, '') AND r.state = 'running'
    FOR UPDATE;  -- a second caller of the same replay waits, then continues after our cursor

    IF p_dry_run THEN
        RETURN (SELECT count(*) FROM courier.archive a
                WHERE a.endpoint_id = p_endpoint_id AND a.created_at >= p_from_ts AND a.created_at < p_to_ts
                  AND (p_status IS NULL OR a.status = p_status) AND a.id > coalesce(v_replay.last_archive_id, 0));
    END IF;

    IF v_replay.id IS NULL THEN
        INSERT INTO courier.replays (endpoint_id, from_ts, to_ts, status_filter)
        VALUES (p_endpoint_id, p_from_ts, p_to_ts, p_status)
        RETURNING * INTO v_replay;
        PERFORM courier._log_event('archive.replay_started', p_endpoint_id, jsonb_build_object(
            'replay_id', v_replay.id, 'endpoint', v_endpoint.name, 'from', p_from_ts, 'to', p_to_ts,
            'status', p_status));
    END IF;

    LOOP
        v_limit := least(v_chunk, coalesce(p_batch_size - v_done, v_chunk));
        SELECT array_agg(id ORDER BY id) INTO v_ids FROM (
            SELECT a.id FROM courier.archive a
            WHERE a.endpoint_id = p_endpoint_id AND a.created_at >= p_from_ts AND a.created_at < p_to_ts
              AND (p_status IS NULL OR a.status = p_status) AND a.id > v_replay.last_archive_id
            ORDER BY a.id
            LIMIT v_limit
        ) picked;
        EXIT WHEN v_ids IS NULL;
        v_done := v_done + courier._replay(v_ids, p_from_ts, p_to_ts);
        v_replay.last_archive_id := v_ids[cardinality(v_ids)];
        EXIT WHEN cardinality(v_ids) < v_limit OR v_done >= coalesce(p_batch_size, v_done + 1);
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

-- Retention of the event log and the counters ------------------------------------------------

CREATE FUNCTION courier.cleanup_event_log() RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_deleted integer;
BEGIN
    DELETE FROM courier.event_log
    WHERE created_at < now() - make_interval(days => courier._setting_int('event_log_retention_days')::integer);
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    IF v_deleted > 0 THEN
        PERFORM courier._log_event('event_log.cleanup', NULL, jsonb_build_object('deleted', v_deleted));
    END IF;
    RETURN v_deleted;
END
$$;

-- compact_queue_depth() now folds the DLQ counters too.
CREATE OR REPLACE FUNCTION courier.compact_queue_depth() RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_folded integer;
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext('courier.compact_queue_depth')) THEN
        RETURN 0;
    END IF;

    WITH gone AS (
        DELETE FROM courier.queue_depth
        WHERE backend_pid <> 0
          AND backend_pid NOT IN (SELECT pid FROM pg_stat_activity WHERE pid IS NOT NULL)
        RETURNING endpoint_id, status, messages
    )
    INSERT INTO courier.queue_depth AS d (endpoint_id, status, backend_pid, messages)
    SELECT endpoint_id, status, 0, sum(messages) FROM gone GROUP BY endpoint_id, status
    ON CONFLICT (endpoint_id, status, backend_pid)
    DO UPDATE SET messages = d.messages + excluded.messages;
    GET DIAGNOSTICS v_folded = ROW_COUNT;

    WITH gone AS (
        DELETE FROM courier.dlq_depth
        WHERE backend_pid <> 0
          AND backend_pid NOT IN (SELECT pid FROM pg_stat_activity WHERE pid IS NOT NULL)
        RETURNING endpoint_id, status, messages
    )
    INSERT INTO courier.dlq_depth AS d (endpoint_id, status, backend_pid, messages)
    SELECT endpoint_id, status, 0, sum(messages) FROM gone GROUP BY endpoint_id, status
    ON CONFLICT (endpoint_id, status, backend_pid)
    DO UPDATE SET messages = d.messages + excluded.messages;

    WITH gone AS (
        DELETE FROM courier.delivery_totals
        WHERE backend_pid <> 0
          AND backend_pid NOT IN (SELECT pid FROM pg_stat_activity WHERE pid IS NOT NULL)
        RETURNING endpoint_id, outcome, total
    )
    INSERT INTO courier.delivery_totals AS d (endpoint_id, outcome, backend_pid, total)
    SELECT endpoint_id, outcome, 0, sum(total) FROM gone GROUP BY endpoint_id, outcome
    ON CONFLICT (endpoint_id, outcome, backend_pid)
    DO UPDATE SET total = d.total + excluded.total;

    DELETE FROM courier.queue_depth WHERE backend_pid = 0 AND messages = 0;
    DELETE FROM courier.dlq_depth WHERE backend_pid = 0 AND messages = 0;
    RETURN v_folded;
END
$$;

-- The maintenance leader --------------------------------------------------------------------

-- Tries to make the calling connection the maintenance leader: a session advisory lock,
-- held until that connection ends, so a dead leader's lock is released with its
-- connection and another worker wins the next election. Returns whether it won.
CREATE FUNCTION courier.try_lead_maintenance_v1(p_worker_id text) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
AS $$
BEGIN
    IF NOT pg_try_advisory_lock(1668248946, 2) THEN  -- ('cour', 2): Courier's maintenance lock
        RETURN false;
    END IF;
    UPDATE courier.workers SET leader_backend_pid = NULL WHERE leader_backend_pid IS NOT NULL;
    UPDATE courier.workers SET leader_backend_pid = pg_backend_pid() WHERE worker_id = p_worker_id;
    PERFORM courier._log_event('maintenance.leader_elected', NULL,
        jsonb_build_object('worker_id', p_worker_id, 'backend_pid', pg_backend_pid()));
    RETURN true;
END
$$;

DROP FUNCTION courier.get_worker_status();
CREATE FUNCTION courier.get_worker_status()
RETURNS TABLE (worker_id text, hostname text, pid integer, state text, concurrency integer, in_flight integer,
               delivered bigint, failed bigint, started_at timestamptz, last_heartbeat timestamptz, alive boolean,
               maintenance_leader boolean)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
    SELECT w.worker_id, w.hostname, w.pid, w.state, w.concurrency, w.in_flight, w.delivered, w.failed,
           w.started_at, w.last_heartbeat,
           w.state <> 'stopped' AND w.last_heartbeat > now() - interval '30 seconds',
           w.leader_backend_pid IS NOT NULL AND EXISTS (
               SELECT 1 FROM pg_locks l
               WHERE l.locktype = 'advisory' AND l.granted AND l.pid = w.leader_backend_pid
                 AND l.classid = 1668248946 AND l.objid = 2 AND l.objsubid = 2
                 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))
    FROM courier.workers w
    ORDER BY w.started_at
$$;

-- Observability --------------------------------------------------------------------------------

-- metrics() gains the dead-letter, expiry and replay counters, the archive and the leader.
CREATE OR REPLACE FUNCTION courier.metrics()
RETURNS TABLE (metric_name text, metric_value double precision, labels jsonb, metric_type text)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
    WITH depth AS (SELECT * FROM courier._depth_by_endpoint()),
    statuses AS (SELECT unnest(ARRAY['pending', 'processing', 'completed', 'failed', 'expired']) AS status),
    dlq AS (SELECT endpoint_id, status, sum(messages) AS messages FROM courier.dlq_depth GROUP BY 1, 2),
    workers AS (SELECT * FROM courier.get_worker_status())
    SELECT 'queue_depth', coalesce(sum(d.messages), 0)::double precision,
           jsonb_build_object('status', s.status), 'gauge'
    FROM statuses s LEFT JOIN depth d ON d.status = s.status
    GROUP BY s.status
    UNION ALL
    SELECT 'queue_depth_by_endpoint', coalesce(d.messages, 0)::double precision,
           jsonb_build_object('endpoint', e.name, 'status', s.status), 'gauge'
    FROM courier.endpoints e CROSS JOIN statuses s
    LEFT JOIN depth d ON d.endpoint_id = e.id AND d.status = s.status
    UNION ALL
    SELECT 'oldest_message_age_seconds',
           coalesce(extract(epoch FROM now() - min(courier._oldest_pending_at(e.id))), 0)::double precision,
           '{}'::jsonb, 'gauge'
    FROM courier.endpoints e
    UNION ALL
    SELECT 'dlq_depth', coalesce(d.messages, 0)::double precision,
           jsonb_build_object('endpoint', e.name, 'status', s.status), 'gauge'
    FROM courier.endpoints e CROSS JOIN (VALUES ('failed'), ('redriven')) AS s(status)
    LEFT JOIN dlq d ON d.endpoint_id = e.id AND d.status = s.status
    UNION ALL
    SELECT 'endpoint_circuit_state',
           CASE e.circuit_state WHEN 'closed' THEN 0 WHEN 'half_open' THEN 1 ELSE 2 END,
           jsonb_build_object('endpoint', e.name), 'gauge'
    FROM courier.endpoints e
    UNION ALL
    SELECT 'endpoint_enabled', e.enabled::integer, jsonb_build_object('endpoint', e.name), 'gauge'
    FROM courier.endpoints e
    UNION ALL
    SELECT o.metric, coalesce(sum(t.total), 0)::double precision,
           jsonb_build_object('endpoint', e.name), 'counter'
    FROM courier.endpoints e
    CROSS JOIN (VALUES ('delivered', 'messages_delivered_total'),
                       ('failed_attempt', 'delivery_failures_total'),
                       ('dead_lettered', 'messages_dead_lettered_total'),
                       ('expired', 'messages_expired_total'),
                       ('replayed', 'messages_replayed_total')) AS o(outcome, metric)
    LEFT JOIN courier.delivery_totals t ON t.endpoint_id = e.id AND t.outcome = o.outcome
    GROUP BY e.name, o.metric
    UNION ALL
    SELECT 'workers_alive', count(*) FILTER (WHERE w.alive)::double precision, '{}'::jsonb, 'gauge'
    FROM workers w
    UNION ALL
    SELECT 'maintenance_leader_present', coalesce(bool_or(w.maintenance_leader AND w.alive), false)::integer::double precision,
           '{}'::jsonb, 'gauge'
    FROM workers w
    UNION ALL
    SELECT 'archive_partitions', count(*)::double precision, '{}'::jsonb, 'gauge'
    FROM pg_inherits i WHERE i.inhparent = 'courier.archive'::regclass
$$;

-- One row per check, each 'ok', 'warning' or 'critical', for load balancers and alerting.
-- Every check reads maintained counters, catalogs or index probes.
CREATE FUNCTION courier.health_check()
RETURNS TABLE (check_name text, status text, value double precision, detail text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_limit bigint := courier._setting_int('max_queue_size');
    v_active bigint;
    v_pending bigint;
    v_oldest timestamptz;
    v_alive integer;
    v_leader boolean;
    v_names text;
    v_count bigint;
BEGIN
    SELECT coalesce(sum(messages) FILTER (WHERE d.status IN ('pending', 'processing')), 0),
           coalesce(sum(messages) FILTER (WHERE d.status = 'pending'), 0)
    INTO v_active, v_pending FROM courier.queue_depth d;

    check_name := 'backpressure';
    value := CASE WHEN v_limit = 0 THEN 0 ELSE round(100.0 * v_active / v_limit, 1) END;
    status := CASE WHEN v_limit = 0 OR value < 80 THEN 'ok' WHEN value < 95 THEN 'warning' ELSE 'critical' END;
    detail := CASE WHEN v_limit = 0 THEN format('%s active message(s); max_queue_size is off', v_active)
                   ELSE format('%s of max_queue_size %s in use (%s%%)', v_active, v_limit, value) END;
    RETURN NEXT;

    SELECT min(courier._oldest_pending_at(e.id)) INTO v_oldest FROM courier.endpoints e WHERE e.enabled;
    check_name := 'oldest_pending';
    value := coalesce(extract(epoch FROM now() - v_oldest), 0);
    status := CASE WHEN value < 300 THEN 'ok' WHEN value < 3600 THEN 'warning' ELSE 'critical' END;
    detail := CASE WHEN v_oldest IS NULL THEN 'nothing pending on enabled endpoints'
                   ELSE format('oldest pending message is %s s old', round(value::numeric)) END;
    RETURN NEXT;

    SELECT count(*) FILTER (WHERE w.alive), coalesce(bool_or(w.alive AND w.maintenance_leader), false)
    INTO v_alive, v_leader FROM courier.get_worker_status() w;
    check_name := 'workers';
    value := v_alive;
    status := CASE WHEN v_alive > 0 THEN 'ok' WHEN v_pending > 0 THEN 'critical' ELSE 'warning' END;
    detail := format('%s worker(s) alive, %s message(s) pending', v_alive, v_pending);
    RETURN NEXT;

    check_name := 'maintenance_leader';
    value := v_leader::integer;
    status := CASE WHEN v_leader OR v_alive = 0 THEN 'ok' ELSE 'warning' END;
    detail := CASE WHEN v_leader THEN 'a live worker holds the maintenance lock'
                   WHEN v_alive = 0 THEN 'no workers running'
                   ELSE 'workers are alive but none leads maintenance' END;
    RETURN NEXT;

    SELECT count(*), string_agg(e.name, ', ' ORDER BY e.name) INTO v_count, v_names
    FROM courier.endpoints e WHERE e.enabled AND e.circuit_state <> 'closed';
    check_name := 'circuits';
    value := v_count;
    status := CASE WHEN v_count = 0 THEN 'ok' ELSE 'warning' END;
    detail := CASE WHEN v_count = 0 THEN 'every circuit is closed' ELSE 'not closed: ' || v_names END;
    RETURN NEXT;

    SELECT coalesce(sum(messages), 0) INTO v_count FROM courier.dlq_depth WHERE dlq_depth.status = 'failed';
    check_name := 'dlq';
    value := v_count;
    status := CASE WHEN v_count = 0 THEN 'ok' ELSE 'warning' END;
    detail := format('%s dead-lettered message(s) awaiting redrive or cleanup', v_count);
    RETURN NEXT;

    SELECT count(*) INTO v_count FROM (
        SELECT 1 FROM courier.queue q
        WHERE q.status = 'processing'
          AND q.processing_started_at < now() - make_interval(secs => courier._setting_int('stale_recovery_timeout'))
        LIMIT 1000) stale;
    check_name := 'stale_processing';
    value := v_count;
    status := CASE WHEN v_count = 0 THEN 'ok' ELSE 'warning' END;
    detail := CASE WHEN v_count = 0 THEN 'no message is stuck in processing'
                   ELSE format('%s%s message(s) in processing past stale_recovery_timeout',
                               v_count, CASE WHEN v_count = 1000 THEN '+' ELSE '' END) END;
    RETURN NEXT;

    check_name := 'archive_partitions';
    v_names := concat_ws(', ',
        CASE WHEN to_regclass('courier.' || courier._archive_partition_name(now())) IS NULL THEN 'this month' END,
        CASE WHEN to_regclass('courier.' || courier._archive_partition_name(now() + interval '1 month')) IS NULL
             THEN 'next month' END);
    SELECT count(*) INTO v_count FROM (SELECT 1 FROM courier.archive_default LIMIT 1) d;
    value := v_count;
    status := CASE WHEN v_names <> '' AND v_names LIKE 'this month%' THEN 'critical'
                   WHEN v_names <> '' OR v_count > 0 THEN 'warning' ELSE 'ok' END;
    detail := CASE WHEN v_names <> '' THEN 'missing partition for ' || v_names
                   WHEN v_count > 0 THEN 'rows are waiting in archive_default; run maintain_archive_partitions()'
                   ELSE 'partitions exist for this month and the next' END;
    RETURN NEXT;
END
$$;

-- ulak pre-creates this month's partition and three more.
SELECT courier.maintain_archive_partitions(3);
