-- Delivery outcomes: retry backoff, the circuit breaker, dead-lettering, the DLQ and its
-- counters, and redrive. Each function is defined here once; `courier migrate` re-applies
-- this file when it changes.

CREATE OR REPLACE FUNCTION courier._count_dlq() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        DELETE FROM courier.dlq_depth;
        RETURN NULL;
    END IF;
    INSERT INTO courier.dlq_depth AS d (endpoint_id, status, backend_pid, messages)
    SELECT endpoint_id, status, pg_backend_pid(), sum(delta)
    FROM (SELECT endpoint_id, status, 1 AS delta FROM new_rows
          UNION ALL
          SELECT endpoint_id, status, -1 FROM old_rows) AS changes
    GROUP BY endpoint_id, status
    HAVING sum(delta) <> 0
    ON CONFLICT (endpoint_id, status, backend_pid)
    DO UPDATE SET messages = d.messages + excluded.messages;
    RETURN NULL;
END
$$;

-- Transition tables cannot be shared across events, so each event names its own; an
-- empty stand-in fills the missing side.
CREATE OR REPLACE FUNCTION courier._count_dlq_insert() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO courier.dlq_depth AS d (endpoint_id, status, backend_pid, messages)
    SELECT endpoint_id, status, pg_backend_pid(), count(*) FROM new_rows GROUP BY endpoint_id, status
    ON CONFLICT (endpoint_id, status, backend_pid) DO UPDATE SET messages = d.messages + excluded.messages;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION courier._count_dlq_delete() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO courier.dlq_depth AS d (endpoint_id, status, backend_pid, messages)
    SELECT endpoint_id, status, pg_backend_pid(), -count(*) FROM old_rows GROUP BY endpoint_id, status
    ON CONFLICT (endpoint_id, status, backend_pid) DO UPDATE SET messages = d.messages + excluded.messages;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER dlq_count_insert AFTER INSERT ON courier.dlq
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION courier._count_dlq_insert();

CREATE OR REPLACE TRIGGER dlq_count_update AFTER UPDATE ON courier.dlq
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION courier._count_dlq();

CREATE OR REPLACE TRIGGER dlq_count_delete AFTER DELETE ON courier.dlq
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION courier._count_dlq_delete();

CREATE OR REPLACE TRIGGER dlq_count_truncate AFTER TRUNCATE ON courier.dlq
    FOR EACH STATEMENT EXECUTE FUNCTION courier._count_dlq();

-- Retry backoff ---------------------------------------------------------------------

-- Seconds to wait before the next attempt of a message that has failed p_retry_count times
-- before. The endpoint's retry_policy picks the strategy and may override the global
-- delays; above 10 retries exponential backoff returns the cap directly, since 2^n would
-- overflow long before it mattered.
CREATE OR REPLACE FUNCTION courier.retry_delay(p_policy jsonb, p_retry_count integer) RETURNS integer
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_base bigint := coalesce((p_policy ->> 'base_delay_seconds')::numeric::bigint, courier._setting_int('retry_base_delay'));
    v_max bigint := coalesce((p_policy ->> 'max_delay_seconds')::numeric::bigint, courier._setting_int('retry_max_delay'));
    v_increment bigint := coalesce((p_policy ->> 'increment_seconds')::numeric::bigint, courier._setting_int('retry_increment'));
    v_count integer := greatest(coalesce(p_retry_count, 0), 0);
BEGIN
    CASE coalesce(p_policy ->> 'backoff', 'exponential')
    WHEN 'fixed' THEN
        RETURN least(v_base, v_max);
    WHEN 'linear' THEN
        RETURN least(v_base + v_count::bigint * v_increment, v_max);
    ELSE
        IF v_count > 10 THEN
            RETURN v_max;
        END IF;
        RETURN least(v_base * (1::bigint << v_count), v_max);
    END CASE;
END
$$;

-- Applies the circuit breaker to one endpoint after a batch: p_failures retryable failures
-- and p_successes successes. Updates are serialised per endpoint by its row lock (an advisory
-- key, which any database user can hold, let one stop every report for the endpoint).
CREATE OR REPLACE FUNCTION courier._update_circuit_breaker(p_endpoint_id integer, p_successes integer, p_failures integer)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_endpoint courier.endpoints;
    v_threshold integer := courier._setting_int('circuit_breaker_threshold');
    v_cooldown interval := make_interval(secs => courier._setting_int('circuit_breaker_cooldown'));
    v_count integer;
BEGIN
    -- All went well on a closed circuit with no failures counted: nothing to change, so no
    -- lock either. Taking the lock here made every report of a busy endpoint wait for the
    -- commit of the one before it.
    IF p_failures = 0 AND EXISTS (SELECT 1 FROM courier.endpoints
                                  WHERE id = p_endpoint_id AND circuit_state = 'closed'
                                    AND circuit_failure_count = 0) THEN
        RETURN;
    END IF;
    SELECT * INTO v_endpoint FROM courier.endpoints WHERE id = p_endpoint_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;

    IF v_endpoint.circuit_state = 'half_open' THEN
        IF p_failures > 0 THEN
            UPDATE courier.endpoints SET circuit_state = 'open', circuit_opened_at = now(),
                   circuit_half_open_at = now() + v_cooldown,
                   circuit_failure_count = circuit_failure_count + p_failures, updated_at = now()
            WHERE id = p_endpoint_id;
            PERFORM courier._log_event('circuit.reopened', p_endpoint_id, jsonb_build_object('name', v_endpoint.name));
        ELSIF p_successes > 0 THEN
            UPDATE courier.endpoints SET circuit_state = 'closed', circuit_failure_count = 0,
                   circuit_opened_at = NULL, circuit_half_open_at = NULL, updated_at = now()
            WHERE id = p_endpoint_id;
            PERFORM courier._log_event('circuit.closed', p_endpoint_id, jsonb_build_object('name', v_endpoint.name));
        END IF;
        RETURN;
    END IF;

    -- A success resets the count; failures that came with it in the same batch still count.
    v_count := CASE WHEN p_successes > 0 THEN 0 ELSE v_endpoint.circuit_failure_count END + p_failures;
    IF v_count = v_endpoint.circuit_failure_count THEN
        RETURN;
    END IF;
    IF v_endpoint.circuit_state = 'closed' AND v_count >= v_threshold THEN
        UPDATE courier.endpoints SET circuit_state = 'open', circuit_failure_count = v_count,
               circuit_opened_at = now(), circuit_half_open_at = now() + v_cooldown, updated_at = now()
        WHERE id = p_endpoint_id;
        PERFORM courier._log_event('circuit.opened', p_endpoint_id,
            jsonb_build_object('name', v_endpoint.name, 'failures', v_count, 'threshold', v_threshold));
    ELSE
        UPDATE courier.endpoints SET circuit_failure_count = v_count WHERE id = p_endpoint_id;
    END IF;
