-- Claiming: the worker's claim and release primitives, stale recovery, heartbeats and the
-- maintenance leader's election.

-- Marks delivered messages completed. Only rows still in processing count, so a late
-- completion after stale recovery cannot resurrect a message.
CREATE OR REPLACE FUNCTION courier.complete_batch_v1(p_ids bigint[]) RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_done integer;
BEGIN
    WITH done AS (
        UPDATE courier.queue
        SET status = 'completed', completed_at = now(), updated_at = now()
        WHERE id = ANY (p_ids) AND status = 'processing'
        RETURNING endpoint_id
    ),
    per_endpoint AS (
        SELECT endpoint_id, count(*) AS n FROM done GROUP BY endpoint_id
    ),
    touched AS (
        UPDATE courier.endpoints e SET last_success_at = now()
        FROM per_endpoint p WHERE e.id = p.endpoint_id
        RETURNING p.endpoint_id, p.n
    )
    SELECT coalesce(sum(n), 0) INTO v_done
    FROM touched, LATERAL courier._add_delivery_totals(touched.endpoint_id, 'delivered', touched.n);
    RETURN v_done;
END
$$;

-- Records a failed attempt for each message. A message with a next-attempt time goes back to
-- pending until then; one without (a permanent failure) or out of retries becomes failed.
-- Each attempt's error is appended to error_history.
CREATE OR REPLACE FUNCTION courier.fail_batch_v1(p_ids bigint[], p_errors text[], p_next_attempt_at timestamptz[])
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_failed integer;
BEGIN
    IF cardinality(p_ids) IS DISTINCT FROM cardinality(p_errors)
       OR cardinality(p_ids) IS DISTINCT FROM cardinality(p_next_attempt_at) THEN
        RAISE EXCEPTION '[courier] fail_batch_v1 needs one error and one next-attempt time per id'
            USING ERRCODE = '22023';
    END IF;

    WITH outcome AS (
        SELECT u.id, u.error, u.next_attempt_at
        FROM unnest(p_ids, p_errors, p_next_attempt_at) AS u(id, error, next_attempt_at)
    ),
    failed AS (
        UPDATE courier.queue q
        SET retry_count = q.retry_count + 1,
            last_error = o.error,
            error_history = q.error_history || jsonb_build_object(
                'attempt', q.retry_count + 1, 'at', now(), 'error', o.error, 'worker_id', q.worker_id),
            status = CASE
                WHEN o.next_attempt_at IS NULL
                  OR q.retry_count + 1 > coalesce(q.max_retries, (e.retry_policy ->> 'max_retries')::integer,
                                                  (SELECT value::integer FROM courier.settings
                                                   WHERE name = 'default_max_retries'))
                THEN 'failed' ELSE 'pending' END,
            next_retry_at = o.next_attempt_at,
            completed_at = CASE WHEN o.next_attempt_at IS NULL THEN now() END,
            processing_started_at = NULL,
            updated_at = now()
        FROM outcome o, courier.endpoints e
        WHERE q.id = o.id AND q.status = 'processing' AND e.id = q.endpoint_id
        RETURNING q.endpoint_id, o.error
    ),
    per_endpoint AS (
        SELECT endpoint_id, count(*) AS n, (array_agg(error))[1] AS last_error FROM failed GROUP BY endpoint_id
    ),
    touched AS (
        UPDATE courier.endpoints e SET last_failure_at = now(), last_error = p.last_error
        FROM per_endpoint p WHERE e.id = p.endpoint_id
        RETURNING p.endpoint_id, p.n
    )
    SELECT coalesce(sum(n), 0) INTO v_failed
    FROM touched, LATERAL courier._add_delivery_totals(touched.endpoint_id, 'failed_attempt', touched.n);
    RETURN v_failed;
END
$$;

-- Puts claimed messages back to pending after p_delay_seconds without counting an attempt:
-- for messages a worker claimed but did not dispatch (shutdown, a circuit that opened
-- mid-batch).
CREATE OR REPLACE FUNCTION courier.release_batch_v1(p_ids bigint[], p_delay_seconds integer DEFAULT 0) RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_released integer;
BEGIN
    UPDATE courier.queue
    SET status = 'pending', processing_started_at = NULL, worker_id = NULL,
        next_retry_at = now() + make_interval(secs => greatest(p_delay_seconds, 0)), updated_at = now()
    WHERE id = ANY (p_ids) AND status = 'processing';
    GET DIAGNOSTICS v_released = ROW_COUNT;
    RETURN v_released;
END
$$;

