-- The baseline: Courier's schema as migrations 0001-0032 left it, in one file. Tables,
-- indexes, types, the roles and the rows Courier starts with; no function bodies, which live
-- once each in sqlkit/functions/<area>.sql (with the triggers that call them and every grant,
-- in roles.sql). A database migrated by a Courier from before the squash records versions
-- 1-32; migrate recognises that history and records it as this baseline (sqlkit/migrate.py).
-- A later change to a table is a small migration numbered after this one.

-- Roles ---------------------------------------------------------------------------------------
-- courier_admin, courier_application and courier_monitor are what users log in as (through a
-- login role granted one of them). courier_owner owns every object in schema courier: a
-- NOLOGIN role with no special attributes, so that SECURITY DEFINER functions run with its
-- rights and never with the superuser's that ran the migration; roles.sql hands the objects
-- over in the same transaction that creates them. Roles belong to the whole cluster, so
-- another database may have made them already, possibly at this very moment.
DO $$
DECLARE
    v_role text;
BEGIN
    FOREACH v_role IN ARRAY ARRAY['courier_admin', 'courier_application', 'courier_monitor', 'courier_owner'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = v_role) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS',
                               v_role);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;
            END;
        END IF;
    END LOOP;
END
$$;

-- Settings ------------------------------------------------------------------------------------
-- Defaults and ranges follow ulak's GUCs (without the `ulak.` prefix). A 'cron' value is
-- normalised and checked by _normalize_setting (functions/endpoints.sql) and read by the
-- maintenance leader with cronsim.
CREATE TABLE courier.settings (
    name          text PRIMARY KEY,
    value         text NOT NULL,
    default_value text NOT NULL,
    value_type    text NOT NULL CHECK (value_type IN ('integer', 'boolean', 'cron')),
    min_value     bigint,
    max_value     bigint,
    unit          text,
    description   text NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT now()
);

INSERT INTO courier.settings (name, value, default_value, value_type, min_value, max_value, unit, description) VALUES
    ('archive_retention_months', '6', '6', 'integer', 1, 120, 'months',
     'Months before old archive partitions are dropped'),
    ('capture_response', 'false', 'false', 'boolean', NULL, NULL, NULL,
     'Store endpoint responses with delivered messages'),
    ('circuit_breaker_cooldown', '30', '30', 'integer', 5, 3600, 'seconds',
     'Time in OPEN before a half-open probe is attempted'),
    ('circuit_breaker_threshold', '10', '10', 'integer', 1, 1000, 'failures',
     'Consecutive failures before an endpoint''s circuit opens'),
    ('default_max_depth', '0', '0', 'integer', 0, 2147483647, 'messages',
     'Pending + processing messages one endpoint may hold, unless it sets max_depth; 0: unlimited'),
    ('default_max_retries', '10', '10', 'integer', 0, 1000, 'retries',
     'Retries before a message is dead-lettered, unless its endpoint policy says otherwise'),
    ('default_message_ttl', '0', '0', 'integer', 0, 31536000, 'seconds',
     'Time-to-live of a message from when it is due, unless its endpoint sets message_ttl_seconds; 0: none'),
    ('default_throughput_limit', '0', '0', 'integer', 0, 1000000, 'messages/s',
     'Messages per second a topic hands out to dequeue, unless it sets throughput_limit; 0: unlimited'),
    ('delete_reaper_interval', '0', '0', 'integer', 0, 31536000, 'seconds',
     'How often the maintenance leader permanently deletes expired pull messages; 0: never (run it on demand)'),
    ('delete_reaper_schedule', '', '', 'cron', NULL, NULL, NULL,
     'When the maintenance leader permanently deletes expired pull messages, as a cron schedule ("0 3 * * *": daily at 03:00 UTC; @hourly, @daily, @weekly, @monthly, @yearly); empty: delete_reaper_interval decides'),
    ('dlq_retention_days', '30', '30', 'integer', 1, 3650, 'days',
     'Age after which cleanup_dlq() deletes dead-letter entries'),
    ('event_log_retention_days', '30', '30', 'integer', 1, 3650, 'days',
     'Age after which event log entries are deleted'),
    ('http_allow_internal_urls', 'false', 'false', 'boolean', NULL, NULL, NULL,
     'Allow endpoints of every protocol (HTTP and brokers) on loopback and private addresses'),
    ('http_timeout', '10', '10', 'integer', 1, 300, 'seconds',
     'Default total timeout of an HTTP delivery'),
    ('idempotency_retention_seconds', '86400', '86400', 'integer', 0, 31536000, 'seconds',
     'How long a delivered message''s idempotency key still turns away duplicates (0: only while queued)'),
    ('max_payload_size', '1048576', '1048576', 'integer', 1024, 104857600, 'bytes',
     'Largest payload accepted by the send functions'),
    ('max_queue_size', '1000000', '1000000', 'integer', 0, 2147483647, 'messages',
     'Maximum pending + processing messages; 0 disables backpressure'),
    ('notify_on_send', 'true', 'true', 'boolean', NULL, NULL, NULL,
     'NOTIFY workers on every single send (off: higher send throughput, workers poll)'),
    ('response_body_max_size', '65536', '65536', 'integer', 0, 10485760, 'bytes',
     'Largest response body kept when responses are captured'),
    ('retry_base_delay', '10', '10', 'integer', 1, 3600, 'seconds',
     'Base delay for retry backoff'),
    ('retry_increment', '30', '30', 'integer', 1, 3600, 'seconds',
     'Increment for linear backoff'),
    ('retry_max_delay', '300', '300', 'integer', 1, 86400, 'seconds',
     'Cap on any retry delay'),
    ('stale_recovery_timeout', '300', '300', 'integer', 60, 3600, 'seconds',
     'Time in processing after which a message is considered stale and recovered'),
    ('visibility_timeout', '30', '30', 'integer', 1, 43200, 'seconds',
     'Default visibility timeout of a pull dequeue');

