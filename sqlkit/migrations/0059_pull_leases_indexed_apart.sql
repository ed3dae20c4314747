-- Issue 39: a pull message's lease moves it from one index to another instead of adding a third
-- entry. queue_pull_due_idx held pending and leased messages alike (so that a dequeue found a
-- lapsed lease in the same range as a due message), and queue_pull_leased_idx held the leased
-- ones again by id (for the readers that show them apart), so every lease wrote three index
-- entries (primary key, due, leased: pg_walinspect) where pgmq's read writes two. Now the due
-- index holds pending messages only and the leased index leased ones only, keyed alike: a lease
-- leaves the one and enters the other, an extend_lease writes two entries instead of three, and
-- a dequeue reads two ranges per priority level (the leased one holds a due message only when a
-- lease has lapsed). BENCHMARKS.md, "Leases indexed apart".
-- The leased index's predicate names processing_started_at IS NULL, which every pull message is
-- (only a push claim sets it): its readers say so, and the fenced settles, which find their rows
-- by id and name only the status, visible_at and the lease, never can. Without it, statistics
-- taken while nothing was leased made the planner read the whole index for an ack of three ids,
-- as it would every message in flight (tests/test_pull_plans.py). A NULL test, not lease > 0:
-- a partial predicate's function is readied in every statement that writes the queue (11,000
-- instructions of a dequeue(1) + ack, where the NULL test costs 6,000).
DROP INDEX courier.queue_pull_due_idx;
DROP INDEX courier.queue_pull_leased_idx;
CREATE INDEX queue_pull_due_idx ON courier.queue (endpoint_id, priority DESC, visible_at, id)
    WHERE visible_at IS NOT NULL AND status = 'pending';
CREATE INDEX queue_pull_leased_idx ON courier.queue (endpoint_id, priority DESC, visible_at, id)
    WHERE visible_at IS NOT NULL AND status = 'processing' AND processing_started_at IS NULL;
-- Whether a topic has ever had a message dequeued (leased). receive reads the leased range for
-- lapsed leases only on such a topic: a topic consumed by receive alone never holds a lease, and
-- the second range cost every receive(1) 50,000 instructions to ready. dequeue sets it, in its
-- own transaction, before its first lease of the topic; it is never cleared. Every topic that
-- exists now is marked (added with the default true, then the default turned to false: no row
-- is rewritten), so none that holds a lease is missed.
ALTER TABLE courier.endpoints ADD COLUMN leases boolean NOT NULL DEFAULT true;
ALTER TABLE courier.endpoints ALTER COLUMN leases SET DEFAULT false;
