-- A fixed, deterministic queue for the console's screenshots and snapshot tests: every
-- timestamp is absolute (around 2026-11-02 12:00 UTC, the showcase clock), every id
-- restarts at 1. Applied to a scratch database only: it truncates Courier's tables.

TRUNCATE courier.queue, courier.dlq, courier.event_log, courier.workers, courier.delivery_totals,
         courier.endpoints, courier.claim_slots, courier.replays, courier.subscriptions, courier.event_types,
         courier.api_tokens, courier.schedules
         RESTART IDENTITY;

SELECT courier.create_endpoint('billing', 'http', '{"url": "https://billing.example.com/hooks/courier",
    "headers": {"Authorization": "Bearer sk_live_123"}}', '{"max_retries": 5, "backoff": "exponential"}',
    'invoices and payments');
SELECT courier.create_endpoint('inventory', 'http', '{"url": "https://inventory.example.com/events"}');
SELECT courier.create_endpoint('search-index', 'http', '{"url": "https://search.example.com/ingest"}');
SELECT courier.create_endpoint('crm-legacy', 'http', '{"url": "https://crm.example.com/webhook"}');
SELECT courier.create_endpoint('audit-noop', 'noop', '{}');
SELECT courier.create_endpoint('warehouse', 'pull', '{"max_depth": 10000, "visibility_timeout": 60}');

UPDATE courier.endpoints SET created_at = '2026-10-01 09:00+00', updated_at = '2026-11-02 11:40+00';
UPDATE courier.endpoints SET circuit_state = 'open', circuit_failure_count = 7,
       circuit_opened_at = '2026-11-02 11:58:30+00', last_failure_at = '2026-11-02 11:59:41+00',
       last_success_at = '2026-11-02 10:12:05+00',
       last_error = '[RETRYABLE] connection refused: inventory.example.com:443'
WHERE name = 'inventory';
UPDATE courier.endpoints SET circuit_state = 'half_open', circuit_failure_count = 3,
       last_failure_at = '2026-11-02 11:57:02+00', last_success_at = '2026-11-02 11:50:00+00',
       last_error = '[RETRYABLE] HTTP 503 Service Unavailable'
WHERE name = 'search-index';
UPDATE courier.endpoints SET enabled = false WHERE name = 'crm-legacy';
UPDATE courier.endpoints SET last_success_at = '2026-11-02 11:59:58+00' WHERE name IN ('billing', 'audit-noop');

-- Bearer tokens of the HTTP API. Their secrets were never known: each hash is of a fixed phrase.
INSERT INTO courier.api_tokens (name, secret_hash, topics, endpoints, actions, created_at, last_used_at, revoked_at)
VALUES ('ci-deploy', sha256('showcase ci-deploy'), '{}', '{billing,inventory}', '{enqueue,publish}',
        '2026-10-01 09:05+00', '2026-11-02 11:58:12+00', NULL),
       ('ops-admin', sha256('showcase ops-admin'), '{}', '{}', '{admin}',
        '2026-09-15 08:00+00', '2026-11-01 17:20:00+00', NULL),
       ('pickers', sha256('showcase pickers'), '{warehouse}', '{}', '{consume}',
        '2026-10-12 14:30+00', '2026-11-02 11:59:55+00', NULL),
       ('scanner-2025', sha256('showcase scanner-2025'), '{warehouse}', '{}', '{consume,enqueue}',
        '2025-12-01 10:00+00', '2026-10-20 16:45:00+00', '2026-10-21 09:00+00');

