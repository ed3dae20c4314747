-- Two plan problems of the worker's hot path, both seen with auto_explain on PostgreSQL 15,
-- and an event-log flood from idle open circuits.
--
-- The claim's UPDATE joined its candidates to the queue, and the planner, which cannot see
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

-- An open circuit whose endpoint has nothing due moved to half_open and back on every
-- poll of every worker, logging circuit.half_open each time; the event now waits for a
-- probe to go out.
CREATE OR REPLACE FUNCTION courier.claim_batch_v2(p_worker_id text, p_batch_size integer, p_endpoint_id integer)
RETURNS SETOF courier.claimed_message
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
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

ALTER FUNCTION courier.claim_batch_v1(text, integer, integer) SET jit = off;
ALTER FUNCTION courier.claim_batch_v2(text, integer, integer) SET jit = off;
ALTER FUNCTION courier.report_outcomes_v1(bigint[], text[], text[], integer[], jsonb[]) SET jit = off;
ALTER FUNCTION courier.archive_completed_messages(integer, integer) SET jit = off;
