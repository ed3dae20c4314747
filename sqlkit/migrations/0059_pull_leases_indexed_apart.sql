-- Issue 39: a pull message's lease moves it from one index to another instead of adding a third
-- entry. queue_pull_due_idx held pending and leased messages alike (so that a dequeue found a
-- lapsed lease in the same range as a due message), and queue_pull_leased_idx held the leased
-- ones again by id (for the readers that show them apart), so every lease wrote three index
-- entries (primary key, due, leased: pg_walinspect) where pgmq's read writes two. Now the due
-- index holds pending messages only and the leased index leased ones only, keyed alike: a lease
-- leaves the one and enters the other, an extend_lease writes two entries instead of three, and
-- a dequeue reads two ranges per priority level (the leased one holds a due message only when a
-- lease has lapsed). BENCHMARKS.md, "Leases indexed apart".
-- The leased index's predicate names lease > 0, which every lease of the queue is (_next_lease,
-- _stage_lease; no version of them handed out 0, the column's default): its readers say so, and the fenced settles, which find their rows by id and
-- compare each lease with their arguments, never can. Without it, statistics taken while nothing
-- was leased made the planner read the whole index for an ack of three ids, as it would every
-- message in flight (tests/test_pull_plans.py).
DROP INDEX courier.queue_pull_due_idx;
DROP INDEX courier.queue_pull_leased_idx;
CREATE INDEX queue_pull_due_idx ON courier.queue (endpoint_id, priority DESC, visible_at, id)
    WHERE visible_at IS NOT NULL AND status = 'pending';
CREATE INDEX queue_pull_leased_idx ON courier.queue (endpoint_id, priority DESC, visible_at, id)
    WHERE visible_at IS NOT NULL AND status = 'processing' AND lease > 0;
