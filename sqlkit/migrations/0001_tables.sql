-- Courier's tables: settings, endpoints, the hot queue, its maintained depth counters and
-- the event log. Functions live in later migrations so they can be replaced in place.

CREATE TABLE courier.settings (
    name          text PRIMARY KEY,
    value         text NOT NULL,
    default_value text NOT NULL,
    value_type    text NOT NULL CHECK (value_type IN ('integer', 'boolean')),
    min_value     bigint,
    max_value     bigint,
    unit          text,
    description   text NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT now()
);

-- Defaults and ranges follow ulak's GUCs (without the `ulak.` prefix).
INSERT INTO courier.settings (name, value, default_value, value_type, min_value, max_value, unit, description) VALUES
    ('max_queue_size', '1000000', '1000000', 'integer', 0, 2147483647, 'messages',
     'Maximum pending + processing messages; 0 disables backpressure'),
    ('max_payload_size', '1048576', '1048576', 'integer', 1024, 104857600, 'bytes',
     'Largest payload accepted by the send functions'),
    ('default_max_retries', '10', '10', 'integer', 0, 1000, 'retries',
     'Retries before a message is dead-lettered, unless its endpoint policy says otherwise'),
    ('retry_base_delay', '10', '10', 'integer', 1, 3600, 'seconds', 'Base delay for retry backoff'),
    ('retry_max_delay', '300', '300', 'integer', 1, 86400, 'seconds', 'Cap on any retry delay'),
    ('retry_increment', '30', '30', 'integer', 1, 3600, 'seconds', 'Increment for linear backoff'),
    ('circuit_breaker_threshold', '10', '10', 'integer', 1, 1000, 'failures',
     'Consecutive failures before an endpoint''s circuit opens'),
    ('circuit_breaker_cooldown', '30', '30', 'integer', 5, 3600, 'seconds',
     'Time in OPEN before a half-open probe is attempted'),
    ('dlq_retention_days', '30', '30', 'integer', 1, 3650, 'days',
     'Age after which cleanup_dlq() deletes dead-letter entries'),
    ('stale_recovery_timeout', '300', '300', 'integer', 60, 3600, 'seconds',
     'Time in processing after which a message is considered stale and recovered'),
    ('archive_retention_months', '6', '6', 'integer', 1, 120, 'months',
     'Months before old archive partitions are dropped'),
    ('event_log_retention_days', '30', '30', 'integer', 1, 3650, 'days',
     'Age after which event log entries are deleted'),
    ('http_timeout', '10', '10', 'integer', 1, 300, 'seconds', 'Default total timeout of an HTTP delivery'),
    ('http_allow_internal_urls', 'false', 'false', 'boolean', NULL, NULL, NULL,
     'Allow HTTP endpoints on loopback and private addresses'),
    ('capture_response', 'false', 'false', 'boolean', NULL, NULL, NULL,
     'Store endpoint responses with delivered messages'),
    ('response_body_max_size', '65536', '65536', 'integer', 0, 10485760, 'bytes',
     'Largest response body kept when responses are captured'),
    ('visibility_timeout', '30', '30', 'integer', 1, 43200, 'seconds',
     'Default visibility timeout of a pull dequeue'),
    ('notify_on_send', 'true', 'true', 'boolean', NULL, NULL, NULL,
     'NOTIFY workers on every single send (off: higher send throughput, workers poll)');

CREATE TABLE courier.endpoints (
    id                    integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- Names are identifiers operators type and scripts interpolate, so keep them plain.
    name                  text NOT NULL UNIQUE
                          CONSTRAINT endpoints_name_format CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$'),
    protocol              text NOT NULL
                          CHECK (protocol IN ('http', 'redis', 'amqp', 'mqtt', 'nats', 'kafka', 'noop', 'pull')),
    config                jsonb NOT NULL DEFAULT '{}',
    retry_policy          jsonb NOT NULL DEFAULT '{}',
    description           text,
    enabled               boolean NOT NULL DEFAULT true,
    circuit_state         text NOT NULL DEFAULT 'closed' CHECK (circuit_state IN ('closed', 'open', 'half_open')),
    circuit_failure_count integer NOT NULL DEFAULT 0,
    circuit_opened_at     timestamptz,
    circuit_half_open_at  timestamptz,
    last_success_at       timestamptz,
    last_failure_at       timestamptz,
    last_error            text,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now()
);