-- The settings a send reads, as one row: a send's INSERT reads it for the price of one tuple,
-- where a view pivoting courier.settings cost about 115,000 of a send's 968,000 instructions
-- (callgrind). A trigger on courier.settings rewrites it after every change, however the
-- change is made (functions/sending.sql).
CREATE TABLE courier.send_limits (
    singleton           boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    max_payload_size    bigint,
    max_queue_size      bigint,
    default_message_ttl bigint,
    default_max_depth   bigint,
    notify_on_send      boolean
);
-- The defaults above; the trigger keeps the row in step from here on.
INSERT INTO courier.send_limits (max_payload_size, max_queue_size, default_message_ttl, default_max_depth,
                                 notify_on_send)
VALUES (1048576, 1000000, 0, 0, true);

-- The database's identity: a uuid made once, at the first migrate, and never changed. Every
-- id Courier hands a broker or receiver to deduplicate on carries it, so two databases
-- publishing to one stream cannot drop each other's messages as duplicates. Only the owner
-- writes it.
CREATE TABLE courier.database_identity (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    id         uuid NOT NULL DEFAULT gen_random_uuid(),
    created_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO courier.database_identity DEFAULT VALUES;

-- Endpoints -----------------------------------------------------------------------------------
-- A push endpoint (http, a broker, noop) or a pull topic ('pull'). 'kafka' is accepted by the
-- table and refused by validate_endpoint_config.
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
    updated_at            timestamptz NOT NULL DEFAULT now(),
    -- Token bucket of the endpoint's rate limit (config.rate_limit), or a topic's throughput_limit.
    rate_tokens           double precision,
    rate_refilled_at      timestamptz
);

