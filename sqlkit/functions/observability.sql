-- Observability: metrics() in ulak's shape and get_endpoint_health(). Every depth comes from
-- the maintained counters and every age from an index probe, so both stay cheap at any size.

-- Since when the oldest due pending message of one endpoint has been waiting: its created_at,
-- or its scheduled_at when it was scheduled, so that a message scheduled for later is not
-- "old" (health_check raised alarms on them).
-- - Push messages: per priority level, the lowest due id of each of the two indexes that hold
--   the pending ones between them, one probe of queue_ready_idx and one of
--   queue_pending_rest_idx (push messages only since migration 0040). The second still steps over push messages scheduled for later
--   (about 16 ms for 100k of them), which a due-ordered probe would not.
-- - Pull messages: per priority level, the first pending one of queue_pull_due_idx, in due
--   order, up to now. They
--   used to come from queue_pending_rest_idx too, where a topic with 500k messages scheduled
--   for tomorrow made get_endpoint_health take 0.7-1 s and metrics() 1.3 s.
CREATE OR REPLACE FUNCTION courier._oldest_pending_at(p_endpoint_id integer) RETURNS timestamptz
LANGUAGE sql STABLE
SET search_path = pg_catalog, courier, pg_temp
AS $$
    SELECT greatest(q.created_at, q.scheduled_at)
    FROM (
        SELECT h.id, h.created_at, h.scheduled_at
        FROM generate_series(0, 10) AS p(priority)
        CROSS JOIN LATERAL (
            (SELECT id, created_at, scheduled_at FROM courier.queue
             WHERE endpoint_id = p_endpoint_id AND status = 'pending' AND priority = p.priority
               AND scheduled_at IS NULL AND next_retry_at IS NULL AND visible_at IS NULL
             ORDER BY priority DESC, id LIMIT 1)
            UNION ALL
            (SELECT id, created_at, scheduled_at FROM courier.queue
             WHERE endpoint_id = p_endpoint_id AND status = 'pending' AND priority = p.priority
               AND (scheduled_at IS NOT NULL OR next_retry_at IS NOT NULL) AND visible_at IS NULL
               AND (scheduled_at IS NULL OR scheduled_at <= now())
             ORDER BY priority DESC, id LIMIT 1)
        ) h
        UNION ALL
        SELECT l.id, l.created_at, l.scheduled_at
        FROM generate_series(0, 10) AS p(priority)
        CROSS JOIN LATERAL (
            SELECT id, created_at, scheduled_at FROM courier.queue
            WHERE endpoint_id = p_endpoint_id AND priority = p.priority
              AND visible_at <= now() AND visible_at IS NOT NULL
              AND status = 'pending'  -- queue_pull_due_idx holds no lease, lapsed or not
            ORDER BY visible_at, id LIMIT 1) l
    ) q
    ORDER BY q.id LIMIT 1
$$;

CREATE OR REPLACE FUNCTION courier._depth_by_endpoint()
RETURNS TABLE (endpoint_id integer, status text, messages bigint)
LANGUAGE sql STABLE
SET search_path = pg_catalog, courier, pg_temp
AS $$
    -- The counters hold leased pull messages as pending (_counted_status): shown apart here.
    WITH leased AS (SELECT * FROM courier._leased_by_endpoint()),
    counted AS (
        SELECT d.endpoint_id, d.status, sum(d.messages) AS messages FROM courier.queue_depth d
        GROUP BY d.endpoint_id, d.status
        UNION ALL
        SELECT l.endpoint_id, 'pending', -l.leased FROM leased l
        UNION ALL
        SELECT l.endpoint_id, 'processing', l.leased FROM leased l)
    SELECT c.endpoint_id, c.status, sum(c.messages)::bigint FROM counted c GROUP BY c.endpoint_id, c.status
$$;