END
$$;

-- DLQ operations ---------------------------------------------------------------------

-- Re-queues DLQ rows as new pending messages in their original order (the original
-- message ids, which is FIFO per ordering key, whatever order they failed in), with
-- retry_count reset and expires_at and idempotency_key cleared, marking each row
-- 'redriven'. Works through at most p_limit rows (NULL: all); returns how many it redrove.
-- A pull topic's dead letter (<topic>.dlq) comes back as courier.requeue brings it back, by
-- queue-ti's rule: with its key, a new TTL from now, and its error history; one whose key an
-- active message of the topic holds (or an older dead letter of the same key in this batch)
-- is left failed for a later redrive rather than failing the whole batch, and so is one that a
-- consumer of <topic>.dlq holds under a running lease (requeue() says why).
CREATE OR REPLACE FUNCTION courier._redrive(p_dlq_ids bigint[], p_endpoint_id integer, p_limit integer) RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    v_count integer;
BEGIN
    -- Hold the endpoints being redriven to until commit: a concurrent drop_endpoint waits, and
    -- then sees (and counts or deletes) these messages instead of leaving them orphaned.
    PERFORM 1 FROM courier.endpoints e
    WHERE (p_endpoint_id IS NULL OR e.id = p_endpoint_id)
      AND e.id IN (SELECT d.endpoint_id FROM courier.dlq d
                   WHERE d.status = 'failed' AND (p_dlq_ids IS NULL OR d.id = ANY (p_dlq_ids)))
    ORDER BY e.id
    FOR KEY SHARE;
    WITH picked AS (
        SELECT d.id FROM courier.dlq d
        WHERE d.status = 'failed'
          AND (p_dlq_ids IS NULL OR d.id = ANY (p_dlq_ids))
          AND (p_endpoint_id IS NULL OR d.endpoint_id = p_endpoint_id)
          AND EXISTS (SELECT 1 FROM courier.endpoints e WHERE e.id = d.endpoint_id)
          -- A topic's dead letter keeps its own expiry, as requeue() does: one past it stays
          -- here (requeue() of it says why) rather than going back only to expire. (Written
          -- as NOT (... AND expires_at <= now()), this was NULL for one with no expiry, which
          -- left every such dead letter out of redrive_endpoint and redrive_all.)
          AND (d.original_topic IS NULL OR d.expires_at IS NULL OR d.expires_at > now())
          AND NOT (d.leased_at IS NOT NULL AND d.visible_at > now())
          AND NOT (d.original_topic IS NOT NULL AND d.key IS NOT NULL
                   AND (EXISTS (SELECT 1 FROM courier.queue q
                                WHERE q.endpoint_id = d.endpoint_id AND q.key = d.key
                                  AND q.status IN ('pending', 'processing'))
                        OR EXISTS (SELECT 1 FROM courier.dlq o
                                   WHERE o.endpoint_id = d.endpoint_id AND o.key = d.key AND o.status = 'failed'
                                     AND o.original_topic IS NOT NULL
                                     AND (o.original_message_id, o.id) < (d.original_message_id, d.id))))
        ORDER BY d.original_message_id, d.id
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ),
    requeued AS (
        INSERT INTO courier.queue (endpoint_id, payload, headers, metadata, priority, ordering_key,
                                   correlation_id, scheduled_at, visible_at, payload_binary, body, key, expires_at,
                                   error_history)
        SELECT d.endpoint_id, d.payload, d.headers, d.metadata, d.priority, d.ordering_key,
               d.correlation_id, NULL, courier._pull_visible_at(e.protocol, NULL), d.payload_binary, d.body,
               CASE WHEN t.requeued THEN d.key END,
               CASE WHEN t.requeued THEN coalesce(d.expires_at, courier._ttl_expires_at(e.config, now())) END,
               CASE WHEN t.requeued THEN d.error_history ELSE '[]' END
        FROM courier.dlq d JOIN picked USING (id) JOIN courier.endpoints e ON e.id = d.endpoint_id
        CROSS JOIN LATERAL (SELECT d.original_topic IS NOT NULL AND e.protocol = 'pull' AS requeued) t
        ORDER BY d.original_message_id, d.id
        RETURNING id, correlation_id
    ),
    paired AS (
        -- New ids were handed out in the same order as the picked rows.
        SELECT p.id AS dlq_id, r.id AS message_id
        FROM (SELECT id, row_number() OVER (ORDER BY original_message_id, id) AS n
              FROM courier.dlq WHERE id IN (SELECT id FROM picked)) p
        JOIN (SELECT id, row_number() OVER (ORDER BY id) AS n FROM requeued) r USING (n)
    )
    UPDATE courier.dlq d SET status = 'redriven', redriven_at = now(), redriven_message_id = paired.message_id,
                             leased_at = NULL
    FROM paired WHERE d.id = paired.dlq_id;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$$;