-- The queue -----------------------------------------------------------------------------------
-- The hot table. It holds active messages plus finished ones until they are archived; every
-- hot-path index is partial on an active status, so finished rows cost the claim path nothing.
-- fillfactor leaves room on each page for status updates.
--
-- endpoint_id deliberately has no foreign key: the RI check takes a KEY SHARE lock on the
-- endpoint row for every insert, which turns concurrent producers into multixact churn on one
-- row. drop_endpoint() guards against orphans instead, and claims join endpoints.
--
-- Every delivery inserts, updates and deletes a row, and by default autovacuum waits for 20%
-- of the rows to die, which behind a backlog of millions is millions of dead rows: vacuum
-- after a fixed number instead, unthrottled. Under sustained churn with a small backlog
-- (`courier bench churn`) the bound is the server's autovacuum_naptime, not these settings.
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
    updated_at            timestamptz NOT NULL DEFAULT now(),
    response              jsonb,
    -- Fencing: each claim (and each pull lease) takes the next lease number; reports, releases
    -- and renewals name the lease they hold, and one whose lease is no longer the message's
    -- (its claim went stale, was recovered and handed to another worker) changes nothing. The
    -- counter is not indexed, so a claim stays a HOT update.
    lease                 integer NOT NULL DEFAULT 0,
    -- Pull topics (protocol 'pull'): when the message can next be taken, its due time while
    -- pending (the scheduled time, else the enqueueing transaction's now(), so a transaction's
    -- batch keeps its id order) and the end of its visibility timeout while processing. A lease
    -- that runs out makes the row due again without any reaper. NULL for push messages, which
    -- keeps them out of the pull indexes and pull messages out of the push ones.
    visible_at            timestamptz,
    key                   text,
    payload_binary        bytea,
    body                  text
) WITH (fillfactor = 70,
        autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000,
        autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = 10000,
        autovacuum_analyze_scale_factor = 0, autovacuum_analyze_threshold = 50000,
        autovacuum_vacuum_cost_delay = 0);

-- Push claims. Pending push messages with no time attached are served in claim order, priority
-- first then FIFO, from queue_ready_idx; those with a scheduled or retry time from
-- queue_due_idx, which _claim_due reads one range per priority level, each stopping at now(),
-- so messages not yet due are never read (behind 200k messages scheduled for later, an index of
-- every pending row read and filtered all 200k: 51 ms). Both name `visible_at IS NULL`, and so
-- does _claim_due, so pull messages never enter them and the planner still proves the predicates.
CREATE INDEX queue_ready_idx ON courier.queue (endpoint_id, priority DESC, id)
    WHERE status = 'pending' AND scheduled_at IS NULL AND next_retry_at IS NULL AND visible_at IS NULL;
CREATE INDEX queue_due_idx ON courier.queue (endpoint_id, priority DESC, (greatest(scheduled_at, next_retry_at)))
    WHERE status = 'pending' AND (scheduled_at IS NOT NULL OR next_retry_at IS NOT NULL) AND visible_at IS NULL;
-- The pending messages queue_ready_idx does not hold: scheduled, retrying and pull ones.
-- Together the two hold every pending message once, in the same order, and message search and
-- the health check take the first rows of each (functions/observability.sql, queries.sql's
-- search_messages). One index of every pending row instead was a tenth of a send_batch(100)'s
-- backend time (636 -> 572 us of CPU per batch, perf task-clock, PostgreSQL 15).
CREATE INDEX queue_pending_rest_idx ON courier.queue (endpoint_id, priority DESC, id)
    WHERE status = 'pending' AND (scheduled_at IS NOT NULL OR next_retry_at IS NOT NULL OR visible_at IS NOT NULL);