CREATE OR REPLACE FUNCTION courier.get_endpoint_health(p_endpoint_name text DEFAULT NULL)
RETURNS TABLE (
    endpoint_name          text,
    protocol               text,
    enabled                boolean,
    circuit_state          text,
    circuit_failure_count  integer,
    last_success_at        timestamptz,
    last_failure_at        timestamptz,
    pending_messages       bigint,
    oldest_pending_message timestamptz
)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
    SELECT e.name, e.protocol, e.enabled, e.circuit_state, e.circuit_failure_count,
           e.last_success_at, e.last_failure_at,
           coalesce((SELECT sum(d.messages) FROM courier.queue_depth d
                     WHERE d.endpoint_id = e.id AND d.status = 'pending'), 0)::bigint
             - coalesce(l.leased, 0),  -- held as pending by the counters (_counted_status)
           courier._oldest_pending_at(e.id)
    FROM courier.endpoints e
    LEFT JOIN courier._leased_by_endpoint() l ON l.endpoint_id = e.id
    WHERE p_endpoint_name IS NULL OR e.name = p_endpoint_name
    ORDER BY e.name
$$;

-- Retention of the event log and the counters ------------------------------------------------
CREATE OR REPLACE FUNCTION courier.cleanup_event_log() RETURNS integer
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

-- alive: running or draining, heartbeating, and not known to be disconnected. connected: whether
-- one of the worker's registered database sessions (worker_sessions) is still there; a process
-- that is killed loses them all at once, long before its heartbeat is 30 s old. NULL when that is
-- not known: the worker registered no session since the database last started (a restart ends
-- every session; a live worker registers again at its next heartbeat), or none at all.
CREATE OR REPLACE FUNCTION courier.get_worker_status()
RETURNS TABLE (worker_id text, hostname text, pid integer, state text, concurrency integer, in_flight integer,
               delivered bigint, failed bigint, started_at timestamptz, last_heartbeat timestamptz, alive boolean,
               maintenance_leader boolean, connected boolean)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
    -- A worker is judged by its sessions. Those registered before the server last started
    -- ended with it: a live worker registers new ones within seconds of the database coming
    -- back (each new connection does, and it heartbeats every 5 s), so one that has not after
    -- 15 s died meanwhile (issue 41: it showed alive for up to 30 s, by its last heartbeat).
    WITH sessions AS (
        SELECT l.worker_id,
               CASE WHEN bool_or(l.registered_at >= pg_postmaster_start_time())
                    THEN bool_or(l.alive AND l.registered_at >= pg_postmaster_start_time())
                    WHEN now() - pg_postmaster_start_time() > interval '15 seconds' THEN false
               END AS connected
        FROM courier._worker_session_liveness() l
        GROUP BY l.worker_id)
    SELECT w.worker_id, w.hostname, w.pid, w.state, w.concurrency, w.in_flight, w.delivered, w.failed,
           w.started_at, w.last_heartbeat,
           w.state IN ('running', 'draining') AND w.last_heartbeat > now() - interval '30 seconds'
               AND s.connected IS NOT FALSE,
           coalesce(w.worker_id = leader.worker_id, false),
           s.connected
    FROM courier.workers w
    LEFT JOIN sessions s ON s.worker_id = w.worker_id
    LEFT JOIN courier._maintenance_leader() leader ON true
    ORDER BY w.started_at
$$;

-- The protocols the live workers can deliver, each with how many of them can; `known` counts
-- the live workers that said (one from before protocols were reported says nothing).
CREATE OR REPLACE FUNCTION courier.worker_protocols()
RETURNS TABLE (protocol text, workers integer, known integer)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
    WITH live AS (
        SELECT w.protocols FROM courier.get_worker_status() s JOIN courier.workers w USING (worker_id)
        WHERE s.alive AND w.protocols IS NOT NULL)
    SELECT p.protocol, count(*)::integer, (SELECT count(*)::integer FROM live)
    FROM live CROSS JOIN LATERAL unnest(live.protocols) AS p(protocol)
    GROUP BY p.protocol ORDER BY p.protocol
$$;

-- Observability --------------------------------------------------------------------------------

