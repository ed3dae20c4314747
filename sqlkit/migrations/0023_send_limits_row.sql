-- The settings a send reads, kept as one row (issue 13). send_limits was a view that pivoted
-- courier.settings with an aggregate, and a send's INSERT joined it: under callgrind, that
-- aggregate's executor start and the separate read of notify_on_send cost about 115,000 of a
-- send's 968,000 instructions. A one-row table gives the same values for the price of one
-- tuple. A trigger on courier.settings rewrites the row after every change, however the change
-- is made; its body is in functions/sending.sql.
DROP VIEW courier.send_limits;

CREATE TABLE courier.send_limits (
    singleton           boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    max_payload_size    bigint,
    max_queue_size      bigint,
    default_message_ttl bigint,
    default_max_depth   bigint,
    notify_on_send      boolean
);

CREATE FUNCTION courier._refresh_send_limits() RETURNS trigger
LANGUAGE plpgsql
AS $$ BEGIN RETURN NULL; END $$;

CREATE TRIGGER settings_refresh_send_limits
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON courier.settings
    FOR EACH STATEMENT EXECUTE FUNCTION courier._refresh_send_limits();

INSERT INTO courier.send_limits (max_payload_size, max_queue_size, default_message_ttl, default_max_depth,
                                 notify_on_send)
SELECT max(value::bigint) FILTER (WHERE name = 'max_payload_size'),
       max(value::bigint) FILTER (WHERE name = 'max_queue_size'),
       max(value::bigint) FILTER (WHERE name = 'default_message_ttl'),
       max(value::bigint) FILTER (WHERE name = 'default_max_depth'),
       bool_or(value::boolean) FILTER (WHERE name = 'notify_on_send')
FROM courier.settings;

-- The wake-up trigger of migration 0022, as one trigger whose WHEN names only the send's
-- request: PostgreSQL parses a trigger's WHEN clause again in every statement that writes the
-- table, and the status and count tests (now in the function) tripled its size, about 32,000
-- instructions of every send.
DROP TRIGGER queue_depth_wake_on_insert ON courier.queue_depth;
DROP TRIGGER queue_depth_wake_on_update ON courier.queue_depth;
CREATE CONSTRAINT TRIGGER queue_depth_wake AFTER INSERT OR UPDATE ON courier.queue_depth
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (current_setting('courier.wake_at_commit', true) = 'on')
    EXECUTE FUNCTION courier._wake_workers_at_commit();
