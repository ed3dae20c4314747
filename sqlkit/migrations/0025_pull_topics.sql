-- Pull topics (queue-ti, NServiceBus, LonnyMQ): an endpoint with protocol 'pull' is a topic
-- whose messages consumers take themselves with dequeue/ack/nack (leased) or receive
-- (destructive). They live in courier.queue beside push messages; the functions are in
-- sqlkit/functions/pull.sql.

-- visible_at is when a pull message can next be taken: its due time while pending (the
-- scheduled time, else the enqueueing transaction's now(), so that a transaction's batch
-- keeps its id order), and the end of its visibility timeout while processing. A lease
-- that runs out makes the row due again without any reaper, and one index serves dequeue,
-- receive and peek in due-time-then-id order. It is NULL for push messages, which keeps
-- them out of that index.
ALTER TABLE courier.queue
    ADD COLUMN visible_at     timestamptz,
    ADD COLUMN key            text,
    ADD COLUMN payload_binary bytea,
    ADD COLUMN body           text;

CREATE INDEX queue_pull_due_idx ON courier.queue (endpoint_id, visible_at, id)
    WHERE visible_at IS NOT NULL AND status IN ('pending', 'processing');
-- Keyed upsert: one active message per (topic, key). A pending one is replaced in place; one
-- in processing is never touched, and an enqueue with its key is refused until it finishes.
CREATE UNIQUE INDEX queue_pull_key_idx ON courier.queue (endpoint_id, key)
    WHERE key IS NOT NULL AND status IN ('pending', 'processing');
-- The expiry reaper also expires messages in processing (queue-ti).
CREATE INDEX queue_processing_expiry_idx ON courier.queue (expires_at)
    WHERE expires_at IS NOT NULL AND status = 'processing';

-- <topic>.dlq: dead-lettered pull messages keep their topic and when they moved.
ALTER TABLE courier.dlq
    ADD COLUMN original_topic text,
    ADD COLUMN dlq_moved_at   timestamptz,
    ADD COLUMN key            text,
    ADD COLUMN payload_binary bytea,
    ADD COLUMN body           text,
    ADD COLUMN max_retries    integer;

ALTER TABLE courier.archive
    ADD COLUMN key            text,
    ADD COLUMN payload_binary bytea,
    ADD COLUMN body           text;
-- The delete reaper removes expired pull messages for good.
CREATE INDEX archive_expired_idx ON courier.archive (endpoint_id, id) WHERE status = 'expired';

-- When each reaper last ran, so the maintenance leader runs the delete reaper on its schedule
-- whichever worker leads.
CREATE TABLE courier.reaper_runs (
    reaper      text PRIMARY KEY CHECK (reaper IN ('expiry', 'delete')),
    last_run_at timestamptz NOT NULL,
    last_count  bigint NOT NULL
);

-- Global defaults behind the per-endpoint overrides (queue-ti's queue.* settings).
INSERT INTO courier.settings (name, value, default_value, value_type, min_value, max_value, unit, description) VALUES
    ('default_message_ttl', '0', '0', 'integer', 0, 31536000, 'seconds',
     'Time-to-live of a message from when it is due, unless its endpoint sets message_ttl_seconds; 0: none'),
    ('default_max_depth', '0', '0', 'integer', 0, 2147483647, 'messages',
     'Pending + processing messages one endpoint may hold, unless it sets max_depth; 0: unlimited'),
    ('default_throughput_limit', '0', '0', 'integer', 0, 1000000, 'messages/s',
     'Messages per second a topic hands out to dequeue, unless it sets throughput_limit; 0: unlimited'),
    ('delete_reaper_interval', '0', '0', 'integer', 0, 31536000, 'seconds',
     'How often the maintenance leader permanently deletes expired pull messages; 0: never (run it on demand)');

-- The per-endpoint limits a send now also checks, with their global defaults read in the
-- same statement as its INSERT.
CREATE OR REPLACE VIEW courier.send_limits AS
    SELECT max(value::bigint) FILTER (WHERE name = 'max_payload_size') AS max_payload_size,
           max(value::bigint) FILTER (WHERE name = 'max_queue_size') AS max_queue_size,
           max(value::bigint) FILTER (WHERE name = 'default_message_ttl') AS default_message_ttl,
           max(value::bigint) FILTER (WHERE name = 'default_max_depth') AS default_max_depth
    FROM courier.settings
    WHERE name IN ('max_payload_size', 'max_queue_size', 'default_message_ttl', 'default_max_depth');