-- Idempotency keys are scoped per endpoint, as ulak's are: the same key sent to two endpoints
-- names two messages.
CREATE UNIQUE INDEX queue_endpoint_idempotency_key_idx ON courier.queue (endpoint_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL AND status IN ('pending', 'processing');
CREATE INDEX queue_ordering_processing_idx ON courier.queue (ordering_key)
    WHERE ordering_key IS NOT NULL AND status = 'processing';
CREATE INDEX queue_ordering_pending_idx ON courier.queue (ordering_key, id)
    WHERE ordering_key IS NOT NULL AND status = 'pending';
-- In-flight push messages, for stale recovery and the health check (which name
-- `visible_at IS NULL` to use it). Pull messages in processing have no processing_started_at.
CREATE INDEX queue_processing_started_idx ON courier.queue (processing_started_at)
    WHERE status = 'processing' AND visible_at IS NULL;
CREATE INDEX queue_expiry_idx ON courier.queue (expires_at)
    WHERE expires_at IS NOT NULL AND status = 'pending';
-- The expiry reaper also expires pull messages in processing (queue-ti).
CREATE INDEX queue_processing_expiry_idx ON courier.queue (expires_at)
    WHERE expires_at IS NOT NULL AND status = 'processing';
CREATE INDEX queue_finished_idx ON courier.queue (id)
    WHERE status IN ('completed', 'failed', 'expired');
CREATE INDEX queue_correlation_idx ON courier.queue (correlation_id)
    WHERE correlation_id IS NOT NULL;
-- Pull topics: one index serves dequeue, receive and peek, each walking it one priority level
-- at a time (eleven tight range scans, highest first, never a step over messages scheduled for
-- later or held under a lease); a level keeps due-time-then-id order.
CREATE INDEX queue_pull_due_idx ON courier.queue (endpoint_id, priority DESC, visible_at, id)
    WHERE visible_at IS NOT NULL AND status IN ('pending', 'processing');
-- Keyed upsert: one active message per (topic, key). A pending one is replaced in place; one
-- in processing is never touched, and an enqueue with its key is refused until it finishes.
CREATE UNIQUE INDEX queue_pull_key_idx ON courier.queue (endpoint_id, key)
    WHERE key IS NOT NULL AND status IN ('pending', 'processing');
-- Leased pull messages by id, so that an ack or nack of 100 ids looks them up whichever of
-- this and the primary key the planner takes, instead of reading every leased message.
CREATE INDEX queue_pull_leased_idx ON courier.queue (id)
    WHERE status = 'processing' AND visible_at IS NOT NULL;

-- What a claim hands the worker.
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
    created_at      timestamptz,
    lease           integer
);

-- Counters ------------------------------------------------------------------------------------
-- Exact queue depth without count(*): statement triggers on the queue add and subtract per
-- (endpoint, status). Each backend writes only its own rows (keyed by its pid), so producers
-- never wait on each other's counter rows even inside long transactions. Rows of backends
-- that have exited are folded into backend_pid 0 by compact_queue_depth(). The counter tables
-- are rewritten on every report and are vacuumed after a fixed number of dead rows.
CREATE TABLE courier.queue_depth (
    endpoint_id integer NOT NULL,
    status      text NOT NULL,
    backend_pid integer NOT NULL,
    messages    bigint NOT NULL,
    PRIMARY KEY (endpoint_id, status, backend_pid)
) WITH (fillfactor = 20, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000,
        autovacuum_vacuum_cost_delay = 0);

-- Cumulative delivery outcomes, sharded by backend like queue_depth.
CREATE TABLE courier.delivery_totals (
    endpoint_id integer NOT NULL,
    outcome     text NOT NULL,
    backend_pid integer NOT NULL,
    total       bigint NOT NULL,
    PRIMARY KEY (endpoint_id, outcome, backend_pid)
) WITH (fillfactor = 20, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000,
        autovacuum_vacuum_cost_delay = 0);

-- Exact DLQ depth, kept like queue_depth.
CREATE TABLE courier.dlq_depth (
    endpoint_id integer NOT NULL,
    status      text NOT NULL,
    backend_pid integer NOT NULL,
    messages    bigint NOT NULL,
    PRIMARY KEY (endpoint_id, status, backend_pid)
) WITH (fillfactor = 20);