-- Periodic schedules: one sent its 03:00 tick in Berlin and waits for tomorrow's, one ticks every
-- quarter hour, one is paused, and one fails: its endpoint was disabled, so its ticks since 11:00
-- (New York's 06:00) are late, and its last error says why.
INSERT INTO courier.schedules (name, cron, time_zone, endpoint_id, payload, catch_up, catch_up_limit, grace_seconds,
                               description, paused_at, next_run_at, last_tick_at, last_sent_at, last_message_id,
                               sent_ticks, skipped_ticks, last_error, last_error_at, created_at, updated_at)
SELECT t.name, t.cron, t.time_zone, e.id, t.payload::jsonb, t.catch_up, 100, 600, t.description,
       t.paused_at::timestamptz, t.next_run_at::timestamptz, t.last_tick_at::timestamptz,
       t.last_tick_at::timestamptz + interval '1 second', t.last_message_id, t.sent, t.skipped, t.last_error,
       t.last_error_at::timestamptz, '2026-10-01 09:10+00', '2026-11-02 09:12+00'
FROM (VALUES
    ('invoice-run', '0 3 * * *', 'Europe/Berlin', 'billing', '{"job": "invoices"}', 'all', 'nightly invoices',
     NULL, '2026-11-03 02:00+00', '2026-11-02 02:00+00', 812, 32, 0, NULL, NULL),
    ('stock-sync', '*/15 * * * *', 'UTC', 'inventory', '{"job": "stock"}', 'skip', NULL,
     NULL, '2026-11-02 12:15+00', '2026-11-02 12:00+00', 960, 2974, 2, NULL, NULL),
    ('reindex', '30 * * * *', 'UTC', 'search-index', '{"full": false}', 'skip', 'paused while the index moves',
     '2026-11-02 09:12+00', '2026-11-02 09:30+00', '2026-11-02 08:30+00', 402, 410, 0, NULL, NULL),
    ('crm-export', '0 6 * * 1-5', 'America/New_York', 'crm-legacy', '{"export": "contacts"}', 'skip', NULL,
     NULL, '2026-11-02 11:00+00', '2026-10-30 10:00+00', 17, 22, 0, '[courier] endpoint "crm-legacy" is disabled',
     '2026-11-02 11:59:52+00'),
    ('restock-report', '0 7 * * 1-5', 'America/New_York', 'warehouse', '{"report": "restock"}', 'skip', NULL,
     NULL, '2026-11-03 12:00+00', '2026-11-02 12:00+00', 977, 23, 0, NULL, NULL)
) AS t(name, cron, time_zone, endpoint, payload, catch_up, description, paused_at, next_run_at, last_tick_at,
       last_message_id, sent, skipped, last_error, last_error_at)
JOIN courier.endpoints e ON e.name = t.endpoint;

-- Forget what creating the endpoints logged (today's date): the log gets fixed events below.
TRUNCATE courier.event_log RESTART IDENTITY;

-- Active messages: pending in priority order, some retried, some in flight.
INSERT INTO courier.queue (endpoint_id, payload, headers, priority, ordering_key, correlation_id, created_at,
                           updated_at, retry_count, last_error, error_history, next_retry_at)
SELECT e.id,
       jsonb_build_object('order_id', 1000 + g, 'customer', 'c-' || (g % 7), 'total', (g * 37 % 500) + 0.99),
       CASE WHEN g % 5 = 0 THEN '{"X-Tenant": "acme", "Authorization": "Bearer secret-token"}'::jsonb
            ELSE '{"X-Tenant": "acme"}'::jsonb END,
       (g % 3) * 4,
       'customer-' || (g % 7),
       ('00000000-0000-4000-8000-' || lpad(g::text, 12, '0'))::uuid,
       '2026-11-02 11:30:00+00'::timestamptz + g * interval '17 seconds',
       '2026-11-02 11:59:00+00',
       CASE WHEN e.name = 'inventory' THEN 1 + g % 3 ELSE 0 END,
       CASE WHEN e.name = 'inventory' THEN '[RETRYABLE] connection refused: inventory.example.com:443' END,
       CASE WHEN e.name = 'inventory' THEN jsonb_build_array(jsonb_build_object(
            'attempt', 1, 'at', '2026-11-02T11:58:30+00:00', 'outcome', 'retryable',
            'error', '[RETRYABLE] connection refused: inventory.example.com:443')) ELSE '[]'::jsonb END,
       CASE WHEN e.name = 'inventory' THEN '2026-11-02 12:02:00+00'::timestamptz END
FROM generate_series(1, 60) g
JOIN courier.endpoints e ON e.name = (ARRAY['billing', 'inventory', 'search-index', 'billing', 'crm-legacy'])[1 + g % 5]
ORDER BY g;

UPDATE courier.queue SET status = 'processing', worker_id = 'api-1:4242:7f3a2c',
       processing_started_at = '2026-11-02 11:59:57+00'
WHERE id IN (1, 4, 9);

-- A pull topic: consumers take its messages; two are leased until their visibility deadline.
INSERT INTO courier.queue (endpoint_id, payload, key, created_at, updated_at, visible_at)
SELECT e.id, jsonb_build_object('pick_list', 500 + g, 'bin', 'A-' || g), 'pick-' || (500 + g),
       '2026-11-02 11:58:00+00'::timestamptz + g * interval '5 seconds', '2026-11-02 11:59:00+00',
       '2026-11-02 11:58:00+00'::timestamptz + g * interval '5 seconds'
FROM generate_series(1, 8) g JOIN courier.endpoints e ON e.name = 'warehouse'
ORDER BY g;
UPDATE courier.queue SET status = 'processing', lease = 1,
       visible_at = '2026-11-02 12:00:40+00'::timestamptz + (id - 61) * interval '5 seconds'
WHERE id IN (61, 62);

-- Dead letters.
INSERT INTO courier.dlq (original_message_id, endpoint_id, endpoint_name, payload, headers, priority, ordering_key,
                         correlation_id, retry_count, last_error, error_history, status, original_created_at,
                         failed_at, redriven_at, redriven_message_id)
SELECT 5000 + g, e.id, e.name,
       jsonb_build_object('order_id', 5000 + g, 'reason', 'showcase'),
       '{"X-Tenant": "acme", "X-Api-Key": "hunter2"}'::jsonb,
       0, 'customer-' || (g % 4),
       ('00000000-0000-4000-9000-' || lpad(g::text, 12, '0'))::uuid,
       CASE WHEN g % 3 = 0 THEN 0 ELSE 5 END,
       CASE WHEN g % 3 = 0 THEN '[PERMANENT] HTTP 422 Unprocessable Entity: missing field "sku"'
            ELSE '[RETRYABLE] HTTP 503 Service Unavailable (max retries exceeded)' END,
       jsonb_build_array(
           jsonb_build_object('attempt', 1, 'at', '2026-11-02T10:00:00+00:00', 'outcome', 'retryable',
                              'error', '[RETRYABLE] HTTP 503 Service Unavailable'),
           jsonb_build_object('attempt', 2, 'at', '2026-11-02T10:00:20+00:00', 'outcome', 'retryable',
                              'error', '[RETRYABLE] HTTP 503 Service Unavailable')),
       CASE WHEN g > 10 THEN 'redriven' ELSE 'failed' END,
       '2026-11-02 09:55:00+00'::timestamptz + g * interval '1 minute',
       '2026-11-02 11:00:00+00'::timestamptz + g * interval '2 minutes',
       CASE WHEN g > 10 THEN '2026-11-02 11:45:00+00'::timestamptz END,
       CASE WHEN g > 10 THEN 9000 + g END
FROM generate_series(1, 12) g
JOIN courier.endpoints e ON e.name = (ARRAY['inventory', 'search-index', 'billing'])[1 + g % 3]
ORDER BY g;

-- Cumulative delivery outcomes.
INSERT INTO courier.delivery_totals (endpoint_id, outcome, backend_pid, total)
SELECT e.id, o.outcome, 0, o.total * e.id
FROM courier.endpoints e
CROSS JOIN (VALUES ('delivered', 12840), ('failed_attempt', 210), ('dead_lettered', 4)) AS o(outcome, total);

-- Heartbeats of two remote workers.
INSERT INTO courier.workers (worker_id, hostname, pid, concurrency, in_flight, delivered, failed, state,
                             started_at, last_heartbeat)
VALUES ('api-1:4242:7f3a2c', 'api-1', 4242, 32, 3, 51234, 118, 'running',
        '2026-11-02 08:00:00+00', '2026-11-02 11:59:58+00'),
       ('api-2:977:c01d2e', 'api-2', 977, 16, 0, 20110, 40, 'stopped',
        '2026-11-01 08:00:00+00', '2026-11-02 09:12:44+00');

-- The event log.
INSERT INTO courier.event_log (event_type, endpoint_id, actor, details, created_at)
SELECT t.event_type, e.id, t.actor, t.details::jsonb, t.at::timestamptz
FROM (VALUES
    ('endpoint.created', 'billing', 'ops', '{"protocol": "http"}', '2026-11-02 09:00:00+00'),
    ('config.changed', NULL, 'ops', '{"name": "max_queue_size", "old": "1000000", "new": "500000"}',
     '2026-11-02 09:30:00+00'),
    ('maintenance.leader_elected', NULL, 'courier', '{"worker_id": "api-1:4242:7f3a2c"}', '2026-11-02 10:00:00+00'),
    ('circuit.opened', 'search-index', 'courier', '{"failures": 5}', '2026-11-02 11:50:10+00'),
    ('dlq.redriven', 'billing', 'ops', '{"count": 2}', '2026-11-02 11:45:00+00'),
    ('circuit.half_open', 'search-index', 'courier', '{"probe": true}', '2026-11-02 11:57:00+00'),
    ('circuit.opened', 'inventory', 'courier', '{"failures": 7}', '2026-11-02 11:58:30+00'),
    ('endpoint.disabled', 'crm-legacy', 'ops', '{"reason": "vendor migration"}', '2026-11-02 11:59:00+00')
) AS t(event_type, endpoint, actor, details, at)
LEFT JOIN courier.endpoints e ON e.name = t.endpoint
ORDER BY t.at;

-- What `courier pipeline analytics` would have stored: two days of hourly outcomes.
TRUNCATE courier.analytics_hourly, courier.analytics_runs RESTART IDENTITY;
INSERT INTO courier.analytics_hourly (endpoint_id, hour, delivered, failed, expired, dead_lettered,
                                      p50_ms, p95_ms, p99_ms, run_id)
SELECT e.id, '2026-10-31 12:00+00'::timestamptz + h * interval '1 hour',
       (200 + 150 * sin(h / 4.0) + 40 * e.id)::bigint + 300, (h * e.id) % 9, (h + e.id) % 3 / 2, (h * 7 + e.id) % 4 / 3,
       40 + 10 * e.id + h % 5, 180 + 20 * e.id + h % 13, 400 + 50 * e.id + h % 17, 1
FROM generate_series(0, 47) h
JOIN courier.endpoints e ON e.name IN ('billing', 'inventory', 'search-index');
INSERT INTO courier.analytics_runs (range_from, range_to, master, rows_read, endpoints, started_at, finished_at)
SELECT '2026-10-31 12:00+00', '2026-11-02 12:00+00', 'local[*]', sum(delivered + expired + dead_lettered),
       jsonb_agg(jsonb_build_object('endpoint', name, 'endpoint_id', endpoint_id, 'delivered', delivered,
                                    'failed', failed, 'expired', expired, 'dead_lettered', dead_lettered,
                                    'p50_ms', p50, 'p95_ms', p95, 'p99_ms', p99) ORDER BY name),
       '2026-11-02 12:00:05+00', '2026-11-02 12:00:41+00'
FROM (SELECT e.name, h.endpoint_id, sum(delivered) AS delivered, sum(failed) AS failed, sum(expired) AS expired,
             sum(dead_lettered) AS dead_lettered, avg(p50_ms)::int AS p50, avg(p95_ms)::int AS p95,
             max(p99_ms)::int AS p99
      FROM courier.analytics_hourly h JOIN courier.endpoints e ON e.id = h.endpoint_id
      GROUP BY e.name, h.endpoint_id) per_endpoint;
