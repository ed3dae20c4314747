-- Issue 39: a push message claimed from the send stage is claimed where it waits, as a dequeued
-- pull message is leased there (migration 0057): its worker and lease are written into its stage
-- row, and a report of its delivery deletes the row there and archives it. The leader moves a
-- claim still there into the queue each second, in processing under its worker and lease, where
-- stale and dead-worker recovery, retries and every listing find it (functions/sending.sql).
-- NULL on every staged send: the column fits the row's null bitmap, and costs a send nothing.
ALTER TABLE courier.send_stage ADD COLUMN worker_id text;