CREATE OR REPLACE FUNCTION courier.redrive_message(p_dlq_id bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_row courier.dlq;
BEGIN
    SELECT * INTO v_row FROM courier.dlq WHERE id = p_dlq_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION '[courier] DLQ entry % does not exist', p_dlq_id USING ERRCODE = 'P0002';
    END IF;
    IF v_row.status = 'redriven' THEN
        RAISE EXCEPTION '[courier] DLQ entry % was already redriven as message %', p_dlq_id, v_row.redriven_message_id
            USING ERRCODE = '55000';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM courier.endpoints WHERE id = v_row.endpoint_id) THEN
        RAISE EXCEPTION '[courier] endpoint "%" of DLQ entry % no longer exists', v_row.endpoint_name, p_dlq_id
            USING ERRCODE = '55000', HINT = 'Recreate the endpoint first';
    END IF;
    IF v_row.original_topic IS NOT NULL THEN  -- a topic's dead letter: one rule with `topic requeue`
        v_row.redriven_message_id := courier.requeue(p_dlq_id);
        PERFORM pg_notify('courier_new_msg', v_row.endpoint_id::text);
        RETURN v_row.redriven_message_id;
    END IF;
    PERFORM courier._redrive(ARRAY[p_dlq_id], NULL, 1);
    SELECT redriven_message_id INTO v_row.redriven_message_id FROM courier.dlq WHERE id = p_dlq_id;
    PERFORM courier._log_event('dlq.redrive', v_row.endpoint_id,
        jsonb_build_object('dlq_id', p_dlq_id, 'message_id', v_row.redriven_message_id));
    PERFORM pg_notify('courier_new_msg', v_row.endpoint_id::text);
    RETURN v_row.redriven_message_id;
END
$$;

