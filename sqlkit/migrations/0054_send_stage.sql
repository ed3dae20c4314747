-- Issue 39: a single send costs the application's transaction what pgmq's does. While a mover is
-- alive (the maintenance leader says so in send_limits.stage_until, every second), courier.send
-- inserts a plain message to a push endpoint into this narrow table, with only a primary key:
-- no counter row, none of the queue's thirteen indexes, no insert trigger. The claim moves
-- staged messages into courier.queue before it claims (the leader each second too), in one
-- statement per batch, with the id, created_at and expiry the send would have given them, and
-- the queue's insert trigger counts them there (functions/sending.sql, _move_staged).
-- The ids come from the queue's own sequence, so an id names one message wherever it is.
CREATE TABLE courier.send_stage (
    id          bigint PRIMARY KEY DEFAULT nextval('courier.queue_id_seq'),
    endpoint_id integer NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    payload     jsonb NOT NULL
);
ALTER TABLE courier.send_limits ADD COLUMN stage_until timestamptz;