-- ulak's metrics(): depths from the maintained counters, delivery counters, the archive and
-- the maintenance leader.
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
    SELECT 'endpoint_paused', (e.paused_at IS NOT NULL)::integer, jsonb_build_object('endpoint', e.name), 'gauge'
    FROM courier.endpoints e
    UNION ALL
    SELECT o.metric, coalesce(sum(t.total), 0)::double precision,
           jsonb_build_object('endpoint', e.name), 'counter'
    FROM courier.endpoints e
    CROSS JOIN (VALUES ('delivered', 'messages_delivered_total'),
                       ('failed_attempt', 'delivery_failures_total'),
                       ('dead_lettered', 'messages_dead_lettered_total'),
                       ('failed', 'messages_failed_total'),
                       ('expired', 'messages_expired_total'),
                       ('replayed', 'messages_replayed_total'),
                       ('claim_busy', 'claims_busy_total')) AS o(outcome, metric)
    LEFT JOIN courier.delivery_totals t ON t.endpoint_id = e.id AND t.outcome = o.outcome
    GROUP BY e.name, o.metric
    UNION ALL
    -- Reports and releases that arrived with a lease recovery had already taken back: no-ops.
    SELECT 'stale_reports_total', coalesce(sum(t.total), 0)::double precision, '{}'::jsonb, 'counter'
    FROM courier.delivery_totals t WHERE t.endpoint_id = 0 AND t.outcome = 'stale_report'
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
CREATE OR REPLACE FUNCTION courier.health_check()
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
    v_maintained timestamptz;
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
    -- Only pushed messages wait for a worker; a pull topic's consumers take their own.
    SELECT coalesce(sum(d.messages), 0) INTO v_pending
    FROM courier.queue_depth d JOIN courier.endpoints e ON e.id = d.endpoint_id AND e.protocol <> 'pull'
    WHERE d.status = 'pending';
    check_name := 'workers';
    value := v_alive;
    status := CASE WHEN v_alive > 0 THEN 'ok' WHEN v_pending > 0 THEN 'critical' ELSE 'warning' END;
    detail := format('%s worker(s) alive, %s message(s) pending', v_alive, v_pending)
              -- Pull topics need no worker to be consumed, but their upkeep runs in one.
              || CASE WHEN v_alive = 0 THEN '; no maintenance runs without one, for pull topics too '
                                            '(expiry, archiving, depth counters)' ELSE '' END;
    RETURN NEXT;

    -- Critical once workers have been alive a lease's length with nobody running maintenance
    -- (no expiry, stale recovery, archiving or partition upkeep): a leader that stopped renewing
    -- its lease, or none elected. Just after workers start, an election is still due.
    SELECT l.maintained_at INTO v_maintained FROM courier.maintenance_lease l;
    SELECT min(w.started_at) INTO v_oldest FROM courier.get_worker_status() w WHERE w.alive;
    check_name := 'maintenance_leader';
    value := v_leader::integer;
    status := CASE WHEN v_alive = 0 THEN 'ok'
                   WHEN greatest(v_maintained, v_oldest)
                        < now() - make_interval(secs => courier._maintenance_lease_seconds()) THEN 'critical'
                   WHEN v_leader THEN 'ok'
                   ELSE 'warning' END;
    detail := CASE WHEN v_alive = 0 THEN 'no workers running: nothing leads maintenance'
                   ELSE concat_ws('; ',
                       CASE WHEN v_leader THEN 'a live worker holds the maintenance lease'
                            ELSE 'workers are alive but none leads maintenance' END,
                       CASE WHEN v_maintained IS NULL THEN 'maintenance has never run'
                            ELSE format('maintenance last ran %s s ago',
                                        round(extract(epoch FROM now() - v_maintained)::numeric)) END) END;
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
        WHERE q.status = 'processing' AND q.visible_at IS NULL  -- queue_processing_started_idx
          AND q.processing_started_at < now() - make_interval(secs => courier._setting_int('stale_recovery_timeout'))
        LIMIT 1000) stale;
    check_name := 'stale_processing';
    value := v_count;
    status := CASE WHEN v_count = 0 THEN 'ok' ELSE 'warning' END;
    detail := CASE WHEN v_count = 0 THEN 'no message is stuck in processing'
                   ELSE format('%s%s message(s) in processing past stale_recovery_timeout',
                               v_count, CASE WHEN v_count = 1000 THEN '+' ELSE '' END) END;
    RETURN NEXT;

    -- Periodic schedules whose next tick is overdue (issue 42): no leader is sending ticks, or
    -- each attempt fails (failing: its last_error says why). A probe of schedules_due_idx.
    SELECT count(*) INTO v_count FROM courier.schedules s
    WHERE s.paused_at IS NULL AND s.next_run_at < now() - courier._schedule_late_after();
    SELECT string_agg(l.name || CASE WHEN l.last_error IS NOT NULL THEN ' (failing)' ELSE '' END, ', ')
    INTO v_names
    FROM (SELECT s.name, s.last_error FROM courier.schedules s
          WHERE s.paused_at IS NULL AND s.next_run_at < now() - courier._schedule_late_after()
          ORDER BY s.next_run_at, s.name LIMIT 10) l;
    check_name := 'schedules';
    value := v_count;
    status := CASE WHEN v_count = 0 THEN 'ok' ELSE 'warning' END;
    detail := CASE WHEN v_count = 0 THEN 'no periodic schedule is late'
                   ELSE format('%s late: %s%s', v_count, v_names, CASE WHEN v_count > 10 THEN ', …' ELSE '' END) END;
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