-- The dead-letter queue -----------------------------------------------------------------------
-- The whole message and every attempt's error. Redriven rows stay, with status 'redriven', as
-- the audit trail until cleanup_dlq() ages them out. A dead-lettered pull message (<topic>.dlq)
-- keeps its topic and when it moved.
CREATE TABLE courier.dlq (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    original_message_id bigint NOT NULL,
    endpoint_id         integer NOT NULL,
    endpoint_name       text NOT NULL,
    payload             jsonb NOT NULL,
    headers             jsonb NOT NULL DEFAULT '{}',
    metadata            jsonb NOT NULL DEFAULT '{}',
    priority            smallint NOT NULL DEFAULT 0,
    ordering_key        text,
    idempotency_key     text,
    correlation_id      uuid,
    scheduled_at        timestamptz,
    expires_at          timestamptz,
    retry_count         integer NOT NULL DEFAULT 0,
    last_error          text,
    error_history       jsonb NOT NULL DEFAULT '[]',
    status              text NOT NULL DEFAULT 'failed' CHECK (status IN ('failed', 'redriven')),
    original_created_at timestamptz NOT NULL,
    failed_at           timestamptz NOT NULL DEFAULT now(),
    redriven_at         timestamptz,
    redriven_message_id bigint,
    original_topic      text,
    dlq_moved_at        timestamptz,
    key                 text,
    payload_binary      bytea,
    body                text,
    max_retries         integer
);
CREATE INDEX dlq_failed_idx ON courier.dlq (endpoint_id, id) WHERE status = 'failed';
CREATE INDEX dlq_failed_at_idx ON courier.dlq USING brin (failed_at);
CREATE INDEX dlq_correlation_idx ON courier.dlq (correlation_id) WHERE correlation_id IS NOT NULL;
-- The console's DLQ pane lists one endpoint's entries newest first, however large the DLQ
-- grows (an endpoint down for a weekend leaves millions): without this index, a sequential
-- scan of the whole DLQ (68 ms at 1M entries, for an endpoint with 20 of them).
CREATE INDEX dlq_endpoint_idx ON courier.dlq (endpoint_name, id);
-- dlq_summary(): each endpoint's oldest and newest failure as two probes.
CREATE INDEX dlq_endpoint_failed_at_idx ON courier.dlq (endpoint_id, failed_at);

-- Workers and maintenance ---------------------------------------------------------------------
-- Worker heartbeats: one row per worker process, on any machine. leader_backend_pid is the
-- session through which the maintenance leader holds its lease.
CREATE TABLE courier.workers (
    worker_id          text PRIMARY KEY,
    hostname           text NOT NULL,
    pid                integer NOT NULL,
    concurrency        integer NOT NULL,
    in_flight          integer NOT NULL DEFAULT 0,
    delivered          bigint NOT NULL DEFAULT 0,
    failed             bigint NOT NULL DEFAULT 0,
    state              text NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'draining', 'stopped')),
    started_at         timestamptz NOT NULL DEFAULT now(),
    last_heartbeat     timestamptz NOT NULL DEFAULT now(),
    leader_backend_pid integer
);

-- A killed worker's claims are recovered within seconds, not after the stale-recovery
-- timeout. Each worker process (an incarnation: a fixed --worker-id restarted by a supervisor
-- is a new one) registers every database session it works through; once none of an
-- incarnation's sessions is left in pg_stat_activity the process is gone, and the maintenance
-- leader hands its claims back (recover_dead_workers_claims, functions/claiming.sql).
CREATE TABLE courier.worker_sessions (
    worker_id     text NOT NULL,
    incarnation   text NOT NULL,
    backend_pid   integer NOT NULL,
    role_oid      oid NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT now(),
    lost_at       timestamptz,  -- when the leader first found the incarnation without a live session
    PRIMARY KEY (worker_id, incarnation, backend_pid)
);

-- Maintenance leadership, as a lease in a row only courier_owner writes, taken and renewed
-- through try_lead_maintenance() (SECURITY DEFINER) with an expiry. Not an advisory lock: any
-- database user can take any advisory key, and one holding it would stop every maintenance
-- job for good. maintained_at says when the leader last ran its jobs, for health_check().
CREATE TABLE courier.maintenance_lease (
    singleton      boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    worker_id      text,
    backend_pid    integer,
    backend_start  timestamptz,
    expires_at     timestamptz NOT NULL DEFAULT '-infinity',
    elected_at     timestamptz,
    maintained_at  timestamptz
);
INSERT INTO courier.maintenance_lease DEFAULT VALUES;

-- The locks Courier's own jobs serialise on (archive partition creation, counter compaction),
-- as rows no other role can lock: locking a row needs UPDATE on its table.
CREATE TABLE courier.internal_locks (
    name text PRIMARY KEY
);
INSERT INTO courier.internal_locks (name) VALUES ('archive_partitions'), ('compact_queue_depth');

