-- Issue 39: what a send costs the database. PostgreSQL 15 parses a table's CHECK expressions
-- from their stored text in every statement that writes it (ExecConstraints, stringToNode), so
-- the two checks on courier.queue cost each single send about 7 us of the backend's CPU, a
-- tenth of what its insert costs on top of pgmq's (a loop of 3,000 sends: 78 -> 71 us each).
-- Both values are checked where they enter: priority by every send (_check_priority and the
-- batch's validation, with an error naming the field; smallint bounds the rest), status by
-- nothing but Courier's own functions, the only writers of courier.queue.
ALTER TABLE courier.queue DROP CONSTRAINT IF EXISTS queue_status_check,
                          DROP CONSTRAINT IF EXISTS queue_priority_check;

-- What a counting trigger reads from its transition tables in one pass (functions/internals.sql):
-- whether every row is of one endpoint and one status, which is what almost every write is.
CREATE TYPE courier.queue_depth_change AS (
    first_endpoint integer,
    last_endpoint  integer,
    first_status   text,
    last_status    text,
    rows           bigint
);

-- Every write to courier.queue opens each of its indexes and compiles each partial index's
-- predicate, whether or not the row enters it. The expiry reaper's two indexes (pending
-- messages, and pull messages expiring under a lease) become one: each of its two queries
-- names its status, and steps over the few expired rows of the other.
DROP INDEX courier.queue_expiry_idx;
DROP INDEX courier.queue_processing_expiry_idx;
CREATE INDEX queue_expiry_idx ON courier.queue (expires_at)
    WHERE expires_at IS NOT NULL AND status IN ('pending', 'processing');