-- The class of one failed attempt (an error_history entry) for the analytics aggregates,
-- which the monitor role reads: a word of Courier's vocabulary, never text an application
-- wrote. A pull consumer's nack and receive_failed errors are the application's own words
-- (card numbers, names), so their class is the outcome alone; a worker's error starts with
-- text Courier wrote, from which only an HTTP status or a kind of failure is taken. The
-- Spark job (console/pipeline/analytics.py, ERROR_CLASSES) computes the same classes.
CREATE OR REPLACE FUNCTION courier.error_class(p_outcome text, p_error text) RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, courier, pg_temp
AS $$
    SELECT CASE
        WHEN p_outcome IN ('nack', 'receive_failed', 'stale', 'lease_expired') THEN p_outcome
        WHEN p_error ~ '^(\[[A-Z]+\] )?HTTP [0-9]{3}' THEN substring(p_error FROM 'HTTP [0-9]{3}')
        WHEN p_error ~* 'timeout|timed out' THEN 'timeout'
        WHEN p_error ~* 'back-pressure' THEN 'back-pressure'
        WHEN p_error ~* 'too large|larger than' THEN 'too large'
        WHEN p_error ~* 'connection' THEN 'connection'
        WHEN p_error ~* 'internal address' THEN 'internal address'
        WHEN p_error ~* 'refused|denied|permission' THEN 'refused'
        WHEN p_error ~* 'not found|does not exist|no jetstream stream' THEN 'not found'
        WHEN p_outcome IN ('retryable', 'permanent', 'disable') THEN p_outcome
        ELSE 'unknown'
    END
$$;

-- Metric samples (issue 41) --------------------------------------------------------------------
-- What one sample holds: a row per endpoint (its depth, DLQ and cumulative outcome totals) and
-- one for the whole queue (endpoint_id 0, their sums).
CREATE OR REPLACE FUNCTION courier._metric_sample_rows()
RETURNS TABLE (endpoint_id integer, pending bigint, processing bigint, dlq bigint, delivered bigint, failed bigint,
               dead_lettered bigint)
LANGUAGE sql STABLE
SET search_path = pg_catalog, courier, pg_temp
AS $$
    WITH depth AS (
        SELECT d.endpoint_id,
               sum(d.messages) FILTER (WHERE d.status = 'pending') AS pending,
               sum(d.messages) FILTER (WHERE d.status = 'processing') AS processing
        FROM courier._depth_by_endpoint() d GROUP BY d.endpoint_id),
    dlq AS (
        SELECT d.endpoint_id, sum(d.messages) FILTER (WHERE d.status = 'failed') AS dlq
        FROM courier.dlq_depth d GROUP BY d.endpoint_id),
    totals AS (
        SELECT t.endpoint_id,
               sum(t.total) FILTER (WHERE t.outcome = 'delivered') AS delivered,
               sum(t.total) FILTER (WHERE t.outcome = 'failed_attempt') AS failed,
               sum(t.total) FILTER (WHERE t.outcome = 'dead_lettered') AS dead_lettered
        FROM courier.delivery_totals t GROUP BY t.endpoint_id),
    endpoint_rows AS (
        SELECT e.id AS endpoint_id,
               coalesce(d.pending, 0)::bigint AS pending, coalesce(d.processing, 0)::bigint AS processing,
               coalesce(q.dlq, 0)::bigint AS dlq, coalesce(t.delivered, 0)::bigint AS delivered,
               coalesce(t.failed, 0)::bigint AS failed, coalesce(t.dead_lettered, 0)::bigint AS dead_lettered
        FROM courier.endpoints e
        LEFT JOIN depth d ON d.endpoint_id = e.id
        LEFT JOIN dlq q ON q.endpoint_id = e.id
        LEFT JOIN totals t ON t.endpoint_id = e.id)
    SELECT * FROM endpoint_rows
    UNION ALL
    SELECT 0, coalesce(sum(r.pending), 0)::bigint, coalesce(sum(r.processing), 0)::bigint,
           coalesce(sum(r.dlq), 0)::bigint, coalesce(sum(r.delivered), 0)::bigint,
           coalesce(sum(r.failed), 0)::bigint, coalesce(sum(r.dead_lettered), 0)::bigint
    FROM endpoint_rows r
