-- Issue 42, item 1: periodic schedules (pgqueuer's, River's, graphile-worker's and
-- procrastinate's periodic jobs). A schedule names a cron expression read in a time zone, a
-- push endpoint or pull topic, and the message each tick sends. The maintenance leader sends
-- each tick once, in the transaction that moves next_run_at past it (run_due_schedules(),
-- functions/schedules.sql), with an idempotency key made of the schedule and the tick as a
-- second fence. ON DELETE CASCADE: a schedule has no meaning once its target is dropped.
CREATE TABLE courier.schedules (
    id              integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name            text NOT NULL UNIQUE
                    CONSTRAINT schedules_name_format CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$'),
    cron            text NOT NULL,
    time_zone       text NOT NULL DEFAULT 'UTC',
    endpoint_id     integer NOT NULL REFERENCES courier.endpoints (id) ON DELETE CASCADE,
    payload         jsonb NOT NULL,
    headers         jsonb,
    metadata        jsonb,
    priority        integer NOT NULL DEFAULT 0,
    ordering_key    text,
    catch_up        text NOT NULL DEFAULT 'skip' CONSTRAINT schedules_catch_up CHECK (catch_up IN ('skip', 'all')),
    catch_up_limit  integer NOT NULL DEFAULT 100 CONSTRAINT schedules_catch_up_limit CHECK (catch_up_limit BETWEEN 1 AND 10000),
    grace_seconds   integer NOT NULL DEFAULT 600 CONSTRAINT schedules_grace CHECK (grace_seconds BETWEEN 1 AND 86400),
    description     text,
    paused_at       timestamptz,
    next_run_at     timestamptz NOT NULL,
    last_tick_at    timestamptz,
    last_sent_at    timestamptz,
    last_message_id bigint,
    sent_ticks      bigint NOT NULL DEFAULT 0,
    skipped_ticks   bigint NOT NULL DEFAULT 0,
    last_error      text,
    last_error_at   timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE courier.schedules IS
    'Periodic schedules: each tick of cron (in time_zone) sends payload to the endpoint or topic once';
COMMENT ON COLUMN courier.schedules.catch_up IS
    'Ticks missed while no leader ran: skip sends at most the latest, if no older than grace_seconds; '
    'all sends every one, oldest first, at most catch_up_limit (the most recent)';
-- The leader's probe: the schedules due now, earliest first.
CREATE INDEX schedules_due_idx ON courier.schedules (next_run_at) WHERE paused_at IS NULL;
CREATE INDEX schedules_endpoint_idx ON courier.schedules (endpoint_id);
