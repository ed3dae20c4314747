-- What the queue measured over time, written by the maintenance leader (issue 41): the console
-- sampled only while its Overview was on screen, drew a line across the minutes it never
-- measured and started empty on every start. Every interval (MaintenanceSchedule.metric_samples,
-- 10 s) the leader writes one row per endpoint: its depth, and its cumulative outcome totals as
-- courier.delivery_totals held them. Rates are differences between consecutive samples over the
-- time between them (courier.metric_history()); the totals are unlogged and start from zero
-- after a crash, so a drop is a reset, never a negative rate. interval_seconds is the interval
-- the leader sampled at: two samples further apart than two of it have a gap between them (no
-- leader ran), which every reader shows as a gap.
--
-- About 84 bytes a row and 20 bytes of primary key entry; see ARCHITECTURE.md for what a day
-- of it costs. No foreign key: dropping an endpoint must not scan the samples.
CREATE TABLE courier.metric_samples (
    sampled_at       timestamptz NOT NULL,
    endpoint_id      integer NOT NULL,
    interval_seconds real NOT NULL CHECK (interval_seconds > 0),
    pending          bigint NOT NULL,
    processing       bigint NOT NULL,
    dlq              bigint NOT NULL,
    delivered        bigint NOT NULL,
    failed           bigint NOT NULL,
    dead_lettered    bigint NOT NULL,
    PRIMARY KEY (sampled_at, endpoint_id)
);

INSERT INTO courier.settings (name, value, default_value, value_type, min_value, max_value, unit, description)
VALUES ('metric_samples_retention_hours', '24', '24', 'integer', 1, 720, 'hours',
        'How long the maintenance leader keeps the metric samples the console charts and '
        '`courier status --history` read');
