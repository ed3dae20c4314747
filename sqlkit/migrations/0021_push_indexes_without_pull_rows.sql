-- The indexes only push paths read hold push messages only (issue 11's pull benchmark).
-- queue_ready_idx and queue_due_idx serve _claim_due, and only for push endpoints; a pull
-- message (visible_at NOT NULL, migration 0019) is taken from queue_pull_due_idx instead, yet
-- every enqueue and nack of one added an entry to queue_ready_idx (or queue_due_idx when
-- scheduled) that nothing ever read. _claim_due names `visible_at IS NULL` in both branches
-- so the planner still proves these predicates and uses them.
--
-- queue_processing_started_idx holds in-flight push messages only as well. Pull messages in
-- processing (they have no processing_started_at) made it the planner's pick for ack and
-- nack whenever the statistics saw few rows in processing: their `status = 'processing'`
-- matched its predicate, and an ack of 100 ids read every leased message of every topic
-- (0.2 ms with 100 of them, growing with every message held). Leased pull messages get an
-- index on id instead, queue_pull_leased_idx: whichever of it and the primary key the
-- planner takes for an ack, it looks the ids up. Message search lists them from it, after
-- the push messages in processing as before; stale recovery and the health check name
-- `visible_at IS NULL` to keep to queue_processing_started_idx (pull messages never matched
-- them: their processing_started_at is NULL).
--
-- queue_claim_idx keeps pull messages: message search and the health check's oldest pending
-- message read them there.
DROP INDEX courier.queue_processing_started_idx;
CREATE INDEX queue_processing_started_idx ON courier.queue (processing_started_at)
    WHERE status = 'processing' AND visible_at IS NULL;
CREATE INDEX queue_pull_leased_idx ON courier.queue (id)
    WHERE status = 'processing' AND visible_at IS NOT NULL;
DROP INDEX courier.queue_ready_idx;
CREATE INDEX queue_ready_idx ON courier.queue (endpoint_id, priority DESC, id)
    WHERE status = 'pending' AND scheduled_at IS NULL AND next_retry_at IS NULL AND visible_at IS NULL;
DROP INDEX courier.queue_due_idx;
CREATE INDEX queue_due_idx ON courier.queue (endpoint_id, (greatest(scheduled_at, next_retry_at)))
    WHERE status = 'pending' AND (scheduled_at IS NOT NULL OR next_retry_at IS NOT NULL) AND visible_at IS NULL;
