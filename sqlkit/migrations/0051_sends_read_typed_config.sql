-- What a single send (and a dequeue) reads of its endpoint and of the limits, in forms that need no
-- work per call.
--
-- An endpoint's delay, TTL and max_depth as typed columns that PostgreSQL computes from config
-- when the endpoint is written. A send extracted them from the jsonb in every INSERT (three
-- `->>`, two casts, a `make_interval`, and a subquery that kept the due time one expression):
-- 17,000 instructions of a send's 600,000. config is validated before it is written
-- (_validate_config), so these casts cannot fail on a stored row.
ALTER TABLE courier.endpoints
    ADD COLUMN config_delay interval
        GENERATED ALWAYS AS (make_interval(secs => nullif((config ->> 'delay_seconds')::integer, 0))) STORED,
    ADD COLUMN config_ttl_seconds numeric
        GENERATED ALWAYS AS ((config ->> 'message_ttl_seconds')::numeric) STORED,
    ADD COLUMN config_max_depth bigint
        GENERATED ALWAYS AS ((config ->> 'max_depth')::bigint) STORED,
    -- And what dequeue reads of a topic the same way, its four extractions 14,000 instructions of
    -- a dequeue(1) + ack: max_retries is the topic's, else its retry policy's.
    ADD COLUMN config_visibility_timeout integer
        GENERATED ALWAYS AS ((config ->> 'visibility_timeout')::integer) STORED,
    ADD COLUMN config_max_retries integer
        GENERATED ALWAYS AS (coalesce((config ->> 'max_retries')::integer, (retry_policy ->> 'max_retries')::integer)) STORED,
    ADD COLUMN config_throughput_limit numeric
        GENERATED ALWAYS AS ((config ->> 'throughput_limit')::numeric) STORED,
    ADD COLUMN config_dlq_threshold integer
        GENERATED ALWAYS AS ((config ->> 'dlq_threshold')::integer) STORED;

-- Until when one more message certainly fits under max_queue_size: 'infinity' with no limit,
-- else two seconds past the maintenance leader's estimate while that leaves the queue at most
-- half full, else NULL. It is _room_for's fast answer for one message, precomputed by a trigger
-- on the row whenever the limit or the estimate is written (_send_limits_room), so that a single
-- send tests one column against the clock instead of five operators, and references the exact
-- count (a function) only on its slow path (_admit_slow).
ALTER TABLE courier.send_limits ADD COLUMN room_until timestamptz;
UPDATE courier.send_limits
SET room_until = CASE WHEN max_queue_size = 0 THEN 'infinity'
                      WHEN estimated_at IS NOT NULL AND active_estimate + 1 <= max_queue_size / 2
                          THEN estimated_at + interval '2 seconds' END;
