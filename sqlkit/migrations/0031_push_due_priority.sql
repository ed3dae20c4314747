-- Issue 23: within an endpoint, messages whose scheduled or retry time has come are claimed
-- highest priority first, as ready ones are. queue_due_idx was ordered by due time alone, so a
-- claim took the batch that had been due longest and a high-priority retry waited behind every
-- low-priority message due before it. It now leads with priority, and _claim_due reads one
-- range per priority level, each stopping at now() (messages not yet due are never read).
DROP INDEX courier.queue_due_idx;
CREATE INDEX queue_due_idx ON courier.queue (endpoint_id, priority DESC, (greatest(scheduled_at, next_retry_at)))
    WHERE status = 'pending' AND (scheduled_at IS NOT NULL OR next_retry_at IS NOT NULL) AND visible_at IS NULL;
