-- Issue 42, item 7: the DLQ as a topic. A pull topic's dead letters are the messages of
-- <topic>.dlq, which consumers dequeue under a lease and ack, nack, release or extend like any
-- topic's (queue-ti), through the same functions (functions/pull.sql). A DLQ entry stays one row
-- of courier.dlq throughout; these columns hold its lease:
--   lease       the lease of its latest dequeue: 0 before any, then negative (-_next_lease), so
--               that a lease names the table its id is in (DLQ ids have their own sequence and
--               overlap the queue's, while every queue lease is positive)
--   leased_at   when the lease running now was taken; NULL while no consumer holds it
--   visible_at  when it can next be dequeued: when it was dead-lettered, the end of its
--               visibility timeout while leased, the end of a nack's delay. Added with now() as
--               its default, which PostgreSQL takes once as the value of every existing row (no
--               rewrite): they are all due, in id order.
--   acked_at    when a consumer of <topic>.dlq acked it; its status is then 'acked', kept for
--               the audit trail until cleanup_dlq() ages it out, as a redriven entry is.
-- The last columns, so that row types and `SELECT *` readers keep every column where it was.
ALTER TABLE courier.dlq
    ADD COLUMN lease      integer NOT NULL DEFAULT 0,
    ADD COLUMN leased_at  timestamptz,
    ADD COLUMN visible_at timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN acked_at   timestamptz;

-- NOT VALID, as 0042 widened the archive's: every row passed the narrower check.
ALTER TABLE courier.dlq DROP CONSTRAINT dlq_status_check,
    ADD CONSTRAINT dlq_status_check CHECK (status IN ('failed', 'redriven', 'acked')) NOT VALID;

-- The dequeue of <topic>.dlq: one topic's dead letters awaiting a decision, due time then id,
-- a range that stops at the first one not due yet (leased, or nacked with a delay). Only pull
-- topics' entries enter it: a push endpoint's dead letters are not a topic.
CREATE INDEX dlq_topic_due_idx ON courier.dlq (endpoint_id, visible_at, id)
    WHERE status = 'failed' AND original_topic IS NOT NULL;
