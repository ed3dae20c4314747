-- Claiming: the worker's claim and release primitives, stale recovery, heartbeats and the
-- maintenance leader's election.

-- Puts claimed messages back to pending after p_delay_seconds without counting an attempt:
-- for messages a worker claimed but did not dispatch (shutdown, a circuit that opened
-- mid-batch). p_leases, parallel to p_ids, fence the release like a report: a message whose
-- claim was recovered and handed to another worker is left alone. Returns how many it released.
CREATE OR REPLACE FUNCTION courier.release_batch(p_ids bigint[], p_leases integer[], p_delay_seconds integer DEFAULT 0)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_released integer;
BEGIN
    IF NOT courier._leases_given(p_ids, p_leases) THEN
        PERFORM courier._require_leases(p_ids, p_leases);
    END IF;
    IF courier._any_stage_lease(p_leases) THEN  -- claimed where they were staged (_take_staged): into the queue first
        PERFORM courier._unstage_ids(p_ids);
    END IF;
    UPDATE courier.queue q
    SET status = 'pending', processing_started_at = NULL, worker_id = NULL,
        next_retry_at = now() + make_interval(secs => greatest(p_delay_seconds, 0)), updated_at = now()
    FROM unnest(p_ids, p_leases) AS u(id, lease)
    WHERE q.id = u.id AND q.lease = u.lease AND q.status = 'processing';
    GET DIAGNOSTICS v_released = ROW_COUNT;
    IF v_released < cardinality(p_ids) THEN
        PERFORM courier._count_stale_reports('release', cardinality(p_ids) - v_released, p_ids);
    END IF;
    RETURN v_released;
END
$$;

-- Renews the leases of messages still being delivered, so that stale recovery never takes a
-- slow but healthy delivery from a live worker: recovery looks at processing_started_at,
-- which a renewal moves to now. Only the lease's holder renews; returns how many it renewed.
CREATE OR REPLACE FUNCTION courier.renew_leases(p_ids bigint[], p_leases integer[]) RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_renewed integer;
BEGIN
    IF NOT courier._leases_given(p_ids, p_leases) THEN
        PERFORM courier._require_leases(p_ids, p_leases);
    END IF;
    IF courier._any_stage_lease(p_leases) THEN  -- as release_batch
        PERFORM courier._unstage_ids(p_ids);
    END IF;
    UPDATE courier.queue q SET processing_started_at = now()
    FROM unnest(p_ids, p_leases) AS u(id, lease)
    WHERE q.id = u.id AND q.lease = u.lease AND q.status = 'processing';
    GET DIAGNOSTICS v_renewed = ROW_COUNT;
    RETURN v_renewed;
END
$$;

-- The checks every fenced call makes on its arguments.
-- Whether every id has the lease its claim returned: a plain expression, which inlines into the
-- callers' IF, so that a settle that passes it runs no statement for the check.
CREATE OR REPLACE FUNCTION courier._leases_given(p_ids bigint[], p_leases integer[]) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT coalesce(cardinality(p_ids), 0) = coalesce(cardinality(p_leases), 0)
           AND array_position(p_leases, NULL) IS NULL
$$;

CREATE OR REPLACE FUNCTION courier._require_leases(p_ids bigint[], p_leases integer[]) RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF coalesce(cardinality(p_ids), 0) <> coalesce(cardinality(p_leases), 0)
       OR array_position(p_leases, NULL) IS NOT NULL THEN
        RAISE EXCEPTION '[courier] every message id needs the lease its claim returned'
            USING ERRCODE = '22023', HINT = 'Pass the lease column of claim_batch for each id';
    END IF;
END
$$;

-- Counts and logs reports (or releases) that arrived with a lease that is no longer the
-- message's: the worker's claim went stale and the message was recovered, and perhaps
-- claimed again by someone else. Such a report is a no-op; this makes it visible.
CREATE OR REPLACE FUNCTION courier._count_stale_reports(p_kind text, p_count integer, p_ids bigint[]) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    IF p_count > 0 THEN
        -- A message cancelled while its delivery was under way held its ordering key until now
        -- (courier._cancel): whatever its worker reports, the delivery is over.
        DELETE FROM courier.queue WHERE id = ANY (p_ids) AND status = 'processing' AND lease = -1;
        PERFORM courier._add_delivery_totals(0, 'stale_report', p_count);
        PERFORM courier._log_event('report.stale_lease', NULL, jsonb_build_object(
            'kind', p_kind, 'count', p_count, 'message_ids', to_jsonb(p_ids[1:20])));
    END IF;
END
$$;

-- Hands claims back to pending for immediate redelivery, counting the lost attempt: a message
-- whose delivery keeps killing its worker is dead-lettered once past max_retries, with an error
-- that says so. p_ids are claims the caller has locked (FOR UPDATE) and found abandoned;
-- p_reason says why (p_exhausted_reason, in the error of one past its retries), p_event is
-- logged with the counts and p_details. Returns how many it recovered
-- (dead-lettered ones included). Every endpoint concerned is woken.
CREATE OR REPLACE FUNCTION courier._recover_claims(p_ids bigint[], p_reason text, p_exhausted_reason text,
                                                  p_event text, p_details jsonb DEFAULT '{}') RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_recovered integer;
    v_dead bigint[];
    v_endpoints integer[];
    v_endpoint integer;
    v_default_max_retries integer := courier._setting_int('default_max_retries');