$$;

-- The maintenance leader's sample of the queue (_metric_sample_rows(), all at now()), every
-- MaintenanceSchedule.metric_samples seconds; then the samples older than
-- metric_samples_retention_hours are deleted. It writes nothing when a sample was taken less
-- than half an interval ago (a leader that hung past its lease and came back must not write a
-- second series beside its successor's), nor while the depth counters wait for their rebuild
-- after a crash (a gap is the truth; a depth of 0 would not be). Returns 0: a maintenance job's
-- count of work to report, and this never leaves any.
CREATE OR REPLACE FUNCTION courier.record_metric_samples(p_interval_seconds real DEFAULT 10) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
BEGIN
    IF p_interval_seconds IS NULL OR p_interval_seconds <= 0 THEN
        RAISE EXCEPTION '[courier] a sampling interval must be more than 0 seconds, got %', p_interval_seconds
            USING ERRCODE = '22023';
    END IF;
    IF NOT EXISTS (SELECT FROM courier.queue_depth_built)
       OR EXISTS (SELECT FROM courier.metric_samples s
                  WHERE s.sampled_at > now() - make_interval(secs => p_interval_seconds / 2)
                    AND s.endpoint_id = 0) THEN
        RETURN 0;
    END IF;
    INSERT INTO courier.metric_samples (sampled_at, endpoint_id, interval_seconds, pending, processing, dlq,
                                        delivered, failed, dead_lettered)
    SELECT now(), r.endpoint_id, p_interval_seconds, r.pending, r.processing, r.dlq, r.delivered, r.failed,
           r.dead_lettered
    FROM courier._metric_sample_rows() r;
    DELETE FROM courier.metric_samples s
    WHERE s.sampled_at < now() - make_interval(hours => courier._setting_int('metric_samples_retention_hours')::integer);
    RETURN 0;
END
$$;

-- The samples taken from p_since to p_until (NULL: now), oldest first: the whole queue's
-- (endpoint_name NULL), or with p_per_endpoint each endpoint's that still exists. Each row has
-- the depth it saw, and what happened since the sample before it (also the one just before
-- p_since, so that the first row has its rate too): how many messages were delivered, failed
-- an attempt or were dead-lettered, and those per second of the time actually between the two
-- samples. The totals are unlogged and count from zero after a crash: a total below the one
-- before is a reset, whose increase is the new total (what was counted since), never a negative
-- rate; an endpoint new since the sample before counts from zero too. gap: the sample before
-- was more than two intervals earlier (no leader sampled in between); its counts are what
-- happened over the whole gap, and its rates are NULL, since when in the gap they happened is
-- not known. The first sample of all has neither (seconds NULL). interval_seconds: how often
-- the leader meant to sample, so that a reader can also tell a gap after the newest sample.
CREATE OR REPLACE FUNCTION courier.metric_history(p_since timestamptz, p_until timestamptz DEFAULT NULL,
                                                  p_per_endpoint boolean DEFAULT false)
RETURNS TABLE (sampled_at timestamptz, endpoint_name text, seconds double precision, gap boolean,
               interval_seconds real, pending bigint, processing bigint, dlq bigint, delivered bigint, failed bigint,
               dead_lettered bigint, delivered_per_second double precision, failed_per_second double precision,
               dead_lettered_per_second double precision)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
    WITH ticks AS (
        SELECT t.sampled_at, t.interval_seconds,
               lag(t.sampled_at) OVER (ORDER BY t.sampled_at) AS previous_at
        FROM courier.metric_samples t
        WHERE t.endpoint_id = 0 AND t.sampled_at <= coalesce(p_until, 'infinity')
          AND t.sampled_at >= coalesce((SELECT max(b.sampled_at) FROM courier.metric_samples b
                                        WHERE b.endpoint_id = 0 AND b.sampled_at < p_since), p_since)),
    steps AS (
        SELECT t.sampled_at, s.endpoint_id, t.previous_at, t.interval_seconds,
               extract(epoch FROM t.sampled_at - t.previous_at)::double precision AS seconds,
               t.sampled_at - t.previous_at > make_interval(secs => 2 * t.interval_seconds) AS gap,
               s.pending, s.processing, s.dlq,
               CASE WHEN t.previous_at IS NULL THEN NULL
                    WHEN p.delivered IS NULL OR s.delivered < p.delivered THEN s.delivered
                    ELSE s.delivered - p.delivered END AS delivered,
               CASE WHEN t.previous_at IS NULL THEN NULL
                    WHEN p.failed IS NULL OR s.failed < p.failed THEN s.failed
                    ELSE s.failed - p.failed END AS failed,
               CASE WHEN t.previous_at IS NULL THEN NULL
                    WHEN p.dead_lettered IS NULL OR s.dead_lettered < p.dead_lettered THEN s.dead_lettered
                    ELSE s.dead_lettered - p.dead_lettered END AS dead_lettered
        FROM ticks t
        JOIN courier.metric_samples s ON s.sampled_at = t.sampled_at
        LEFT JOIN courier.metric_samples p ON p.sampled_at = t.previous_at AND p.endpoint_id = s.endpoint_id
        WHERE t.sampled_at >= p_since),
    rows AS (
        SELECT s.sampled_at, e.name AS endpoint_name, s.seconds, s.gap, s.interval_seconds, s.pending, s.processing, s.dlq,
               s.delivered, s.failed, s.dead_lettered
        FROM steps s JOIN courier.endpoints e ON e.id = s.endpoint_id
        WHERE p_per_endpoint
        UNION ALL
        -- The whole queue's increase is its endpoints' added up (a dropped endpoint's totals
        -- leaving the sum is no reset); its depth is its own row's.
        SELECT w.sampled_at, NULL, w.seconds, w.gap, w.interval_seconds, w.pending, w.processing, w.dlq,
               x.delivered, x.failed, x.dead_lettered
        FROM steps w
        LEFT JOIN (SELECT x.sampled_at, sum(x.delivered) AS delivered, sum(x.failed) AS failed,
                          sum(x.dead_lettered) AS dead_lettered
                   FROM steps x WHERE x.endpoint_id <> 0 AND NOT p_per_endpoint
                   GROUP BY x.sampled_at) x ON x.sampled_at = w.sampled_at
        WHERE w.endpoint_id = 0 AND NOT p_per_endpoint)
    SELECT r.sampled_at, r.endpoint_name, r.seconds, coalesce(r.gap, false), r.interval_seconds,
           r.pending, r.processing, r.dlq,
           CASE WHEN r.seconds IS NULL THEN NULL ELSE coalesce(r.delivered, 0) END::bigint,
           CASE WHEN r.seconds IS NULL THEN NULL ELSE coalesce(r.failed, 0) END::bigint,
           CASE WHEN r.seconds IS NULL THEN NULL ELSE coalesce(r.dead_lettered, 0) END::bigint,
           CASE WHEN r.seconds > 0 AND NOT r.gap THEN coalesce(r.delivered, 0) / r.seconds END,
           CASE WHEN r.seconds > 0 AND NOT r.gap THEN coalesce(r.failed, 0) / r.seconds END,
           CASE WHEN r.seconds > 0 AND NOT r.gap THEN coalesce(r.dead_lettered, 0) / r.seconds END
    FROM rows r
    ORDER BY r.sampled_at, r.endpoint_name
$$;
