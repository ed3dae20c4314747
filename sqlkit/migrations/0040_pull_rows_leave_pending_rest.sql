-- Pull messages entered queue_pending_rest_idx as well as queue_pull_due_idx: 75 of an
-- enqueue's bytes of WAL, for an index whose only readers (message search, the health check)
-- read pull messages from queue_pull_due_idx, in the order their consumers take them. It now
-- holds only the push messages with a scheduled or retry time, which queue_ready_idx does not.
DROP INDEX courier.queue_pending_rest_idx;
CREATE INDEX queue_pending_rest_idx ON courier.queue (endpoint_id, priority DESC, id)
    WHERE status = 'pending' AND visible_at IS NULL AND (scheduled_at IS NOT NULL OR next_retry_at IS NOT NULL);