BEGIN
    IF coalesce(cardinality(p_ids), 0) = 0 THEN
        RETURN 0;
    END IF;
    -- Cancelled while in flight (courier._cancel): archived already; its delivery is given up.
    DELETE FROM courier.queue WHERE id = ANY (p_ids) AND status = 'processing' AND lease = -1;
    WITH abandoned AS (
        SELECT q.id, coalesce(q.max_retries, (e.retry_policy ->> 'max_retries')::integer,
                              v_default_max_retries) AS max_retries
        FROM courier.queue q JOIN courier.endpoints e ON e.id = q.endpoint_id
        WHERE q.id = ANY (p_ids) AND q.status = 'processing' AND q.visible_at IS NULL
    ),
    recovered AS (
        UPDATE courier.queue q
        SET status = 'pending', retry_count = q.retry_count + 1,
            last_error = CASE WHEN q.retry_count + 1 > m.max_retries
                              THEN format('[PERMANENT] %s %s times; max_retries (%s) exceeded',
                                          p_exhausted_reason, q.retry_count + 1, m.max_retries)
                              ELSE p_reason END,
            error_history = q.error_history || jsonb_build_object(
                'attempt', q.retry_count + 1, 'at', now(), 'outcome', 'stale', 'worker_id', q.worker_id,
                'error', p_reason),
            next_retry_at = now(), processing_started_at = NULL, worker_id = NULL, updated_at = now()
        FROM abandoned m
        WHERE q.id = m.id
        RETURNING q.id, q.endpoint_id, q.retry_count > m.max_retries AS exhausted
    )
    SELECT count(*), array_agg(id) FILTER (WHERE exhausted), array_agg(DISTINCT endpoint_id)
    INTO v_recovered, v_dead, v_endpoints FROM recovered;
    IF v_dead IS NOT NULL THEN
        PERFORM courier._dead_letter(v_dead);
    END IF;
    IF v_recovered > 0 THEN
        PERFORM courier._log_event(p_event, NULL, p_details || jsonb_build_object(
            'count', v_recovered, 'dead_lettered', coalesce(cardinality(v_dead), 0)));
        -- A half-open probe among them never got its answer: the circuit goes back to open,
        -- due for a new probe now, rather than half open until a whole cooldown has passed.
        UPDATE courier.endpoints SET circuit_state = 'open', circuit_half_open_at = now(), updated_at = now()
        WHERE id = ANY (v_endpoints) AND circuit_state = 'half_open';
        FOREACH v_endpoint IN ARRAY v_endpoints LOOP
            PERFORM pg_notify('courier_new_msg', v_endpoint::text);
        END LOOP;
    END IF;
    RETURN v_recovered;
END
$$;