-- When each reaper last ran, so the maintenance leader runs the delete reaper on its schedule
-- whichever worker leads.
CREATE TABLE courier.reaper_runs (
    reaper      text PRIMARY KEY CHECK (reaper IN ('expiry', 'delete')),
    last_run_at timestamptz NOT NULL,
    last_count  bigint NOT NULL
);

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

-- Publish/subscribe ---------------------------------------------------------------------------
-- publish() fans an event out into courier.queue, one message per matching subscription, so
-- push endpoints and pull topics receive it the same way they receive a send.
CREATE TABLE courier.event_types (
    id          integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name        text NOT NULL UNIQUE
                CONSTRAINT event_types_name_format CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$'),
    description text,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- One subscription per (event type, endpoint): a second one would deliver every event twice.
-- Dropping an endpoint or an event type takes its subscriptions with it.
CREATE TABLE courier.subscriptions (
    id            integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_type_id integer NOT NULL REFERENCES courier.event_types (id) ON DELETE CASCADE,
    endpoint_id   integer NOT NULL REFERENCES courier.endpoints (id) ON DELETE CASCADE,
    filter        jsonb NOT NULL DEFAULT '{}'
                  CONSTRAINT subscriptions_filter_object CHECK (jsonb_typeof(filter) = 'object'),
    created_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (event_type_id, endpoint_id)
);
CREATE INDEX subscriptions_endpoint_idx ON courier.subscriptions (endpoint_id);

-- The archive ---------------------------------------------------------------------------------
-- Finished messages leave the hot queue for a table partitioned by month, from which they can
-- be replayed. Delivered and dead-lettered messages move there in the same statement that
-- records their outcome; expired ones are swept by archive_completed_messages().
CREATE TABLE courier.archive (
    id              bigint NOT NULL,             -- the message's id while it was queued
    endpoint_id     integer NOT NULL,
    payload         jsonb NOT NULL,
    headers         jsonb NOT NULL DEFAULT '{}',
    metadata        jsonb NOT NULL DEFAULT '{}',
    status          text NOT NULL CHECK (status IN ('completed', 'failed', 'expired')),
    priority        smallint NOT NULL DEFAULT 0,
    retry_count     integer NOT NULL DEFAULT 0,
    max_retries     integer,
    scheduled_at    timestamptz,
    expires_at      timestamptz,
    idempotency_key text,
    correlation_id  uuid,
    ordering_key    text,
    last_error      text,
    error_history   jsonb NOT NULL DEFAULT '[]',
    worker_id       text,
    response        jsonb,
    completed_at    timestamptz NOT NULL,        -- delivered, dead-lettered or expired
    created_at      timestamptz NOT NULL,
    archived_at     timestamptz NOT NULL DEFAULT now(),
    key             text,
    payload_binary  bytea,
    body            text,
    -- Replays walk a range in id order, which this index serves partition by partition.
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);
-- BRIN, as ulak measured: tiny next to a B-tree and as good for time ranges of an
-- append-mostly table.
CREATE INDEX archive_created_brin ON courier.archive USING brin (created_at)
    WITH (pages_per_range = 64, autosummarize = on);
CREATE INDEX archive_correlation_idx ON courier.archive (correlation_id) WHERE correlation_id IS NOT NULL;
-- The send path's look-up of a delivered key, per endpoint; keyless messages cost it nothing.
CREATE INDEX archive_endpoint_idempotency_idx ON courier.archive (endpoint_id, idempotency_key, completed_at)
    WHERE idempotency_key IS NOT NULL AND status = 'completed';
-- The delete reaper removes expired pull messages for good.
CREATE INDEX archive_expired_idx ON courier.archive (endpoint_id, id) WHERE status = 'expired';

CREATE TABLE courier.archive_default PARTITION OF courier.archive DEFAULT;
-- This month's partition and the next three, named and bounded as
-- maintain_archive_partitions() (functions/archive.sql) makes the later ones: UTC months.
DO $$
DECLARE
    v_from timestamptz;
BEGIN
    FOR n IN 0..3 LOOP
        v_from := (date_trunc('month', now() AT TIME ZONE 'UTC') + make_interval(months => n)) AT TIME ZONE 'UTC';
        EXECUTE format('CREATE TABLE courier.%I PARTITION OF courier.archive FOR VALUES FROM (%L) TO (%L)',
                       'archive_' || to_char(v_from AT TIME ZONE 'UTC', 'YYYY_MM'), v_from,
                       (date_trunc('month', now() AT TIME ZONE 'UTC') + make_interval(months => n + 1)) AT TIME ZONE 'UTC');
    END LOOP;
END
$$;

-- Resumable range replays: the cursor advances in the same transaction as the messages it
-- enqueues, so an interrupted replay resumes where it stopped and never enqueues twice.
CREATE TABLE courier.replays (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    endpoint_id     integer NOT NULL,
    from_ts         timestamptz NOT NULL,
    to_ts           timestamptz NOT NULL,
    status_filter   text,
    state           text NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'finished')),
    last_archive_id bigint NOT NULL DEFAULT 0,
    replayed        bigint NOT NULL DEFAULT 0,
    started_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz
);
CREATE UNIQUE INDEX replays_running_idx ON courier.replays (endpoint_id, from_ts, to_ts, coalesce(status_filter, ''))
    WHERE state = 'running';

