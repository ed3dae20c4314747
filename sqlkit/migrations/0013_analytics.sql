-- The data pipeline's tables: the analytics jobs' results, the record of exported archive
-- months, and the ledger that makes bulk replays and ingests enqueue each source row once.

-- Per endpoint and UTC hour of completion. A run replaces the hours it analysed, so running
-- it again over the same range rewrites those rows instead of adding to them.
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
