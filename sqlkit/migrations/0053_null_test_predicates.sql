-- Issue 39: what every write to courier.queue costs. PostgreSQL readies each partial index's
-- predicate in every statement that writes the table (copied from the relation cache, then
-- simplified and compiled, with a catalog lookup and an ACL check for each function it names),
-- whether or not the row enters the index. A test of `status` is a function call (texteq); a
-- test for NULL is none, about 8,000 instructions less per predicate and statement. Two
-- indexes say the same with NULL tests alone:
-- - queue_ordering_idx: status is its second key column, so every lookup of it names the
--   status anyway; finished rows with a key (expired ones until they are archived) are entries
--   no lookup reaches.
-- - queue_expiry_idx: a pending or leased message has no completed_at (only an expiry writes
--   one, with the status that ends it), and the reapers name `completed_at IS NULL`.
-- queue_processing_started_idx could say `processing_started_at IS NOT NULL` too, but the push
-- claim's ordering-key check then hashed every row in processing from a scan of the queue.
DROP INDEX courier.queue_ordering_idx;
CREATE INDEX queue_ordering_idx ON courier.queue (ordering_key, status, id) WHERE ordering_key IS NOT NULL;
DROP INDEX courier.queue_expiry_idx;
CREATE INDEX queue_expiry_idx ON courier.queue (expires_at) WHERE expires_at IS NOT NULL AND completed_at IS NULL;