-- One replay rule for `courier archive replay`, `replay-message`, the console's wizard and
-- `courier pipeline replay`: an archived message is enqueued again once, unless the operator
-- asks for a fresh copy. cleanup_old_archive_partitions() ages the rows out.
CREATE TABLE courier.replayed_messages (
    archive_id  bigint PRIMARY KEY,
    message_id  bigint,                 -- the latest copy's id in the queue, when known
    copies      integer NOT NULL DEFAULT 1,
    replayed_at timestamptz NOT NULL DEFAULT now()
);

-- The data pipeline ---------------------------------------------------------------------------
-- Analytics per endpoint and UTC hour of completion. A run replaces the hours it analysed, so
-- running it again over the same range rewrites those rows instead of adding to them.
CREATE TABLE courier.analytics_hourly (
    endpoint_id   integer NOT NULL,
    hour          timestamptz NOT NULL,
    delivered     bigint NOT NULL,
    failed        bigint NOT NULL,      -- failed delivery attempts of the messages finished that hour
    expired       bigint NOT NULL,
    dead_lettered bigint NOT NULL,
    p50_ms        double precision,     -- enqueue to delivery, delivered messages only
    p95_ms        double precision,
    p99_ms        double precision,
    run_id        bigint NOT NULL,
    PRIMARY KEY (endpoint_id, hour)
);
CREATE INDEX analytics_hourly_hour_idx ON courier.analytics_hourly (hour);

CREATE TABLE courier.analytics_attempts (
    endpoint_id integer NOT NULL,
    hour        timestamptz NOT NULL,
    attempts    integer NOT NULL,
    messages    bigint NOT NULL,
    PRIMARY KEY (endpoint_id, hour, attempts)
);

CREATE TABLE courier.analytics_errors (
    endpoint_id integer NOT NULL,
    hour        timestamptz NOT NULL,
    error_class text NOT NULL,
    occurrences bigint NOT NULL,
    PRIMARY KEY (endpoint_id, hour, error_class)
);

-- One row per analytics run, with the per-endpoint totals over the range it analysed.
CREATE TABLE courier.analytics_runs (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    range_from  timestamptz,
    range_to    timestamptz NOT NULL,
    master      text NOT NULL,
    rows_read   bigint NOT NULL,
    endpoints   jsonb NOT NULL DEFAULT '[]',
    started_at  timestamptz NOT NULL,
    finished_at timestamptz NOT NULL DEFAULT now()
);

-- Archive months written to Parquet and verified; dropped_at once the partition is gone.
CREATE TABLE courier.archive_exports (
    month       timestamptz PRIMARY KEY,
    location    text NOT NULL,
    rows        bigint NOT NULL,
    checksum    text NOT NULL,
    exported_at timestamptz NOT NULL DEFAULT now(),
    dropped_at  timestamptz
);

-- Which source rows a bulk replay or ingest (its scope) has already enqueued. Written in the
-- same transaction as the messages, so a re-run or a retried Spark task skips them.
CREATE TABLE courier.pipeline_ledger (
    scope      text NOT NULL,
    source_key text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, source_key)
);
