-- Fenced claims. Every claim of a message takes a new lease number, returned with the claim;
-- reports, releases and renewals name the lease they hold, and one whose lease is no longer
-- the message's (its claim went stale, was recovered and handed to another worker) changes
-- nothing. The counter is not indexed, so a claim stays a HOT update.
ALTER TABLE courier.queue ADD COLUMN lease integer NOT NULL DEFAULT 0;

-- The unfenced worker primitives go: claim_batch_v1 also bypassed the circuit breaker and the
-- rate limit, and complete_batch_v1/fail_batch_v1 the retry policy and the DLQ. Workers of
-- this release call claim_batch_v3, report_outcomes_v2, release_batch_v2 and renew_leases_v1
-- (sqlkit/functions/claiming.sql and delivery.sql); a worker of an older release gets a clear
-- "function does not exist" instead of unfenced writes.
DROP FUNCTION courier.claim_batch_v2(text, integer, integer);
DROP FUNCTION courier.claim_batch_v1(text, integer, integer);
DROP FUNCTION courier.complete_batch_v1(bigint[]);
DROP FUNCTION courier.fail_batch_v1(bigint[], text[], timestamptz[]);
DROP FUNCTION courier.report_outcomes_v1(bigint[], text[], text[], integer[], jsonb[]);
DROP FUNCTION courier.release_batch_v1(bigint[], integer);

ALTER TYPE courier.claimed_message ADD ATTRIBUTE lease integer;