-- Stale recovery (ulak): messages in processing longer than stale_recovery_timeout (or
-- p_timeout_seconds) go back to pending for immediate redelivery, with an attempt counted.
CREATE OR REPLACE FUNCTION courier.recover_stale_messages(p_timeout_seconds integer DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_recovered integer;
BEGIN
    UPDATE courier.queue
    SET status = 'pending', retry_count = retry_count + 1,
        last_error = 'Recovered from stale processing state',
        error_history = error_history || jsonb_build_object(
            'attempt', retry_count + 1, 'at', now(), 'outcome', 'stale', 'worker_id', worker_id,
            'error', 'Recovered from stale processing state'),
        next_retry_at = now(), processing_started_at = NULL, updated_at = now()
    WHERE status = 'processing'
      AND processing_started_at < now() - make_interval(
            secs => coalesce(p_timeout_seconds, courier._setting_int('stale_recovery_timeout')));
    GET DIAGNOSTICS v_recovered = ROW_COUNT;
    IF v_recovered > 0 THEN
        PERFORM courier._log_event('messages.stale_recovered', NULL, jsonb_build_object('count', v_recovered));
    END IF;
    RETURN v_recovered;
END
$$;

-- Workers -----------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION courier.worker_heartbeat_v1(p_worker_id text, p_hostname text, p_pid integer,
                                            p_concurrency integer, p_in_flight integer,
                                            p_delivered bigint, p_failed bigint, p_state text)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, courier, pg_temp
AS $$
    INSERT INTO courier.workers AS w (worker_id, hostname, pid, concurrency, in_flight, delivered, failed, state)
    VALUES (p_worker_id, p_hostname, p_pid, p_concurrency, p_in_flight, p_delivered, p_failed, p_state)
    ON CONFLICT (worker_id) DO UPDATE
    SET concurrency = excluded.concurrency, in_flight = excluded.in_flight, delivered = excluded.delivered,
        failed = excluded.failed, state = excluded.state, last_heartbeat = now()
$$;

-- The maintenance leader --------------------------------------------------------------------

-- Tries to make the calling connection the maintenance leader: a session advisory lock,
-- held until that connection ends, so a dead leader's lock is released with its
-- connection and another worker wins the next election. Returns whether it won.
CREATE OR REPLACE FUNCTION courier.try_lead_maintenance_v1(p_worker_id text) RETURNS boolean
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
    RETURN v_pruned;
END
$$;

-- Plan notes for both claims, seen with auto_explain on PostgreSQL 15. The claim's UPDATE joined its candidates to the queue, and the planner, which cannot see
-- how few candidates a LIMIT of p_batch_size leaves, chose a hash join over a sequential
-- scan of the whole queue (24 ms of a claim of 100 at 100k pending). Matching the
-- candidates' ids with = ANY keeps the UPDATE on the primary key.
--
-- The same generic estimates put the claim over jit_above_cost, and JIT-compiling it cost
-- about 30 ms per claim on a server with JIT (PostgreSQL's default where LLVM is present),
-- for queries that run in 3 ms. The worker functions run small, known queries: no JIT.
CREATE OR REPLACE FUNCTION courier.claim_batch_v1(p_worker_id text, p_batch_size integer, p_endpoint_id integer DEFAULT NULL)
RETURNS SETOF courier.claimed_message
LANGUAGE sql
SET search_path = pg_catalog, courier, pg_temp
SET jit = off
AS $$
    WITH candidates AS (
        SELECT c.id
        FROM courier.endpoints e
        CROSS JOIN LATERAL (
            SELECT q.id, q.priority
            FROM courier.queue q
            WHERE q.endpoint_id = e.id
              AND q.status = 'pending'
              AND (q.scheduled_at IS NULL OR q.scheduled_at <= now())
              AND (q.next_retry_at IS NULL OR q.next_retry_at <= now())
              AND (q.expires_at IS NULL OR q.expires_at > now())
              AND (q.ordering_key IS NULL OR (
                    NOT EXISTS (SELECT 1 FROM courier.queue q2
                                WHERE q2.ordering_key = q.ordering_key AND q2.status = 'processing')
                AND NOT EXISTS (SELECT 1 FROM courier.queue q2
                                WHERE q2.ordering_key = q.ordering_key AND q2.status = 'pending'
                                  AND q2.id < q.id)))
            ORDER BY q.priority DESC, q.id
            LIMIT p_batch_size
            FOR UPDATE OF q SKIP LOCKED
        ) c
        WHERE e.enabled AND (p_endpoint_id IS NULL OR e.id = p_endpoint_id)
        ORDER BY c.priority DESC, c.id
        LIMIT p_batch_size
    ),
    claimed AS (
        UPDATE courier.queue q
        SET status = 'processing', processing_started_at = now(), worker_id = p_worker_id, updated_at = now()
        WHERE q.id = ANY (ARRAY(SELECT id FROM candidates))
        RETURNING q.*
    )
    SELECT c.id, c.endpoint_id, e.name, e.protocol, c.payload, c.headers, c.metadata, c.priority,
           c.retry_count, coalesce(c.max_retries, (e.retry_policy ->> 'max_retries')::integer,
                                   (SELECT value::integer FROM courier.settings WHERE name = 'default_max_retries')),
           c.correlation_id, c.ordering_key, c.idempotency_key, c.scheduled_at, c.expires_at, c.created_at
    FROM claimed c JOIN courier.endpoints e ON e.id = c.endpoint_id
    ORDER BY c.priority DESC, c.id
$$;

-- Claims for one endpoint, honouring its circuit and rate limit. A closed circuit claims
-- normally. An open circuit claims nothing until its cooldown has passed; then the one
-- worker whose compare-and-swap moves it to half_open claims a single probe message (and
-- only then logs circuit.half_open). While half_open nothing else is claimed, unless the
-- probe has gone unanswered for a whole cooldown (its worker died), when the next worker
-- may probe again.
CREATE OR REPLACE FUNCTION courier.claim_batch_v2(p_worker_id text, p_batch_size integer, p_endpoint_id integer)
RETURNS SETOF courier.claimed_message
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
SET jit = off
AS $$
DECLARE
    v_endpoint courier.endpoints;
    v_cooldown interval := make_interval(secs => courier._setting_int('circuit_breaker_cooldown'));
    v_limit integer := p_batch_size;
    v_rate double precision;
    v_burst double precision;
    v_tokens double precision;
    v_claimed integer;
BEGIN
    SELECT * INTO v_endpoint FROM courier.endpoints WHERE id = p_endpoint_id AND enabled;
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
        WHERE id = p_endpoint_id AND circuit_state = 'half_open' AND circuit_half_open_at <= now() - v_cooldown;
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

    RETURN QUERY SELECT * FROM courier.claim_batch_v1(p_worker_id, v_limit, p_endpoint_id);
    GET DIAGNOSTICS v_claimed = ROW_COUNT;

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
