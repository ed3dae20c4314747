-- Worker-side primitives. They carry a version suffix so that workers from two releases
-- can run side by side during an upgrade; the pool calls them, applications never do.

CREATE TYPE courier.claimed_message AS (
    id              bigint,
    endpoint_id     integer,
    endpoint_name   text,
    protocol        text,
    payload         jsonb,
    headers         jsonb,
    metadata        jsonb,
    priority        smallint,
    retry_count     integer,
    max_retries     integer,
    correlation_id  uuid,
    ordering_key    text,
    idempotency_key text,
    scheduled_at    timestamptz,
    expires_at      timestamptz,
    created_at      timestamptz
);

-- Claims up to p_batch_size deliverable messages, priority DESC then FIFO by id, for one
-- endpoint or (p_endpoint_id NULL) across every enabled endpoint. A deliverable message is
-- pending, due (scheduled_at and next_retry_at reached), unexpired, on an enabled endpoint,
-- and first in line for its ordering key: nothing with its key is processing, and nothing
-- earlier with its key is still pending (ulak's two NOT EXISTS rules).
--
-- The per-endpoint scan runs on queue_claim_idx. Across endpoints, each endpoint offers at
-- most p_batch_size locked candidates; the unchosen ones are unlocked when the claim
-- statement's transaction ends, which is immediately for an autocommit worker.
CREATE FUNCTION courier.claim_batch_v1(p_worker_id text, p_batch_size integer, p_endpoint_id integer DEFAULT NULL)
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
        FROM candidates
        WHERE q.id = candidates.id
        RETURNING q.*
    )
    SELECT c.id, c.endpoint_id, e.name, e.protocol, c.payload, c.headers, c.metadata, c.priority,
           c.retry_count, coalesce(c.max_retries, (e.retry_policy ->> 'max_retries')::integer,
                                   (SELECT value::integer FROM courier.settings WHERE name = 'default_max_retries')),
           c.correlation_id, c.ordering_key, c.idempotency_key, c.scheduled_at, c.expires_at, c.created_at
    FROM claimed c JOIN courier.endpoints e ON e.id = c.endpoint_id
    ORDER BY c.priority DESC, c.id
$$;

-- Marks delivered messages completed. Only rows still in processing count, so a late
-- completion after stale recovery cannot resurrect a message.
CREATE FUNCTION courier.complete_batch_v1(p_ids bigint[]) RETURNS integer
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
CREATE FUNCTION courier.fail_batch_v1(p_ids bigint[], p_errors text[], p_next_attempt_at timestamptz[])
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
