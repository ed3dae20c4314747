-- Observability: metrics() in ulak's shape and get_endpoint_health(). Every depth comes from
-- the maintained counters and every age from an index probe, so both stay cheap at any size.

-- created_at of the oldest pending message of one endpoint: one index probe per priority
-- level on queue_claim_idx instead of a scan.
CREATE FUNCTION courier._oldest_pending_at(p_endpoint_id integer) RETURNS timestamptz
LANGUAGE sql STABLE
SET search_path = pg_catalog, courier, pg_temp
AS $$
    SELECT q.created_at
    FROM generate_series(0, 10) AS p(priority)
    CROSS JOIN LATERAL (
        SELECT id, created_at FROM courier.queue
        WHERE endpoint_id = p_endpoint_id AND status = 'pending' AND priority = p.priority
        ORDER BY priority DESC, id LIMIT 1
    ) q
    ORDER BY q.id LIMIT 1
$$;

CREATE FUNCTION courier._depth_by_endpoint()
RETURNS TABLE (endpoint_id integer, status text, messages bigint)
LANGUAGE sql STABLE
SET search_path = pg_catalog, courier, pg_temp
AS $$
    SELECT endpoint_id, status, sum(messages)::bigint
    FROM courier.queue_depth GROUP BY endpoint_id, status
$$;

CREATE FUNCTION courier.get_endpoint_health(p_endpoint_name text DEFAULT NULL)
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
                     WHERE d.endpoint_id = e.id AND d.status = 'pending'), 0)::bigint,
           courier._oldest_pending_at(e.id)
    FROM courier.endpoints e
    WHERE p_endpoint_name IS NULL OR e.name = p_endpoint_name
    ORDER BY e.name
$$;

CREATE FUNCTION courier.metrics()
RETURNS TABLE (metric_name text, metric_value double precision, labels jsonb, metric_type text)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
    WITH depth AS (SELECT * FROM courier._depth_by_endpoint()),
    statuses AS (SELECT unnest(ARRAY['pending', 'processing', 'completed', 'failed', 'expired']) AS status)
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
                       ('failed_attempt', 'delivery_failures_total')) AS o(outcome, metric)
    LEFT JOIN courier.delivery_totals t ON t.endpoint_id = e.id AND t.outcome = o.outcome
    GROUP BY e.name, o.metric
$$;
