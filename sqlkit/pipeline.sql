-- Named queries of the data pipeline (console/pipeline) and the Analytics pane. Blocks whose
-- text holds {relation} take a table name composed with psycopg.sql.Identifier.

-- name: table_columns
SELECT a.attname AS name, format_type(a.atttypid, a.atttypmod) AS type
FROM pg_attribute a
WHERE a.attrelid = to_regclass(%(relation)s) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum;

-- name: id_bounds
SELECT min(id) AS low, max(id) AS high FROM {relation};

-- name: relation_rows
SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%(relation)s);

-- Before Spark starts (console/pipeline/plan.py): the archived rows a job will read, counted
-- exactly with the conditions the data source reads them with ({where}). A range of
-- created_at prunes the monthly partitions and uses the BRIN index.
-- name: count_archive
SELECT count(*) FROM courier.archive WHERE {where};

-- The same for a replay, per endpoint name (NULL: an endpoint dropped since), with how many
-- of them were replayed before: a dry run's whole answer.
-- name: count_replay
SELECT e.name AS endpoint, count(*) AS matched, count(r.archive_id) AS replayed
FROM (SELECT id, endpoint_id FROM courier.archive WHERE {where}) a
LEFT JOIN courier.endpoints e ON e.id = a.endpoint_id
LEFT JOIN courier.replayed_messages r ON r.archive_id = a.id
GROUP BY e.name;

-- name: endpoint_names
SELECT id, name, enabled FROM courier.endpoints ORDER BY id;

-- name: ledger_claim
INSERT INTO courier.pipeline_ledger (scope, source_key)
SELECT %(scope)s, k FROM unnest(%(keys)s::text[]) AS k
ON CONFLICT DO NOTHING
RETURNING source_key;

-- name: ledger_count
SELECT count(*) FROM courier.pipeline_ledger WHERE scope = %(scope)s;

-- Replays share one rule with `courier archive replay` (courier.claim_replays): the archived
-- ids of this chunk to enqueue now.
-- name: claim_replays
SELECT unnest(courier.claim_replays(%(archive_ids)s::bigint[], %(again)s)) AS archive_id;

-- name: record_replay_copies
UPDATE courier.replayed_messages r SET message_id = c.message_id
FROM unnest(%(archive_ids)s::bigint[], %(message_ids)s::bigint[]) AS c(archive_id, message_id)
WHERE r.archive_id = c.archive_id;

-- name: count_replayed
SELECT count(*) FROM courier.replayed_messages WHERE archive_id = ANY (%(archive_ids)s::bigint[]);

-- name: send_batch_with_options
SELECT courier.send_batch_with_options(%(endpoint)s, %(payloads)s::text[]::jsonb[], %(priority)s::integer[],
    %(scheduled_at)s::timestamptz[], %(idempotency_key)s::text[], %(correlation_id)s::text[]::uuid[],
    %(expires_at)s::timestamptz[], %(ordering_key)s::text[], %(headers)s::text[]::jsonb[],
    %(metadata)s::text[]::jsonb[]);

-- name: clear_analytics_hourly
DELETE FROM courier.analytics_hourly WHERE hour >= coalesce(%(from)s::timestamptz, '-infinity') AND hour < %(to)s;

-- name: clear_analytics_attempts
DELETE FROM courier.analytics_attempts WHERE hour >= coalesce(%(from)s::timestamptz, '-infinity') AND hour < %(to)s;

-- name: clear_analytics_errors
DELETE FROM courier.analytics_errors WHERE hour >= coalesce(%(from)s::timestamptz, '-infinity') AND hour < %(to)s;

-- name: insert_analytics_run
INSERT INTO courier.analytics_runs (range_from, range_to, master, rows_read, endpoints, started_at)
VALUES (%(from)s, %(to)s, %(master)s, %(rows_read)s, %(endpoints)s, %(started_at)s)
RETURNING id;

-- name: analytics_hourly
SELECT h.endpoint_id, coalesce(e.name, '#' || h.endpoint_id) AS endpoint, h.hour, h.delivered, h.failed,
       h.expired, h.dead_lettered, h.p50_ms, h.p95_ms, h.p99_ms
FROM courier.analytics_hourly h
LEFT JOIN courier.endpoints e ON e.id = h.endpoint_id
WHERE h.hour >= %(since)s
ORDER BY h.hour, endpoint;

-- name: analytics_attempts
SELECT endpoint_id, hour, attempts, messages FROM courier.analytics_attempts
WHERE hour >= coalesce(%(from)s::timestamptz, '-infinity') AND hour < %(to)s ORDER BY endpoint_id, hour, attempts;

-- name: analytics_errors
SELECT endpoint_id, hour, error_class, occurrences FROM courier.analytics_errors
WHERE hour >= coalesce(%(from)s::timestamptz, '-infinity') AND hour < %(to)s ORDER BY endpoint_id, hour, error_class;

-- name: latest_analytics_run
SELECT id, range_from, range_to, master, rows_read, endpoints, started_at, finished_at
FROM courier.analytics_runs ORDER BY id DESC LIMIT 1;

