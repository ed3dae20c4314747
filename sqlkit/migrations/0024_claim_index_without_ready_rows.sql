-- Every pending push message was in two indexes with the same key: queue_claim_idx
-- (endpoint_id, priority DESC, id) WHERE status = 'pending', and queue_ready_idx, the claim's
-- own index, with the same key over the pending messages that are due now and have no retry
-- time (issue 13). The claim never read the first; message search and the health check's
-- oldest pending message did. The second entry was a tenth of a send_batch(100)'s backend
-- time (636 -> 572 us of CPU per batch, perf task-clock, local PostgreSQL 15).
--
-- queue_pending_rest_idx holds only the pending messages queue_ready_idx does not: scheduled,
-- retrying, and pull messages. Together the two hold every pending message once, in the same
-- order, and the readers take the first rows of each (functions/observability.sql,
-- queries.sql's search_messages).
CREATE INDEX queue_pending_rest_idx ON courier.queue (endpoint_id, priority DESC, id)
    WHERE status = 'pending' AND (scheduled_at IS NOT NULL OR next_retry_at IS NOT NULL OR visible_at IS NOT NULL);
DROP INDEX courier.queue_claim_idx;
