-- Issue 39: what every write to courier.queue costs. PostgreSQL opens each index of the table
-- and readies each partial predicate in every statement that writes it, whether or not the row
-- enters the index (about 3,000 instructions to open one, more for its predicate). An ordering
-- key's two indexes (its messages in processing, and its pending ones in id order) become one,
-- keyed by status between the two: the claims' and dequeues' "any of this key in processing?"
-- and "any of it pending before this one?" are each still one range of it, and the console's
-- FIFO of a key (status = 'pending', ordered by key then id) still comes out of it in order.
-- A send took 10,400 instructions less, 614,019 -> 603,621 (callgrind, PostgreSQL 15).
DROP INDEX courier.queue_ordering_processing_idx;
DROP INDEX courier.queue_ordering_pending_idx;
CREATE INDEX queue_ordering_idx ON courier.queue (ordering_key, status, id)
    WHERE ordering_key IS NOT NULL AND status IN ('pending', 'processing');