-- The hot table. It holds active messages plus finished ones until they are archived;
-- every hot-path index is partial on an active status, so finished rows cost the claim
-- path nothing. fillfactor leaves room on each page for status updates.
--
-- endpoint_id deliberately has no foreign key: the RI check takes a KEY SHARE lock on the
-- endpoint row for every insert, which turns concurrent producers into multixact churn on
-- one row. drop_endpoint() guards against orphans instead, and claims join endpoints.
CREATE TABLE courier.queue (
    id                    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    endpoint_id           integer NOT NULL,
    payload               jsonb NOT NULL,
    headers               jsonb NOT NULL DEFAULT '{}',
    metadata              jsonb NOT NULL DEFAULT '{}',
    status                text NOT NULL DEFAULT 'pending'
                          CHECK (status IN ('pending', 'processing', 'completed', 'failed', 'expired')),
    priority              smallint NOT NULL DEFAULT 0 CHECK (priority BETWEEN 0 AND 10),
    retry_count           integer NOT NULL DEFAULT 0,
    max_retries           integer,
    next_retry_at         timestamptz,
    scheduled_at          timestamptz,
    expires_at            timestamptz,
    idempotency_key       text,
    payload_hash          text,
    correlation_id        uuid,
    ordering_key          text,
    last_error            text,
    error_history         jsonb NOT NULL DEFAULT '[]',
    worker_id             text,
    processing_started_at timestamptz,
    completed_at          timestamptz,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 70);

-- Claim: per endpoint, priority DESC then FIFO by id, only over pending rows.
CREATE INDEX queue_claim_idx ON courier.queue (endpoint_id, priority DESC, id)
    WHERE status = 'pending';
CREATE UNIQUE INDEX queue_idempotency_key_idx ON courier.queue (idempotency_key)
    WHERE idempotency_key IS NOT NULL AND status IN ('pending', 'processing');
CREATE INDEX queue_ordering_processing_idx ON courier.queue (ordering_key)
    WHERE ordering_key IS NOT NULL AND status = 'processing';
CREATE INDEX queue_ordering_pending_idx ON courier.queue (ordering_key, id)
    WHERE ordering_key IS NOT NULL AND status = 'pending';
CREATE INDEX queue_processing_started_idx ON courier.queue (processing_started_at)
    WHERE status = 'processing';
CREATE INDEX queue_expiry_idx ON courier.queue (expires_at)
    WHERE expires_at IS NOT NULL AND status = 'pending';
CREATE INDEX queue_finished_idx ON courier.queue (id)
    WHERE status IN ('completed', 'failed', 'expired');
CREATE INDEX queue_correlation_idx ON courier.queue (correlation_id)
    WHERE correlation_id IS NOT NULL;

-- Exact queue depth without count(*): statement triggers on the queue add and subtract
-- per (endpoint, status). Each backend writes only its own rows (keyed by its pid), so
-- producers never wait on each other's counter rows even inside long transactions.
-- Rows of backends that have exited are folded into backend_pid 0 by compact_queue_depth().
CREATE TABLE courier.queue_depth (
    endpoint_id integer NOT NULL,
    status      text NOT NULL,
    backend_pid integer NOT NULL,
    messages    bigint NOT NULL,
    PRIMARY KEY (endpoint_id, status, backend_pid)
) WITH (fillfactor = 20);

-- Cumulative delivery outcomes, sharded by backend like queue_depth.
CREATE TABLE courier.delivery_totals (
    endpoint_id integer NOT NULL,
    outcome     text NOT NULL,
    backend_pid integer NOT NULL,
    total       bigint NOT NULL,
    PRIMARY KEY (endpoint_id, outcome, backend_pid)
) WITH (fillfactor = 20);

CREATE TABLE courier.event_log (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_type  text NOT NULL,
    endpoint_id integer,
    actor       text NOT NULL DEFAULT session_user,
    details     jsonb NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX event_log_created_idx ON courier.event_log USING brin (created_at);
CREATE INDEX event_log_endpoint_idx ON courier.event_log (endpoint_id, id) WHERE endpoint_id IS NOT NULL;