-- Stale recovery (ulak): messages in processing longer than stale_recovery_timeout (or
-- p_timeout_seconds) since their claim or its last lease renewal go back to pending for
-- immediate redelivery (see _recover_claims). This is the safety net for a worker that is
-- alive but stuck, or died without its sessions being seen to end; a worker whose sessions
-- ended is caught within seconds by recover_dead_workers_claims.
CREATE OR REPLACE FUNCTION courier.recover_stale_messages(p_timeout_seconds integer DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_ids bigint[];
BEGIN
    SELECT array_agg(id) INTO v_ids FROM (
        SELECT q.id FROM courier.queue q
        WHERE q.status = 'processing' AND q.visible_at IS NULL  -- queue_processing_started_idx
          AND q.processing_started_at < now() - make_interval(
                secs => coalesce(p_timeout_seconds, courier._setting_int('stale_recovery_timeout')))
        ORDER BY q.id
        FOR UPDATE SKIP LOCKED) s;
    RETURN courier._recover_claims(v_ids, 'Recovered from stale processing state', 'recovered from stale processing',
                                   'messages.stale_recovered');
END
$$;

-- Worker liveness -----------------------------------------------------------------------

-- Records the calling session as one of a worker process's: every connection of its pool
-- and its LISTEN connection call this first, and every heartbeat again (behind a pooler that
-- hands a client's transactions to several server sessions, those it is served by now).
-- p_incarnation tells this process from an earlier one under the same worker id. Only the
-- session's own pid is recorded, with its role and the time of its first registration, so
-- that a later backend reusing the pid is not taken for it.
CREATE OR REPLACE FUNCTION courier.register_worker_session(p_worker_id text, p_incarnation text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
BEGIN
    IF p_worker_id IS NULL OR p_incarnation IS NULL THEN
        RAISE EXCEPTION '[courier] a worker session needs a worker id and an incarnation' USING ERRCODE = '22023';
    END IF;
    INSERT INTO courier.worker_sessions (worker_id, incarnation, backend_pid, role_oid)
    VALUES (p_worker_id, p_incarnation, pg_backend_pid(), (SELECT oid FROM pg_roles WHERE rolname = session_user))
    ON CONFLICT DO NOTHING;
END
$$;

-- Each registered worker session, and whether it is still connected (see
-- recover_dead_workers_claims). pg_stat_activity is read once per transaction, so every call
-- in one transaction agrees.
CREATE OR REPLACE FUNCTION courier._worker_session_liveness()
RETURNS TABLE (worker_id text, incarnation text, backend_pid integer, registered_at timestamptz, alive boolean)
LANGUAGE sql STABLE
SET search_path = pg_catalog, courier, pg_temp
AS $$
    SELECT s.worker_id, s.incarnation, s.backend_pid, s.registered_at,
           EXISTS (SELECT 1 FROM pg_stat_activity a
                   WHERE a.pid = s.backend_pid AND a.usesysid = s.role_oid
                     AND a.datid = (SELECT oid FROM pg_database WHERE datname = current_database())
                     AND (a.backend_start IS NULL OR a.backend_start <= s.registered_at))
    FROM courier.worker_sessions s
$$;

-- Recovers the claims of worker processes that are gone: an incarnation none of whose
-- registered sessions is still connected (in pg_stat_activity) for p_grace_seconds. A session
-- is taken for alive when a backend with its pid, role and database exists that started before
-- the registration (its start time is visible only to the owner's own sessions and to
-- pg_read_all_stats; without it, pid, role and database decide, which errs towards alive: a
-- reused pid delays recovery until stale recovery, it never takes claims from a live worker).
-- A backend still running a dead client's statement (a report waiting on a lock) keeps its
-- worker alive until it ends, so an orphaned report is never overtaken. The grace covers a
-- database restart and a network blip: a live worker registers a new session within it.
--
-- Only claims taken before the first registration of every live incarnation of the same
-- worker id are recovered: a supervisor's restart under a fixed --worker-id claims again
-- under that id, and its claims are its own. Leases fence the dead worker: should it report
-- after all, the report is a no-op, counted as stale. Runs as the owner, which sees every
-- role's backends. Returns how many claims it recovered.
CREATE OR REPLACE FUNCTION courier.recover_dead_workers_claims(p_grace_seconds integer DEFAULT 5) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_dead record;
    v_ids bigint[];
    v_recovered integer := 0;
BEGIN
    -- Sessions a live incarnation no longer has (a pool replaced the connection): forgotten.
    DELETE FROM courier.worker_sessions s
    USING courier._worker_session_liveness() l
    WHERE (l.worker_id, l.incarnation, l.backend_pid, l.registered_at)
          = (s.worker_id, s.incarnation, s.backend_pid, s.registered_at)
      AND NOT l.alive
      AND EXISTS (SELECT 1 FROM courier._worker_session_liveness() o
                  WHERE (o.worker_id, o.incarnation) = (l.worker_id, l.incarnation) AND o.alive);
    -- Incarnations seen without a live session for the first time: the grace starts now.
    UPDATE courier.worker_sessions s SET lost_at = now()
    WHERE s.lost_at IS NULL
      AND NOT EXISTS (SELECT 1 FROM courier._worker_session_liveness() o
                      WHERE (o.worker_id, o.incarnation) = (s.worker_id, s.incarnation) AND o.alive);

    FOR v_dead IN
        SELECT s.worker_id, s.incarnation
        FROM courier.worker_sessions s
        GROUP BY s.worker_id, s.incarnation
        HAVING bool_and(s.lost_at IS NOT NULL AND s.lost_at <= now() - make_interval(secs => greatest(p_grace_seconds, 0)))
    LOOP
        SELECT array_agg(id) INTO v_ids FROM (
            SELECT q.id FROM courier.queue q
            WHERE q.worker_id = v_dead.worker_id AND q.status = 'processing' AND q.visible_at IS NULL
              AND q.processing_started_at < coalesce(
                    (SELECT min(l.registered_at) FROM courier._worker_session_liveness() l
                     WHERE l.worker_id = v_dead.worker_id AND l.incarnation <> v_dead.incarnation AND l.alive),
                    'infinity')
            ORDER BY q.id
            FOR UPDATE SKIP LOCKED) c;
        v_recovered := v_recovered + courier._recover_claims(
            v_ids, 'Recovered from a dead worker (its database sessions ended)', 'recovered from a dead worker',
            'messages.dead_worker_recovered', jsonb_build_object('worker_id', v_dead.worker_id));
        DELETE FROM courier.worker_sessions WHERE (worker_id, incarnation) = (v_dead.worker_id, v_dead.incarnation);
        -- No session of the worker left: it is lost (not stopped: it never said so) until a
        -- heartbeat under its id says otherwise. Without this it showed as alive again, by its
        -- heartbeat alone, once its sessions were forgotten.
        UPDATE courier.workers w SET state = 'lost'
        WHERE w.worker_id = v_dead.worker_id AND w.state IN ('running', 'draining')
          AND NOT EXISTS (SELECT 1 FROM courier.worker_sessions s WHERE s.worker_id = w.worker_id);
        IF FOUND THEN
            PERFORM courier._log_event('worker.lost', NULL, jsonb_build_object('worker_id', v_dead.worker_id));
        END IF;
    END LOOP;
    RETURN v_recovered;
END
$$;

-- Workers -----------------------------------------------------------------------------
-- p_protocols: what the worker's install can deliver (http and noop, and each broker whose
-- client is installed); NULL when not known.
CREATE OR REPLACE FUNCTION courier.worker_heartbeat(p_worker_id text, p_hostname text, p_pid integer,
                                            p_concurrency integer, p_in_flight integer,
                                            p_delivered bigint, p_failed bigint, p_state text,
                                            p_protocols text[] DEFAULT NULL)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, courier, pg_temp
AS $$
    INSERT INTO courier.workers AS w (worker_id, hostname, pid, concurrency, in_flight, delivered, failed, state,
                                      protocols)
    VALUES (p_worker_id, p_hostname, p_pid, p_concurrency, p_in_flight, p_delivered, p_failed, p_state,
            p_protocols)
    ON CONFLICT (worker_id) DO UPDATE
    SET concurrency = excluded.concurrency, in_flight = excluded.in_flight, delivered = excluded.delivered,
        failed = excluded.failed, state = excluded.state, last_heartbeat = now(), protocols = excluded.protocols,
        -- A worker started again under the same name (a supervisor's restart, a fixed
        -- --worker-id) is a new process: its row says so.
        hostname = excluded.hostname, pid = excluded.pid,
        started_at = CASE WHEN (w.hostname, w.pid) = (excluded.hostname, excluded.pid) THEN w.started_at
                          ELSE now() END
$$;

-- The maintenance leader --------------------------------------------------------------------

-- Tries to make the calling connection the maintenance leader, or, if it leads already, renews
-- its lease and records that it is still running maintenance. Leadership is a lease in
-- courier.maintenance_lease, a row only courier_owner writes and nobody else
-- can lock, rather than an advisory lock, which any database user could take and hold to
-- stop maintenance. A lease passes to another connection when its holder's session has
-- ended (at once: a killed leader's connection closes with it) or when its holder stopped
-- renewing it (a hung leader, after maintenance_lease_seconds). The row lock makes
-- concurrent candidates take turns, so two never both win. Returns whether the caller leads.
CREATE OR REPLACE FUNCTION courier.try_lead_maintenance(p_worker_id text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_lease courier.maintenance_lease;
    v_mine boolean;
BEGIN
    SELECT * INTO STRICT v_lease FROM courier.maintenance_lease FOR UPDATE;
    v_mine := v_lease.backend_pid = pg_backend_pid() AND v_lease.worker_id = p_worker_id
              AND v_lease.expires_at > now();
    IF NOT v_mine AND v_lease.expires_at > now()
       AND EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = v_lease.backend_pid) THEN
        RETURN false;
    END IF;
    UPDATE courier.maintenance_lease
    SET worker_id = p_worker_id, backend_pid = pg_backend_pid(),
        expires_at = now() + make_interval(secs => courier._maintenance_lease_seconds()),
        elected_at = CASE WHEN v_mine THEN elected_at ELSE now() END,
        maintained_at = now();
    IF NOT v_mine THEN
        UPDATE courier.workers SET leader_backend_pid = NULL WHERE leader_backend_pid IS NOT NULL;
        UPDATE courier.workers SET leader_backend_pid = pg_backend_pid() WHERE worker_id = p_worker_id;
        PERFORM courier._log_event('maintenance.leader_elected', NULL,
            jsonb_build_object('worker_id', p_worker_id, 'backend_pid', pg_backend_pid()));
    END IF;
    RETURN true;
END
$$;

-- How long a maintenance lease lasts unrenewed. The leader renews it before every job, and
-- every job keeps to a time budget of seconds: a leader that stops renewing for this long is
-- hung, and health_check() calls that critical.
CREATE OR REPLACE FUNCTION courier._maintenance_lease_seconds() RETURNS integer
LANGUAGE sql IMMUTABLE
AS $$ SELECT 60 $$;

-- The live maintenance leader's worker id and when it last ran maintenance; no row when no
-- live session holds an unexpired lease.
CREATE OR REPLACE FUNCTION courier._maintenance_leader()
RETURNS TABLE (worker_id text, backend_pid integer, maintained_at timestamptz)
LANGUAGE sql STABLE
SET search_path = pg_catalog, courier, pg_temp
AS $$
    SELECT l.worker_id, l.backend_pid, l.maintained_at FROM courier.maintenance_lease l
    WHERE l.expires_at > now() AND EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = l.backend_pid)
$$;

-- Heartbeat rows of workers that stopped or died more than p_after_seconds ago; every
-- `courier worker` run registers a new one, so without this the list only grows.
CREATE OR REPLACE FUNCTION courier.prune_workers(p_after_seconds integer DEFAULT 3600) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_pruned integer;
BEGIN
    DELETE FROM courier.workers
    WHERE last_heartbeat < now() - make_interval(secs => greatest(p_after_seconds, 60));
    GET DIAGNOSTICS v_pruned = ROW_COUNT;
    -- Sessions registered by a worker that never got as far as a heartbeat.
    DELETE FROM courier.worker_sessions s
    WHERE s.registered_at < now() - make_interval(secs => greatest(p_after_seconds, 60))
      AND NOT EXISTS (SELECT 1 FROM courier.workers w WHERE w.worker_id = s.worker_id);
    RETURN v_pruned;
END
$$;

-- Every endpoint has its claim slots (see report_and_claim), whichever way it was created.
CREATE OR REPLACE FUNCTION courier._add_claim_slots() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
AS $$
BEGIN
    INSERT INTO courier.claim_slots (endpoint_id, slot) SELECT NEW.id, s FROM generate_series(0, 7) AS s;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER endpoints_claim_slots AFTER INSERT ON courier.endpoints
    FOR EACH ROW EXECUTE FUNCTION courier._add_claim_slots();

-- Claims up to p_batch_size deliverable messages, priority DESC then FIFO by id, for one
-- endpoint or (p_endpoint_id NULL) across every enabled endpoint, with no circuit breaker or
-- rate limit: the inside of claim_batch, never called by workers directly. A deliverable
-- message is pending, due (scheduled_at and next_retry_at reached), unexpired, on an enabled
-- endpoint not paused, and first in line for its ordering key on its endpoint: nothing with its key is
-- processing there, and nothing earlier with its key is still pending there (ulak's two NOT
-- EXISTS rules; keys are scoped per endpoint, as ulak's are). Each claimed row takes a new
-- lease, which every report and release of it must name.
--
-- Plan notes, seen with auto_explain on PostgreSQL 15. The claim's UPDATE joined its
-- candidates to the queue, and the planner, which cannot see
-- how few candidates a LIMIT of p_batch_size leaves, chose a hash join over a sequential
-- scan of the whole queue (24 ms of a claim of 100 at 100k pending). Matching the
-- candidates' ctids with = ANY makes it a TID scan (the candidates are locked, so their ctids
-- hold, as in dequeue); their ids, a descent of the primary key each, cost a claim of 100
-- 4,500 instructions a message more.
--
-- The same generic estimates put the claim over jit_above_cost, and JIT-compiling it cost
-- about 30 ms per claim on a server with JIT (PostgreSQL's default where LLVM is present),
-- for queries that run in 3 ms. The worker functions run small, known queries: no JIT.
--
-- Issue 13: a SQL function's query is parsed and planned again on every call (PostgreSQL 15
-- caches nothing across calls), and planning this one took 1.1 ms of a 2.9 ms claim of 100.
-- As plpgsql the plan is cached per connection. It is the generic plan, forced: with the
-- LIMIT unknown the planner costs it above a custom plan and would otherwise plan anew on
-- every call, yet the plan is the same (the test in test_claim_plans.py proves it keeps to
-- the indexes and the primary key).
CREATE OR REPLACE FUNCTION courier._claim_due(p_worker_id text, p_batch_size integer, p_endpoint_id integer DEFAULT NULL)
RETURNS SETOF courier.claimed_message
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_writes integer := coalesce(nullif(current_setting('courier.depth_writes', true), '')::integer, 0);
    v_set text := set_config('courier.depth_writes', (v_writes + 1)::text, true)
                  || set_config('courier.update_counted', 'on', true);
BEGIN
    RETURN QUERY
    WITH candidates AS (
        SELECT c.tid, c.id, e.id AS endpoint_id
        FROM courier.endpoints e
        CROSS JOIN LATERAL (
            -- Two index paths, each limited: rows with no time attached in claim order from
            -- queue_ready_idx, and rows whose scheduled or retry time has come, highest
            -- priority first and longest due first within one, from one range of queue_due_idx
            -- per priority level; rows not yet due are never read (an ordered scan of all
            -- pending rows filtered 200k future ones per claim).
            SELECT u.tid, u.id, u.priority FROM (
                SELECT * FROM (SELECT q.ctid AS tid, q.id, q.priority
                 FROM courier.queue q
                 WHERE q.endpoint_id = e.id
                   AND q.status = 'pending' AND q.scheduled_at IS NULL AND q.next_retry_at IS NULL
                   AND q.visible_at IS NULL  -- push messages only, as queue_ready_idx holds
                   AND (q.expires_at IS NULL OR q.expires_at > now())
                   AND (q.ordering_key IS NULL OR (
                         NOT EXISTS (SELECT 1 FROM courier.queue q2
                                     WHERE q2.ordering_key = q.ordering_key AND q2.status = 'processing'
                                       AND q2.visible_at IS NULL  -- always, on a push endpoint
                                       AND q2.endpoint_id = q.endpoint_id)
                     AND NOT EXISTS (SELECT 1 FROM courier.queue q2
                                     WHERE q2.ordering_key = q.ordering_key AND q2.status = 'pending'
                                       AND q2.endpoint_id = q.endpoint_id AND q2.id < q.id)))
                 ORDER BY q.priority DESC, q.id
                 LIMIT p_batch_size
                 FOR UPDATE OF q SKIP LOCKED) ready
                UNION ALL
                SELECT * FROM (SELECT due.* FROM generate_series(10, 0, -1) AS p(priority)  -- highest first
                CROSS JOIN LATERAL (SELECT q.ctid AS tid, q.id, q.priority
                 FROM courier.queue q
                 WHERE q.endpoint_id = e.id AND q.priority = p.priority
                   AND q.status = 'pending' AND (q.scheduled_at IS NOT NULL OR q.next_retry_at IS NOT NULL)
                   AND q.visible_at IS NULL  -- push messages only, as queue_due_idx holds
                   AND greatest(q.scheduled_at, q.next_retry_at) <= now()
                   AND (q.expires_at IS NULL OR q.expires_at > now())
                   AND (q.ordering_key IS NULL OR (
                         NOT EXISTS (SELECT 1 FROM courier.queue q2
                                     WHERE q2.ordering_key = q.ordering_key AND q2.status = 'processing'
                                       AND q2.visible_at IS NULL  -- always, on a push endpoint
                                       AND q2.endpoint_id = q.endpoint_id)
                     AND NOT EXISTS (SELECT 1 FROM courier.queue q2
                                     WHERE q2.ordering_key = q.ordering_key AND q2.status = 'pending'
                                       AND q2.endpoint_id = q.endpoint_id AND q2.id < q.id)))
                 ORDER BY greatest(q.scheduled_at, q.next_retry_at)
                 LIMIT p_batch_size
                 FOR UPDATE OF q SKIP LOCKED) due
                WHERE e.priorities & (1 << p.priority) <> 0  -- the levels it has used (migration 0039)
                LIMIT p_batch_size) due_levels
            ) u
            ORDER BY u.priority DESC, u.id
            LIMIT p_batch_size
        ) c
        WHERE e.enabled AND e.paused_at IS NULL AND (p_endpoint_id IS NULL OR e.id = p_endpoint_id)
        ORDER BY c.priority DESC, c.id
        LIMIT p_batch_size
    ),
    claimed AS (
        UPDATE courier.queue q
        SET status = 'processing', processing_started_at = now(), worker_id = p_worker_id, updated_at = now(),
            lease = courier._next_lease(q.lease)
        WHERE q.ctid = ANY (ARRAY(SELECT tid FROM candidates))
        -- What the claim returns, not the whole row: each row is copied into the CTE and sorted.
        RETURNING q.id, q.endpoint_id, q.payload, q.headers, q.metadata, q.priority, q.retry_count, q.max_retries,
                  q.correlation_id, q.ordering_key, q.idempotency_key, q.scheduled_at, q.expires_at, q.created_at,
                  q.lease
    ),
    -- The claim counts itself, as dequeue does (pull.sql): every candidate is claimed, and each
    -- was pending. The update trigger stands aside for this statement (courier.update_counted):
    -- reading its two transition tables cost a claim of 10 about 10,600 instructions a message
    -- (199,604 -> 188,980; 95,896 -> 93,027 for a claim of 100).
    counted AS (
        INSERT INTO courier.queue_depth AS d (endpoint_id, status, backend_pid, slot, messages)
        SELECT m.endpoint_id, s.status, pg_backend_pid(), v_writes >> 6, s.delta
        FROM (SELECT c.endpoint_id, count(*) AS moved FROM candidates c GROUP BY c.endpoint_id) m
        CROSS JOIN LATERAL (VALUES ('pending', -m.moved), ('processing', m.moved)) AS s(status, delta)
        ON CONFLICT (endpoint_id, status, backend_pid, slot) DO UPDATE SET messages = d.messages + excluded.messages
    )
    SELECT c.id, c.endpoint_id, e.name, e.protocol, c.payload, c.headers, c.metadata, c.priority,
           c.retry_count, coalesce(c.max_retries, (e.retry_policy ->> 'max_retries')::integer,
                                   (SELECT value::integer FROM courier.settings WHERE name = 'default_max_retries')),
           c.correlation_id, c.ordering_key, c.idempotency_key, c.scheduled_at, c.expires_at, c.created_at,
           c.lease
    FROM claimed c JOIN courier.endpoints e ON e.id = c.endpoint_id
    ORDER BY c.priority DESC, c.id;
    v_set := set_config('courier.update_counted', 'off', true);
END
$$;

-- _claim_due for the common case, which claim_batch asks of its probes: the endpoint has no
-- message scheduled or waiting for a retry, and its messages have never carried an ordering key
-- (endpoints.ordering_keys, which every write of a keyed message sets in its own transaction:
-- _note_ordering_keys, as dequeue relies on). One range of queue_ready_idx, no priority levels
-- of queue_due_idx, no ordering-key checks: _claim_due readies all of them in every execution,
-- whether or not a row needs them (285,000 instructions of a claim of one; BENCHMARKS.md, "A
-- claim that readies only what the endpoint uses"). It takes only messages without a key, so a
-- keyed message committed after claim_batch read the endpoint waits for the next claim, which
-- reads the mark. The rows are found again by ctid (a TID scan: they are locked, so their ctids
-- hold), as dequeue's are, instead of a descent of the primary key each.
CREATE OR REPLACE FUNCTION courier._claim_ready(p_worker_id text, p_batch_size integer, p_endpoint_id integer)
RETURNS SETOF courier.claimed_message
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_writes integer := coalesce(nullif(current_setting('courier.depth_writes', true), '')::integer, 0);
    v_set text := set_config('courier.depth_writes', (v_writes + 1)::text, true)
                  || set_config('courier.update_counted', 'on', true);
BEGIN
    RETURN QUERY
    WITH candidates AS (
        SELECT q.ctid AS tid
        FROM courier.queue q
        WHERE q.endpoint_id = p_endpoint_id
          AND q.status = 'pending' AND q.scheduled_at IS NULL AND q.next_retry_at IS NULL
          AND q.visible_at IS NULL  -- push messages only, as queue_ready_idx holds
          AND (q.expires_at IS NULL OR q.expires_at > now())
          AND q.ordering_key IS NULL  -- the endpoint has never had one (claim_batch)
        ORDER BY q.priority DESC, q.id
        LIMIT p_batch_size
        FOR UPDATE OF q SKIP LOCKED
    ),
    claimed AS (
        UPDATE courier.queue q
        SET status = 'processing', processing_started_at = now(), worker_id = p_worker_id, updated_at = now(),
            lease = courier._next_lease(q.lease)
        WHERE q.ctid = ANY (ARRAY(SELECT c.tid FROM candidates c))
        RETURNING q.id, q.payload, q.headers, q.metadata, q.priority, q.retry_count, q.max_retries,
                  q.correlation_id, q.idempotency_key, q.expires_at, q.created_at, q.lease
    ),
    counted AS (
        INSERT INTO courier.queue_depth AS d (endpoint_id, status, backend_pid, slot, messages)
        SELECT p_endpoint_id, s.status, pg_backend_pid(), v_writes >> 6, s.delta
        FROM (SELECT count(*) AS moved FROM candidates) m
        CROSS JOIN LATERAL (VALUES ('pending', -m.moved), ('processing', m.moved)) AS s(status, delta)
        WHERE m.moved > 0
        ON CONFLICT (endpoint_id, status, backend_pid, slot) DO UPDATE SET messages = d.messages + excluded.messages
    )
    SELECT c.id, p_endpoint_id, e.name, e.protocol, c.payload, c.headers, c.metadata, c.priority,
           c.retry_count, coalesce(c.max_retries, (e.retry_policy ->> 'max_retries')::integer,
                                   (SELECT value::integer FROM courier.settings WHERE name = 'default_max_retries')),
           c.correlation_id, NULL::text, c.idempotency_key, NULL::timestamptz, c.expires_at, c.created_at, c.lease  -- no key, no schedule
    FROM claimed c, courier.endpoints e
    WHERE e.id = p_endpoint_id
    ORDER BY c.priority DESC, c.id;
    v_set := set_config('courier.update_counted', 'off', true);
END
$$;

-- Claims for one endpoint, honouring its circuit and rate limit. A closed circuit claims
-- normally. An open circuit claims nothing until its cooldown has passed; then the one
-- worker whose compare-and-swap moves it to half_open claims a single probe message (and
-- only then logs circuit.half_open). While half_open nothing else is claimed, unless the
-- probe has gone unanswered for a whole cooldown (its worker died), when the next worker
-- may probe again.
CREATE OR REPLACE FUNCTION courier.claim_batch(p_worker_id text, p_batch_size integer, p_endpoint_id integer)
RETURNS SETOF courier.claimed_message
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
SET jit = off
-- Its probes of the queue (below) are planned once per connection, and a queue analyzed while
-- empty (a drained queue, at startup) gets them a sequential scan that the connection then keeps
-- however deep the queue grows: 700,000 instructions a claim at 500 messages in flight.
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_endpoint courier.endpoints;
    v_limit integer := p_batch_size;
    v_rate double precision;
    v_burst double precision;
    v_tokens double precision;
    v_claimed integer;
    v_staged integer;
    v_ready boolean;
    v_scheduled boolean;
BEGIN
    -- A disabled or paused endpoint (pause_endpoint) has nothing to claim.
    SELECT * INTO v_endpoint FROM courier.endpoints WHERE id = p_endpoint_id AND enabled AND paused_at IS NULL;
    IF NOT FOUND THEN
        RETURN;
    END IF;

    IF v_endpoint.circuit_state = 'open' THEN
        IF v_endpoint.circuit_half_open_at > now() THEN
            RETURN;
        END IF;
        UPDATE courier.endpoints SET circuit_state = 'half_open', circuit_half_open_at = now(), updated_at = now()
        WHERE id = p_endpoint_id AND circuit_state = 'open';
        IF NOT FOUND THEN
            RETURN;  -- another worker won the transition and sends the probe
        END IF;
        v_limit := 1;
    ELSIF v_endpoint.circuit_state = 'half_open' THEN
        UPDATE courier.endpoints SET circuit_half_open_at = now()
        WHERE id = p_endpoint_id AND circuit_state = 'half_open'
          AND circuit_half_open_at <= now() - make_interval(secs => courier._setting_int('circuit_breaker_cooldown'));
        IF NOT FOUND THEN
            RETURN;
        END IF;
        v_limit := 1;
    END IF;

    v_rate := (v_endpoint.config #>> '{rate_limit,rate}')::double precision;
    IF v_rate IS NOT NULL THEN
        v_burst := coalesce((v_endpoint.config #>> '{rate_limit,burst}')::double precision, greatest(v_rate, 1));
        -- Serialises claims of rate-limited endpoints only, for the length of one claim.
        SELECT least(v_burst, coalesce(rate_tokens, v_burst)
                     + v_rate * extract(epoch FROM now() - coalesce(rate_refilled_at, now())))
        INTO v_tokens FROM courier.endpoints WHERE id = p_endpoint_id FOR UPDATE;
        v_limit := least(v_limit, floor(v_tokens)::integer);
        IF v_limit < 1 THEN
            UPDATE courier.endpoints SET rate_tokens = v_tokens, rate_refilled_at = now() WHERE id = p_endpoint_id;
            RETURN;  -- throttled: the messages stay pending, untouched
        END IF;
    END IF;

    -- The queue's pending messages for the endpoint, where there are any: two probes of its claim
    -- indexes' heads ask first, because _claim_due's whole plan costs a claim that finds nothing
    -- about 700,000 instructions, and with the stage that is most claims (its pending messages
    -- come from it claimed). The depth counters would answer for less, but they are unlogged and
    -- read low after a crash until rebuilt, and a message must never wait on a counter. Each
    -- probe is ordered as its index is: an EXISTS would drop the order, and the planner then
    -- prefers a sequential scan that expects to meet a pending row early.
    -- Both answers in one statement: they also choose the claim, _claim_ready where only ready
    -- messages wait on an endpoint that has never had an ordering key.
    v_claimed := 0;
    SELECT (SELECT q.id FROM courier.queue q WHERE q.endpoint_id = p_endpoint_id AND q.status = 'pending'
              AND q.scheduled_at IS NULL AND q.next_retry_at IS NULL AND q.visible_at IS NULL  -- queue_ready_idx
            ORDER BY q.priority DESC, q.id LIMIT 1) IS NOT NULL,
           (SELECT q.id FROM courier.queue q WHERE q.endpoint_id = p_endpoint_id AND q.status = 'pending'
              AND (q.scheduled_at IS NOT NULL OR q.next_retry_at IS NOT NULL)
              AND q.visible_at IS NULL  -- queue_pending_rest_idx
            ORDER BY q.priority DESC, q.id LIMIT 1) IS NOT NULL
    INTO v_ready, v_scheduled;
    -- Scheduled or retrying messages wait: the full claim only once one of them is due. Retries
    -- backing off behind a failing minority of deliveries sent every claim of the endpoint to
    -- _claim_due (about 1,000,000 instructions a claim more) while none of them was due yet.
    -- One descent of queue_due_idx for each priority level the endpoint has used.
    IF v_scheduled AND NOT v_endpoint.ordering_keys THEN
        v_scheduled := (SELECT true FROM generate_series(10, 0, -1) AS p(priority)
                        CROSS JOIN LATERAL (
                            SELECT 1 FROM courier.queue q
                            WHERE q.endpoint_id = p_endpoint_id AND q.priority = p.priority AND q.status = 'pending'
                              AND (q.scheduled_at IS NOT NULL OR q.next_retry_at IS NOT NULL)
                              AND q.visible_at IS NULL  -- queue_due_idx
                              AND greatest(q.scheduled_at, q.next_retry_at) <= now()
                            ORDER BY greatest(q.scheduled_at, q.next_retry_at) LIMIT 1) due
                        WHERE v_endpoint.priorities & (1 << p.priority) <> 0
                        LIMIT 1) IS NOT NULL;
    END IF;
    IF v_scheduled OR (v_ready AND v_endpoint.ordering_keys) THEN
        RETURN QUERY SELECT * FROM courier._claim_due(p_worker_id, v_limit, p_endpoint_id);
        GET DIAGNOSTICS v_claimed = ROW_COUNT;
    ELSIF v_ready THEN
        RETURN QUERY SELECT * FROM courier._claim_ready(p_worker_id, v_limit, p_endpoint_id);
        GET DIAGNOSTICS v_claimed = ROW_COUNT;
    END IF;
    -- Then staged single sends (migration 0054), which are newer than what the queue holds and
    -- of the lowest priority: _take_staged claims them straight from the stage, and moves
    -- other endpoints' into the queue. A claim is the mover that keeps the stage a moment deep,
    -- so it runs even when the batch is full. A staged message has no headers, metadata, key,
    -- correlation id or schedule, and its retries are the endpoint's.
    RETURN QUERY
    SELECT t.id, p_endpoint_id, v_endpoint.name, v_endpoint.protocol, t.payload, '{}'::jsonb, '{}'::jsonb,
           0::smallint, 0,
           coalesce((v_endpoint.retry_policy ->> 'max_retries')::integer,
                    (SELECT value::integer FROM courier.settings WHERE name = 'default_max_retries')),
           NULL::uuid, NULL::text, NULL::text, NULL::timestamptz, t.expires_at, t.created_at, t.lease
    FROM courier._take_staged(p_endpoint_id, v_limit - v_claimed, p_worker_id, NULL) t;
    GET DIAGNOSTICS v_staged = ROW_COUNT;
    v_claimed := v_claimed + v_staged;

    IF v_rate IS NOT NULL THEN
        UPDATE courier.endpoints SET rate_tokens = v_tokens - v_claimed, rate_refilled_at = now()
        WHERE id = p_endpoint_id;
    END IF;
    IF v_endpoint.circuit_state <> 'closed' AND v_claimed = 0 THEN
        -- Nothing to probe with: go back to open without waiting a new cooldown.
        UPDATE courier.endpoints SET circuit_state = 'open', circuit_half_open_at = now()
        WHERE id = p_endpoint_id AND circuit_state = 'half_open';
    ELSIF v_endpoint.circuit_state = 'open' THEN
        -- Logged only once a probe is out: an idle open endpoint would log every poll.
        PERFORM courier._log_event('circuit.half_open', p_endpoint_id, jsonb_build_object('name', v_endpoint.name));
    END IF;
END
$$;
