-- Issue 23: a pull topic hands out higher priority first, as a push endpoint does (the seed's
-- "priority is 0-10, higher first"); messages of one priority keep due-time-then-id order.
-- The due index leads with priority, and each reader walks it one priority level at a time
-- (eleven tight range scans, never a step over messages scheduled for later or held under a
-- lease), highest first. The index keeps its name, so every reader and plan test still finds it.
DROP INDEX courier.queue_pull_due_idx;
CREATE INDEX queue_pull_due_idx ON courier.queue (endpoint_id, priority DESC, visible_at, id)
    WHERE visible_at IS NOT NULL AND status IN ('pending', 'processing');