-- The analytics job's aggregation as one SQL query, for tests and `courier bench spark`.
-- Latency is whole microseconds from enqueue to delivery; percentiles are discrete.
-- name: sql_analytics_hourly
SELECT endpoint_id, date_trunc('hour', completed_at) AS hour,
       count(*) FILTER (WHERE status = 'completed') AS delivered,
       coalesce(sum(jsonb_array_length(error_history)), 0) AS failed,
       count(*) FILTER (WHERE status = 'expired') AS expired,
       count(*) FILTER (WHERE status = 'failed') AS dead_lettered,
       percentile_disc(0.5) WITHIN GROUP (ORDER BY latency_us) / 1000.0 AS p50_ms,
       percentile_disc(0.95) WITHIN GROUP (ORDER BY latency_us) / 1000.0 AS p95_ms,
       percentile_disc(0.99) WITHIN GROUP (ORDER BY latency_us) / 1000.0 AS p99_ms
FROM (SELECT endpoint_id, status, error_history, completed_at,
             CASE WHEN status = 'completed'
                  THEN ((extract(epoch FROM completed_at) - extract(epoch FROM created_at)) * 1000000)::bigint
             END AS latency_us
      FROM courier.archive
      WHERE completed_at >= coalesce(%(from)s::timestamptz, '-infinity') AND completed_at < %(to)s) a
GROUP BY 1, 2
ORDER BY 1, 2;

-- name: sql_analytics_summary
SELECT endpoint_id,
       count(*) FILTER (WHERE status = 'completed') AS delivered,
       coalesce(sum(jsonb_array_length(error_history)), 0) AS failed,
       count(*) FILTER (WHERE status = 'expired') AS expired,
       count(*) FILTER (WHERE status = 'failed') AS dead_lettered,
       percentile_disc(0.5) WITHIN GROUP (ORDER BY latency_us) / 1000.0 AS p50_ms,
       percentile_disc(0.95) WITHIN GROUP (ORDER BY latency_us) / 1000.0 AS p95_ms,
       percentile_disc(0.99) WITHIN GROUP (ORDER BY latency_us) / 1000.0 AS p99_ms,
       count(*) AS rows
FROM (SELECT endpoint_id, status, error_history,
             CASE WHEN status = 'completed'
                  THEN ((extract(epoch FROM completed_at) - extract(epoch FROM created_at)) * 1000000)::bigint
             END AS latency_us
      FROM courier.archive
      WHERE completed_at >= coalesce(%(from)s::timestamptz, '-infinity') AND completed_at < %(to)s) a
GROUP BY 1
ORDER BY 1;

-- name: sql_analytics_attempts
SELECT endpoint_id, date_trunc('hour', completed_at) AS hour, retry_count + 1 AS attempts, count(*) AS messages
FROM courier.archive
-- Attempts a message took to end: not one that expired, nor one cancelled or purged (issue 42).
WHERE status NOT IN ('expired', 'cancelled', 'purged')
  AND completed_at >= coalesce(%(from)s::timestamptz, '-infinity') AND completed_at < %(to)s
GROUP BY 1, 2, 3
ORDER BY 1, 2, 3;

-- name: sql_analytics_errors
SELECT endpoint_id, hour, error_class, occurrences FROM (
    SELECT endpoint_id, hour, error_class, count(*) AS occurrences,
           row_number() OVER (PARTITION BY endpoint_id, hour ORDER BY count(*) DESC, error_class) AS rank
    FROM (SELECT a.endpoint_id, date_trunc('hour', a.completed_at) AS hour,
                 courier.error_class(e ->> 'outcome', e ->> 'error') AS error_class
          FROM courier.archive a, jsonb_array_elements(a.error_history) e
          WHERE a.completed_at >= coalesce(%(from)s::timestamptz, '-infinity') AND a.completed_at < %(to)s) x
    GROUP BY 1, 2, 3
) ranked
WHERE rank <= %(top)s
ORDER BY 1, 2, 3;

-- Export verification: row count and an order-free checksum of one month of the archive,
-- computed the same way over the Parquet files.
-- name: archive_month_checksum
SELECT count(*) AS rows,
       coalesce(sum(('x' || left(md5(concat_ws('|', id, endpoint_id, status,
                     ((extract(epoch FROM created_at)) * 1000000)::bigint, payload::text, headers::text,
                     metadata::text)), 15))::bit(60)::bigint::numeric), 0)::text AS checksum
FROM courier.archive
WHERE created_at >= %(from)s AND created_at < %(to)s;

-- name: archive_default_months
SELECT DISTINCT courier._month_start(created_at) AS month FROM courier.archive_default
WHERE created_at < %(before)s ORDER BY 1;

-- name: archive_export
SELECT month, location, rows, checksum, exported_at, dropped_at FROM courier.archive_exports WHERE month = %(month)s;

-- name: record_archive_export
INSERT INTO courier.archive_exports (month, location, rows, checksum)
VALUES (%(month)s, %(location)s, %(rows)s, %(checksum)s)
ON CONFLICT (month) DO UPDATE
SET location = excluded.location, rows = excluded.rows, checksum = excluded.checksum,
    exported_at = now(), dropped_at = NULL;

-- name: record_archive_drop
UPDATE courier.archive_exports SET dropped_at = now() WHERE month = %(month)s;

-- name: lock_archive_partition
LOCK TABLE {relation} IN SHARE MODE;

-- name: drop_archive_partition
DROP TABLE {relation};

-- name: delete_archive_default_month
DELETE FROM courier.archive_default WHERE created_at >= %(from)s AND created_at < %(to)s;