-- Redrives every failed entry of one endpoint (as ulak's does) and returns the count. With
-- p_batch_size, at most that many per call instead: call again until it returns 0 (the CLI
-- and the console do, with a progress bar), so each batch commits on its own.
CREATE OR REPLACE FUNCTION courier.redrive_endpoint(p_endpoint_name text, p_batch_size integer DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_endpoint courier.endpoints := courier._endpoint_by_name(p_endpoint_name);
    v_count integer;
BEGIN
    v_count := courier._redrive(NULL, v_endpoint.id, CASE WHEN p_batch_size IS NOT NULL THEN greatest(p_batch_size, 1) END);
    IF v_count > 0 THEN
        PERFORM courier._log_event('dlq.redrive_endpoint', v_endpoint.id,
            jsonb_build_object('name', p_endpoint_name, 'count', v_count));
        PERFORM pg_notify('courier_new_msg', v_endpoint.id::text);
    END IF;
    RETURN v_count;
END
$$;

-- Every failed entry of every endpoint; p_batch_size as for redrive_endpoint.
CREATE OR REPLACE FUNCTION courier.redrive_all(p_batch_size integer DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_count integer := courier._redrive(NULL, NULL, CASE WHEN p_batch_size IS NOT NULL THEN greatest(p_batch_size, 1) END);
BEGIN
    IF v_count > 0 THEN
        PERFORM courier._log_event('dlq.redrive_all', NULL, jsonb_build_object('count', v_count));
        PERFORM pg_notify('courier_new_msg', '');
    END IF;
    RETURN v_count;
END
$$;

-- When a DLQ entry becomes old enough for cleanup_dlq() to delete: failed before this.
CREATE OR REPLACE FUNCTION courier._dlq_retention_cutoff() RETURNS timestamptz
LANGUAGE sql STABLE
AS $$ SELECT now() - make_interval(days => courier._setting_int('dlq_retention_days')::integer) $$;

-- How many entries cleanup_dlq() would delete now (`courier dlq cleanup` asks with it first).
CREATE OR REPLACE FUNCTION courier.dlq_cleanup_due() RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$ SELECT count(*) FROM courier.dlq WHERE failed_at < courier._dlq_retention_cutoff() $$;

CREATE OR REPLACE FUNCTION courier.cleanup_dlq() RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_deleted integer;
BEGIN
    DELETE FROM courier.dlq WHERE failed_at < courier._dlq_retention_cutoff();
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    IF v_deleted > 0 THEN
        PERFORM courier._log_event('dlq.cleanup', NULL, jsonb_build_object('deleted', v_deleted));
    END IF;
    RETURN v_deleted;
END
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

-- report_outcomes's path when every outcome is a success, the common case (issue 13): one
-- statement moves the delivered messages to the archive and counts them per endpoint, and
-- each endpoint's bookkeeping reads its row once, instead of a read of every reported row
-- before the writes. Only a message still in processing under the lease its worker names
-- moves (the fence is in the DELETE itself). The general path planned its statements on
-- every call (1-2 ms of a report of 100) because their generic plans were bad: joined to an
-- unnest of the ids, the DELETE read every row in processing once per id. Here the status is
-- a variable, not a literal, so that the generic plan, which is cached, cannot take
-- queue_processing_started_idx (every row in processing and its dead index entries) for the
-- primary key: an analyze that ran while nothing was in processing made the planner think
-- that index held one row. And nested loops are off, so that the ids' unnest is joined by
-- hash whatever the estimates: a nested loop (or a lookup by array_position) compares every
-- reported id with every row, 7 ms at a batch of 1000.
-- delivered: how many messages it moved; a report naming an id twice is answered once.
-- p_settle false (report_outcomes's general path, which settles each endpoint once for its
-- successes and failures together): no endpoint row is changed and no stale report counted, and
-- endpoint_ids and counts name every endpoint delivered to; true: only those whose row it changed.
DROP FUNCTION IF EXISTS courier._report_delivered(bigint[], integer[], jsonb[]);
CREATE OR REPLACE FUNCTION courier._report_delivered(p_ids bigint[], p_leases integer[], p_responses jsonb[],
                                                     p_settle boolean, OUT delivered integer,
                                                     OUT endpoint_ids integer[], OUT counts integer[])
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_nestloop = off
-- Its generic plan is made once per connection: against a queue analyzed while empty it was a
-- sequential scan of the whole queue in every report, however deep the queue then grew.
SET enable_seqscan = off
AS $$
DECLARE
    v_processing CONSTANT text := 'processing';
    v_delivered integer := 0;
    v_found integer;
    v_endpoint_ids integer[];  -- endpoints whose row a delivery changes (last_success_at, circuit), or all
    v_counts integer[];
    v_more_ids integer[];
    v_more_counts integer[];
    v_endpoint courier.endpoints;
BEGIN
    -- Each statement below deletes, archives, counts the delivered per endpoint in
    -- delivery_totals and names the endpoints whose row the deliveries change (last_success_at at
    -- most once a second, a circuit with failures to clear): most reports change none, and then
    -- this is the whole report. Counting and looking at the endpoints in statements of their own
    -- cost a worker's cycle of ten about 5% more (BENCHMARKS.md, "A worker's cycle in fewer statements").
    -- The stage first for a claim taken there (_stage_lease), then the queue for the rest,
    -- as ack looks (the leader may move a claim from the stage into the queue meanwhile).
    IF courier._any_stage_lease(p_leases) THEN
        -- A staged message has no headers, metadata, key, schedule or history: the archive's defaults.
        WITH moved AS (
            DELETE FROM courier.send_stage s
            USING unnest(p_ids, p_leases, p_responses) AS u(id, lease, response)
            WHERE s.id = ANY (p_ids) AND s.worker_id IS NOT NULL AND s.id = u.id AND s.lease = u.lease
            RETURNING s.id, s.endpoint_id, s.payload, s.created_at, s.worker_id, u.response AS captured
        ),
        archived AS (
            INSERT INTO courier.archive (id, endpoint_id, payload, status, expires_at, worker_id, response,
                                         completed_at, created_at)
            SELECT m.id, m.endpoint_id, m.payload, 'completed',
                   m.created_at + make_interval(secs => nullif(coalesce(e.config_ttl_seconds, l.default_message_ttl), 0)),
                   m.worker_id, m.captured, now(), m.created_at
            FROM moved m JOIN courier.endpoints e ON e.id = m.endpoint_id, courier.send_limits l
            RETURNING endpoint_id
        ),
        per_endpoint AS (SELECT a.endpoint_id, count(*)::integer AS n FROM archived a GROUP BY a.endpoint_id),
        counted AS (
            INSERT INTO courier.delivery_totals AS d (endpoint_id, outcome, backend_pid, total)
            SELECT g.endpoint_id, 'delivered', pg_backend_pid(), g.n FROM per_endpoint g
            ON CONFLICT (endpoint_id, outcome, backend_pid) DO UPDATE SET total = d.total + excluded.total
        )
        SELECT coalesce(sum(g.n), 0),
               array_agg(g.endpoint_id ORDER BY g.endpoint_id)
                   FILTER (WHERE NOT p_settle OR courier._delivery_changes_endpoint(e)),
               array_agg(g.n ORDER BY g.endpoint_id) FILTER (WHERE NOT p_settle OR courier._delivery_changes_endpoint(e))
        INTO v_found, v_endpoint_ids, v_counts
        FROM per_endpoint g LEFT JOIN courier.endpoints e ON e.id = g.endpoint_id;
        v_delivered := v_found;
    END IF;
    IF v_delivered < cardinality(p_ids) THEN
        WITH moved AS (
            DELETE FROM courier.queue q
            USING unnest(p_ids, p_leases, p_responses) AS u(id, lease, response)  -- NULL p_responses: NULLs
            WHERE q.id = ANY (p_ids) AND q.status = v_processing AND q.id = u.id AND q.lease = u.lease
            -- What the archive keeps, not the whole row (push messages have no key or binary body).
            RETURNING q.id, q.endpoint_id, q.payload, q.headers, q.metadata, q.priority, q.retry_count, q.max_retries,
                      q.scheduled_at, q.expires_at, q.idempotency_key, q.correlation_id, q.ordering_key,
                      q.last_error, q.error_history, q.worker_id, q.response, q.created_at, u.response AS captured
        ),
        archived AS (
            INSERT INTO courier.archive (id, endpoint_id, payload, headers, metadata, status, priority, retry_count,
                                         max_retries, scheduled_at, expires_at, idempotency_key, correlation_id,
                                         ordering_key, last_error, error_history, worker_id, response, completed_at,
                                         created_at)
            SELECT m.id, m.endpoint_id, m.payload, m.headers, m.metadata, 'completed', m.priority,
                   m.retry_count, m.max_retries, m.scheduled_at, m.expires_at, m.idempotency_key, m.correlation_id,
                   m.ordering_key, m.last_error, m.error_history, m.worker_id,
                   coalesce(m.captured, m.response), now(), m.created_at
            FROM moved m
            RETURNING endpoint_id
        ),
        per_endpoint AS (SELECT a.endpoint_id, count(*)::integer AS n FROM archived a GROUP BY a.endpoint_id),
        counted AS (
            INSERT INTO courier.delivery_totals AS d (endpoint_id, outcome, backend_pid, total)
            SELECT g.endpoint_id, 'delivered', pg_backend_pid(), g.n FROM per_endpoint g
            ON CONFLICT (endpoint_id, outcome, backend_pid) DO UPDATE SET total = d.total + excluded.total
        )
        SELECT coalesce(sum(g.n), 0),
               array_agg(g.endpoint_id ORDER BY g.endpoint_id)
                   FILTER (WHERE NOT p_settle OR courier._delivery_changes_endpoint(e)),
               array_agg(g.n ORDER BY g.endpoint_id) FILTER (WHERE NOT p_settle OR courier._delivery_changes_endpoint(e))
        INTO v_found, v_more_ids, v_more_counts
        FROM per_endpoint g LEFT JOIN courier.endpoints e ON e.id = g.endpoint_id;
        v_delivered := v_delivered + v_found;
        IF v_endpoint_ids IS NULL THEN
            v_endpoint_ids := v_more_ids;
            v_counts := v_more_counts;
        ELSIF v_more_ids IS NOT NULL THEN  -- both: one entry an endpoint, in id order (the lock order)
            SELECT array_agg(a.id ORDER BY a.id), array_agg(a.n ORDER BY a.id) INTO v_endpoint_ids, v_counts
            FROM (SELECT u.id, sum(u.n)::integer AS n
                  FROM unnest(v_endpoint_ids || v_more_ids, v_counts || v_more_counts) AS u(id, n) GROUP BY u.id) a;
        END IF;
    END IF;
    delivered := v_delivered;
    endpoint_ids := v_endpoint_ids;
    counts := v_counts;
    IF NOT p_settle THEN
        RETURN;
    END IF;

    FOR i IN 1 .. coalesce(cardinality(v_endpoint_ids), 0) LOOP
        SELECT * INTO v_endpoint FROM courier.endpoints WHERE id = v_endpoint_ids[i];
        CONTINUE WHEN NOT FOUND;
        -- As report_outcomes: successes alone refresh last_success_at at most once a second.
        IF v_endpoint.last_success_at IS NULL OR v_endpoint.last_success_at < now() - interval '1 second' THEN
            UPDATE courier.endpoints SET last_success_at = now() WHERE id = v_endpoint.id;
        END IF;
        -- A closed circuit with no failures counted has nothing to change (nor to lock).
        IF v_endpoint.circuit_state <> 'closed' OR v_endpoint.circuit_failure_count <> 0 THEN
            PERFORM courier._update_circuit_breaker(v_endpoint.id, v_counts[i], 0);
        END IF;
    END LOOP;
    IF v_delivered < cardinality(p_ids) THEN  -- reports whose lease went stale: counted and logged
        PERFORM courier._count_stale_reports('report', cardinality(p_ids) - v_delivered, p_ids);
    END IF;
END
$$;

-- Whether a report is all successes, well formed (one lease, outcome, error, retry-after and
-- response per id, every lease given) and not empty: report_outcomes's lean path, which
-- report_and_claim also takes without calling report_outcomes. A plain expression, which inlines
-- into the callers' IF.
CREATE OR REPLACE FUNCTION courier._only_successes(p_ids bigint[], p_leases integer[], p_outcomes text[],
                                                   p_errors text[], p_retry_after integer[], p_responses jsonb[])
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT coalesce(cardinality(p_ids), 0) > 0
           AND cardinality(p_ids) = coalesce(cardinality(p_leases), 0)
           AND cardinality(p_ids) = coalesce(cardinality(p_outcomes), 0)
           AND cardinality(p_ids) = coalesce(cardinality(p_errors), 0)
           AND cardinality(p_ids) = coalesce(cardinality(p_retry_after), cardinality(p_ids))
           AND cardinality(p_ids) = coalesce(cardinality(p_responses), cardinality(p_ids))
           AND array_position(p_leases, NULL) IS NULL
           AND coalesce('success' = ALL (p_outcomes), false)  -- NULL when an outcome is NULL
$$;

-- Whether a delivery to this endpoint changes its row (_report_delivered's loop): its
-- last_success_at is refreshed at most once a second, and a circuit with failures counted is
-- cleared. An endpoint dropped meanwhile (NULL) has nothing to change.
CREATE OR REPLACE FUNCTION courier._delivery_changes_endpoint(e courier.endpoints) RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT e.id IS NOT NULL AND (e.last_success_at IS NULL OR e.last_success_at < now() - interval '1 second'
                                 OR e.circuit_state <> 'closed' OR e.circuit_failure_count <> 0)
$$;

-- Records what happened to each claimed message, in one call per batch. p_outcomes holds
-- 'success', 'retryable', 'permanent', 'disable' (ulak's [RETRYABLE], [PERMANENT] and
-- [DISABLE]) or 'snooze'; p_retry_after a server-requested delay in seconds (Retry-After),
-- capped at 24 h, or NULL; p_responses captured responses or NULL.
--   snooze     -> pending again after p_retry_after, no attempt counted, no error recorded,
--                 and neither a failure nor a success to the circuit breaker (issue 42)
--   success    -> the archive at once (one write per message, and the hot table holds only
--                 active messages)
--   retryable  -> pending again after the backoff delay, or the DLQ once out of retries
--   permanent  -> the DLQ at once
--   disable    -> the DLQ, and the endpoint is disabled if its config says auto_disable_on_gone
-- p_leases, parallel to p_ids, are the leases the claim returned: only a message still in
-- processing under that lease is touched. A report whose claim went stale and was recovered
-- (and perhaps claimed again by another worker) is a no-op for that message, counted in
-- `stale` and in metrics() and logged as report.stale_lease.
CREATE OR REPLACE FUNCTION courier.report_outcomes(p_ids bigint[], p_leases integer[], p_outcomes text[],
                                                      p_errors text[], p_retry_after integer[] DEFAULT NULL,
                                                      p_responses jsonb[] DEFAULT NULL)
RETURNS TABLE (delivered integer, retried integer, dead_lettered integer, stale integer)
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
SET jit = off
AS $$
DECLARE
    v_n integer := coalesce(cardinality(p_ids), 0);
BEGIN
    IF courier._only_successes(p_ids, p_leases, p_outcomes, p_errors, p_retry_after, p_responses) THEN
        -- Every outcome a success: the lean path (stale reports counted there).
        delivered := (courier._report_delivered(p_ids, p_leases, p_responses, true)).delivered;
        retried := 0;
        dead_lettered := 0;
        stale := v_n - delivered;
        RETURN NEXT;
        RETURN;
    END IF;
    IF v_n IS DISTINCT FROM coalesce(cardinality(p_outcomes), 0) OR v_n IS DISTINCT FROM coalesce(cardinality(p_errors), 0)
       OR v_n IS DISTINCT FROM coalesce(cardinality(p_retry_after), v_n)
       OR v_n IS DISTINCT FROM coalesce(cardinality(p_responses), v_n) THEN
        RAISE EXCEPTION '[courier] report_outcomes needs one outcome, error, retry-after and response per id'
            USING ERRCODE = '22023';
    END IF;
    PERFORM courier._require_leases(p_ids, p_leases);
    RETURN QUERY SELECT * FROM courier._report_mixed(p_ids, p_leases, p_outcomes, p_errors, p_retry_after, p_responses);
END
$$;

-- report_outcomes's general path: any outcome other than a success, validated here. Its successes
-- are archived as an all-success report's are (_report_delivered, from the stage or the queue,
-- in plans made once), and only its failures are moved from the stage into the queue, where
-- their retries and history are kept: moving the whole report there first, and archiving its
-- successes from there, cost a report of 100 with one failure five times an all-success one
-- (BENCHMARKS.md, "A worker's cycle in fewer statements").
CREATE OR REPLACE FUNCTION courier._report_mixed(p_ids bigint[], p_leases integer[], p_outcomes text[],
                                                 p_errors text[], p_retry_after integer[], p_responses jsonb[])
RETURNS TABLE (delivered integer, retried integer, dead_lettered integer, stale integer)
LANGUAGE plpgsql
-- Plans made once, as _report_delivered's (see there): planned with each report's values, its
-- statements and those of the functions it calls cost a report of ten with one failure about
-- 6,600,000 instructions (BENCHMARKS.md, "A worker's cycle in fewer statements"). Its reads of
-- the failures find them by id (= ANY), and with nested loops off a join with the report's
-- arrays is hashed rather than read again for every row.
SET plan_cache_mode = force_generic_plan
SET enable_nestloop = off
SET enable_seqscan = off
SET jit = off  -- as its callers: it forces index scans (tests/test_claim_plans.py)
AS $$
DECLARE
    v_n integer := coalesce(cardinality(p_ids), 0);
    v_bad text;
    v_success_ids bigint[];
    v_success_leases integer[];
    v_success_responses jsonb[];
    v_other_ids bigint[];
    v_other_leases integer[];
    v_other_outcomes text[];
    v_other_errors text[];
    v_other_retry_after integer[];
    v_successes record;  -- _report_delivered's: delivered, endpoint_ids, counts
    v_success_endpoints integer[];  -- every endpoint delivered to, and how many
    v_success_counts integer[];
    v_failed_ids bigint[];
    v_failed_outcomes text[];
    v_failed_errors text[];
    v_failed_delays integer[];
    v_failed_retry_after integer[];
    v_failed_leases integer[];
    v_failed_dead boolean[];
    v_dead_ids bigint[];
    v_endpoints jsonb;
    v_endpoint jsonb;
    v_default_max_retries integer;
    v_failed_n integer := 0;
    v_processing CONSTANT text := 'processing';  -- a variable, for the generic plans: see _report_delivered
BEGIN
    SELECT string_agg(DISTINCT coalesce(o, 'NULL'), ', ') INTO v_bad FROM unnest(p_outcomes) AS o
    WHERE o IS NULL OR o NOT IN ('success', 'retryable', 'permanent', 'disable', 'snooze');
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION '[courier] unknown outcome(s): %', v_bad
            USING ERRCODE = '22023', HINT = 'Outcomes are success, retryable, permanent, disable and snooze';
    END IF;
    SELECT array_agg(u.id) FILTER (WHERE u.outcome = 'success'), array_agg(u.lease) FILTER (WHERE u.outcome = 'success'),
           array_agg(u.response) FILTER (WHERE u.outcome = 'success'),
           array_agg(u.id) FILTER (WHERE u.outcome <> 'success'), array_agg(u.lease) FILTER (WHERE u.outcome <> 'success'),
           array_agg(u.outcome) FILTER (WHERE u.outcome <> 'success'),
           array_agg(u.error) FILTER (WHERE u.outcome <> 'success'),
           array_agg(u.retry_after) FILTER (WHERE u.outcome <> 'success')
    INTO v_success_ids, v_success_leases, v_success_responses, v_other_ids, v_other_leases, v_other_outcomes,
         v_other_errors, v_other_retry_after
    FROM unnest(p_ids, p_leases, p_outcomes, p_errors,
                coalesce(p_retry_after, array_fill(NULL::integer, ARRAY[v_n])),
                coalesce(p_responses, array_fill(NULL::jsonb, ARRAY[v_n])))
         AS u(id, lease, outcome, error, retry_after, response);

    -- Delivered messages go straight to the archive with their captured responses; each
    -- endpoint is settled below, once for its successes and failures together.
    delivered := 0;
    IF v_success_ids IS NOT NULL THEN
        v_successes := courier._report_delivered(v_success_ids, v_success_leases, v_success_responses, false);
        delivered := v_successes.delivered;
        v_success_endpoints := v_successes.endpoint_ids;
        v_success_counts := v_successes.counts;
    END IF;

    IF v_other_ids IS NOT NULL THEN
        v_default_max_retries := courier._setting_int('default_max_retries');
        IF courier._any_stage_lease(v_other_leases) THEN  -- claimed where they were staged: into the queue, claim and all
            PERFORM courier._unstage_ids(v_other_ids);
        END IF;
    END IF;
    -- Decide everything up front from one read of the failures' rows (none when there are none:
    -- then only the successes' endpoints). The writes below repeat the lease check, so a claim
    -- recovered and handed on meanwhile is never touched.
    WITH reported AS (
        -- A broker client's error often quotes the URL it used: redacted before anything stores it.
        SELECT u.id, u.lease, u.outcome, courier._redact_text(u.error) AS error, q.endpoint_id,
               CASE WHEN u.retry_after IS NOT NULL THEN least(greatest(u.retry_after, 0), 86400) END AS retry_after,
               q.retry_count + 1 > coalesce(q.max_retries, (e.retry_policy ->> 'max_retries')::integer,
                                            v_default_max_retries) AS exhausted,
               CASE WHEN u.outcome = 'retryable' THEN
                   CASE WHEN u.retry_after IS NOT NULL THEN least(greatest(u.retry_after, 0), 86400)
                        ELSE courier.retry_delay(e.retry_policy, q.retry_count) END
                    WHEN u.outcome = 'snooze' THEN least(greatest(coalesce(u.retry_after, 0), 0), 86400)
               END AS delay
        FROM unnest(v_other_ids, v_other_leases, v_other_outcomes, v_other_errors, v_other_retry_after)
             AS u(id, lease, outcome, error, retry_after)
        JOIN courier.queue q ON q.id = u.id AND q.lease = u.lease AND q.status = v_processing
                            AND q.id = ANY (v_other_ids)
        JOIN courier.endpoints e ON e.id = q.endpoint_id
    ),
    failures AS (
        SELECT r.endpoint_id,
               count(*) FILTER (WHERE r.outcome = 'retryable') AS failures,
               count(*) FILTER (WHERE r.outcome <> 'snooze') AS all_failures,
               bool_or(r.outcome = 'disable') AS gone,
               (array_agg(r.error ORDER BY r.id DESC) FILTER (WHERE r.outcome <> 'snooze'))[1] AS last_error
        FROM reported r GROUP BY r.endpoint_id
    ),
    per_endpoint AS (
        SELECT e.id AS endpoint_id, e.name, e.config, e.last_success_at,
               coalesce(s.n, 0) AS successes, coalesce(f.failures, 0) AS failures,
               coalesce(f.all_failures, 0) AS all_failures, coalesce(f.gone, false) AS gone, f.last_error
        FROM failures f
        FULL JOIN unnest(v_success_endpoints, v_success_counts) AS s(endpoint_id, n)
             ON s.endpoint_id = f.endpoint_id
        JOIN courier.endpoints e ON e.id = coalesce(f.endpoint_id, s.endpoint_id)
    )
    SELECT array_agg(id ORDER BY id), array_agg(lease ORDER BY id), array_agg(outcome ORDER BY id),
           array_agg(error ORDER BY id), array_agg(delay ORDER BY id), array_agg(retry_after ORDER BY id),
           array_agg(outcome IN ('permanent', 'disable') OR (outcome = 'retryable' AND exhausted) ORDER BY id),
           (SELECT jsonb_agg(to_jsonb(p) ORDER BY p.endpoint_id) FROM per_endpoint p)
    INTO v_failed_ids, v_failed_leases, v_failed_outcomes, v_failed_errors, v_failed_delays, v_failed_retry_after,
         v_failed_dead, v_endpoints
    FROM reported;

    IF v_failed_ids IS NULL THEN
        retried := 0;
        dead_lettered := 0;
    ELSE
        -- Every failure lands in the message's history first, so a DLQ row carries it too.
        WITH failed AS (
        UPDATE courier.queue q
        SET retry_count = q.retry_count + CASE WHEN f.outcome = 'snooze' THEN 0 ELSE 1 END,
            last_error = CASE WHEN f.outcome = 'snooze' THEN q.last_error ELSE f.error END,
            error_history = CASE WHEN f.outcome = 'snooze' THEN q.error_history
                                 ELSE q.error_history || jsonb_strip_nulls(jsonb_build_object(
                'attempt', q.retry_count + 1, 'at', now(), 'outcome', f.outcome, 'error', f.error,
                'worker_id', q.worker_id, 'retry_after', f.retry_after)) END,
            status = 'pending', processing_started_at = NULL,
            next_retry_at = now() + make_interval(secs => coalesce(f.delay, 0)),
            updated_at = now()
        FROM unnest(v_failed_ids, v_failed_leases, v_failed_outcomes, v_failed_errors, v_failed_delays,
                    v_failed_retry_after, v_failed_dead)
             AS f(id, lease, outcome, error, delay, retry_after, dead)
        WHERE q.id = f.id AND q.id = ANY (v_failed_ids) AND q.lease = f.lease AND q.status = v_processing
        RETURNING q.id, f.dead
        )
        SELECT count(*), array_agg(id) FILTER (WHERE dead) INTO v_failed_n, v_dead_ids FROM failed;

        dead_lettered := CASE WHEN v_dead_ids IS NULL THEN 0 ELSE courier._dead_letter(v_dead_ids) END;
        retried := v_failed_n - dead_lettered;
    END IF;

    FOR v_endpoint IN SELECT value FROM jsonb_array_elements(coalesce(v_endpoints, '[]')) LOOP
        -- Successes alone refresh last_success_at at most once a second: the row lock of
        -- this UPDATE is held to commit, and taken on every report it queued each report of
        -- a busy endpoint behind the commit of the one before.
        IF (v_endpoint ->> 'all_failures')::integer > 0
           OR (v_endpoint ->> 'last_success_at') IS NULL
           OR (v_endpoint ->> 'last_success_at')::timestamptz < now() - interval '1 second' THEN
            UPDATE courier.endpoints
            SET last_success_at = CASE WHEN (v_endpoint ->> 'successes')::integer > 0 THEN now() ELSE last_success_at END,
                last_failure_at = CASE WHEN (v_endpoint ->> 'all_failures')::integer > 0 THEN now() ELSE last_failure_at END,
                last_error = coalesce(v_endpoint ->> 'last_error', last_error)
            WHERE id = (v_endpoint ->> 'endpoint_id')::integer;
        END IF;
        PERFORM courier._update_circuit_breaker((v_endpoint ->> 'endpoint_id')::integer,
                                                (v_endpoint ->> 'successes')::integer,
                                                (v_endpoint ->> 'failures')::integer);
        -- Its deliveries were counted where they were archived (_report_delivered).
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
    stale := v_n - delivered - coalesce(v_failed_n, 0);
    PERFORM courier._count_stale_reports('report', stale, p_ids);
    RETURN NEXT;
END
$$;

-- The worker's hot path in one round trip and one commit: report the outcomes a worker holds
-- (any endpoints', exactly as report_outcomes does, fenced by lease) and then claim the
-- next batch of p_endpoint_id (exactly as claim_batch does: circuit, rate limit, ordering
-- keys). The claim runs after the report in the same transaction, so the next message of an
-- ordering key that was just delivered can be claimed at once. Each row is one claimed
-- message with the report's counts; when nothing is claimed one row carries the counts and
-- NULL message columns. A report the database refuses fails the whole call: the worker
-- then reports through report_outcomes on its own, which isolates the bad outcome.
--
-- The claim first takes one of the endpoint's claim slots (see migration 0036_claim_slots),
-- held to commit, so that however many processes and hosts serve an endpoint at most
-- claim_slots of its claims scan its queue at once. With every slot taken it claims nothing
-- and says busy, counted in metrics() as claims_busy_total: the worker tries again shortly.
-- Slots spare work; fencing and SKIP LOCKED keep claims correct without them, so a claim made
-- without a slot (claim_batch) is as safe.
--
-- p_linger: the worker is lingering after a wake-up (sqlkit/linger.py), and asks in the same
-- round trip whether a producer of the endpoint is still committing (sends_committing), before
-- the claim looks. An empty claim that says no needs no look after it: every commit that was
-- under way when it asked is visible to the claim, which came later, and a producer that
-- commits after that sends a wake-up of its own (the top of sending.sql). Without it, the worker
-- asked in a round trip of its own after the empty claim, then claimed once more.
--
-- It commits without waiting for its WAL to reach disk (synchronous_commit off, for its own
-- transaction). A crash of the server can forget only the last moment of the worker's claims
-- and reports, a whole transaction at a time and in order: their messages go back to pending,
-- or stay leased until stale recovery, and are delivered again, which at-least-once delivery
-- allows and a crash of the worker does too. Leases are random (_next_lease), so a worker that
-- holds a forgotten claim is still fenced out. Each claim waited for the WAL flush, and did the
-- flush itself most of the time: on PostgreSQL 15 here an empty claim took 0.38 ms to return
-- instead of 0.20 (p90 0.86 ms instead of 0.21). ARCHITECTURE.md, "The worker's claims do not
-- wait for the disk", has the reasoning; BENCHMARKS.md, "A lone message's round trips", the CPU.
DROP FUNCTION IF EXISTS courier.report_and_claim(text, integer, integer, bigint[], integer[], text[], text[],
                                                 integer[], jsonb[]);
CREATE OR REPLACE FUNCTION courier.report_and_claim(
    p_worker_id text, p_batch_size integer, p_endpoint_id integer,
    p_ids bigint[], p_leases integer[], p_outcomes text[], p_errors text[],
    p_retry_after integer[] DEFAULT NULL, p_responses jsonb[] DEFAULT NULL, p_linger boolean DEFAULT false)
RETURNS TABLE (id bigint, endpoint_id integer, endpoint_name text, protocol text, payload jsonb, headers jsonb,
               metadata jsonb, priority smallint, retry_count integer, max_retries integer, correlation_id uuid,
               ordering_key text, idempotency_key text, scheduled_at timestamptz, expires_at timestamptz,
               created_at timestamptz, lease integer,
               delivered integer, retried integer, dead_lettered integer, stale integer, busy boolean,
               committing boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
SET jit = off
AS $$
DECLARE
    v_delivered integer := 0;
    v_retried integer := 0;
    v_dead_lettered integer := 0;
    v_stale integer := 0;
    v_busy boolean;
    -- Asked before anything else, so that every statement of the claim sees what it waited on.
    v_committing boolean := CASE WHEN p_linger THEN courier.sends_committing(p_endpoint_id) END;
    v_async text := set_config('synchronous_commit', 'off', true);
BEGIN
    -- All successes, report_outcomes's lean path, is taken here without calling it: its statement
    -- and call cost a worker's cycle of one about 3% more.
    IF courier._only_successes(p_ids, p_leases, p_outcomes, p_errors, p_retry_after, p_responses) THEN
        v_delivered := (courier._report_delivered(p_ids, p_leases, p_responses, true)).delivered;
        v_stale := cardinality(p_ids) - v_delivered;
    ELSIF coalesce(cardinality(p_ids), 0) > 0 THEN
        SELECT r.delivered, r.retried, r.dead_lettered, r.stale INTO v_delivered, v_retried, v_dead_lettered, v_stale
        FROM courier.report_outcomes(p_ids, p_leases, p_outcomes, p_errors, p_retry_after, p_responses) r;
    END IF;
    -- claim_slots as courier.consume_limits holds it (migration 0049) and a free slot, in one
    -- statement; 0 slots: no limit, and no slot is taken.
    SELECT l.claim_slots > 0 AND s.slot IS NULL INTO v_busy
    FROM courier.consume_limits l
    LEFT JOIN LATERAL (SELECT s.slot FROM courier.claim_slots s
                       WHERE s.endpoint_id = p_endpoint_id AND s.slot < l.claim_slots
                       LIMIT 1 FOR UPDATE SKIP LOCKED) s ON true;
    v_busy := coalesce(v_busy, false);  -- no row in courier.consume_limits: dequeue says so; claims go on
    IF v_busy THEN  -- for claims_busy_total: an endpoint often busy may want more slots
        PERFORM courier._add_delivery_totals(p_endpoint_id, 'claim_busy', 1);
    END IF;
    IF NOT v_busy THEN
        RETURN QUERY
            SELECT c.*, v_delivered, v_retried, v_dead_lettered, v_stale, false, v_committing
            FROM courier.claim_batch(p_worker_id, p_batch_size, p_endpoint_id) c;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    RETURN QUERY SELECT (NULL::courier.claimed_message).*, v_delivered, v_retried, v_dead_lettered, v_stale,
                        v_busy, v_committing;
END
$$;

-- Counts come from the maintained dlq_depth counters and the oldest and newest failure from
-- two index probes per endpoint, instead of an aggregate over every DLQ row (162 ms at 1M
-- entries). Entries keep the name their
-- endpoint had when they failed, so dropped endpoints are still summarised by name.
CREATE OR REPLACE FUNCTION courier.dlq_summary()
RETURNS TABLE (endpoint_name text, failed_count bigint, redriven_count bigint,
               oldest_failure timestamptz, newest_failure timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
    WITH depth AS (
        SELECT d.endpoint_id,
               coalesce(sum(d.messages) FILTER (WHERE d.status = 'failed'), 0)::bigint AS failed,
               coalesce(sum(d.messages) FILTER (WHERE d.status = 'redriven'), 0)::bigint AS redriven
        FROM courier.dlq_depth d
        GROUP BY d.endpoint_id
        HAVING sum(d.messages) <> 0
    )
    SELECT oldest.endpoint_name, sum(depth.failed)::bigint, sum(depth.redriven)::bigint,
           min(oldest.failed_at), max(newest.failed_at)
    FROM depth
    CROSS JOIN LATERAL (
        SELECT x.endpoint_name, x.failed_at FROM courier.dlq x
        WHERE x.endpoint_id = depth.endpoint_id ORDER BY x.failed_at LIMIT 1
    ) oldest
    CROSS JOIN LATERAL (
        SELECT x.failed_at FROM courier.dlq x
        WHERE x.endpoint_id = depth.endpoint_id ORDER BY x.failed_at DESC LIMIT 1
    ) newest
    GROUP BY oldest.endpoint_name
    ORDER BY oldest.endpoint_name
$$;
