-- The console's DLQ pane, kept cheap however large the dead-letter queue grows: an endpoint
-- that stays down for a weekend leaves millions of entries, kept for dlq_retention_days.
-- No index is added to courier.queue: every filter of the Messages pane is served by the
-- queue's existing indexes (see search_messages* in sqlkit/queries.sql).
--
-- Both indexes are on the DLQ, written only when a message dead-letters or is redriven,
-- never on the send/claim/complete path.
--
-- Listing one endpoint's entries newest first: without this index that was a sequential
-- scan of the whole DLQ (68 ms at 1M entries, for an endpoint with 20 of them).
CREATE INDEX dlq_endpoint_idx ON courier.dlq (endpoint_name, id);
-- dlq_summary(): each endpoint's oldest and newest failure as two probes.
CREATE INDEX dlq_endpoint_failed_at_idx ON courier.dlq (endpoint_id, failed_at);

-- The same result as before (see 0008), but the counts come from the maintained dlq_depth
-- counters and the oldest and newest failure from two index probes per endpoint, instead of
-- an aggregate over every DLQ row (162 ms at 1M entries). Entries keep the name their
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
