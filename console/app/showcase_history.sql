-- The showcase's recent past: the queue as it stood %(n)s ten-second steps before the showcase
-- clock (%(now)s), for the console to poll step by step (showcase.play_history) so its charts
-- and rates are drawn from what it read, as they are in use. Step 0 is showcase.sql's state.
--
-- What happened in those five minutes: a burst of orders for billing rose and drained away,
-- about a hundred messages a second were delivered, inventory stopped at 11:58:30 when its
-- circuit opened, and crm-legacy at 11:59:00 when it was disabled.

-- The burst: extra billing messages, pending and in flight, marked so each step replaces them.
DELETE FROM courier.queue q USING courier.endpoints e
WHERE e.name = 'billing' AND q.endpoint_id = e.id AND q.payload ? 'showcase_burst';

INSERT INTO courier.queue (endpoint_id, payload, status, worker_id, processing_started_at, created_at, updated_at)
SELECT e.id, jsonb_build_object('showcase_burst', g),
       CASE WHEN g <= b.processing THEN 'processing' ELSE 'pending' END,
       CASE WHEN g <= b.processing THEN 'api-1:4242:7f3a2c' END,
       CASE WHEN g <= b.processing THEN b.at END,
       b.at - interval '20 seconds', b.at
FROM courier.endpoints e
CROSS JOIN LATERAL (
    SELECT %(now)s::timestamptz - %(n)s * interval '10 seconds' AS at,
           CASE WHEN %(n)s = 0 THEN 0 ELSE round(6 + 5 * sin(%(n)s / 2.5))::int END AS processing,
           CASE WHEN %(n)s BETWEEN 5 AND 30 THEN round(240 * sin(pi() * (%(n)s - 5) / 25))::int ELSE 0 END
               + round(4 + 3 * cos(%(n)s))::int * (%(n)s > 0)::int AS pending
) b
CROSS JOIN generate_series(1, b.processing + b.pending) g
WHERE e.name = 'billing';

-- Deliveries: each endpoint's total as it was, less what it delivered in each later step.
UPDATE courier.delivery_totals t
SET total = 12840 * t.endpoint_id - coalesce((
    SELECT sum(CASE e.name
                   WHEN 'billing' THEN round(10 * (30 + 12 * sin(j / 3.0)))
                   WHEN 'audit-noop' THEN round(10 * (55 + 20 * cos(j / 5.0)))
                   WHEN 'inventory' THEN CASE WHEN j < 9 THEN 0 ELSE round(10 * (8 + 3 * sin(j))) END
                   WHEN 'search-index' THEN round(10 * (2 + sin(j / 2.0)))
                   WHEN 'crm-legacy' THEN CASE WHEN j < 6 THEN 0 ELSE 50 END
                   WHEN 'warehouse' THEN round(10 * (3 + 2 * cos(j / 4.0)))
                   ELSE 0 END)
    FROM generate_series(0, %(n)s - 1) j), 0)
FROM courier.endpoints e
WHERE e.id = t.endpoint_id AND t.outcome = 'delivered' AND t.backend_pid = 0;
