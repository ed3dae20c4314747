-- Due messages come from indexes that hold only what a claim can take (issue 10, item 18).
-- queue_claim_idx holds every pending row, so a claim behind 200k messages scheduled for
-- later read and filtered all 200k of them (51 ms, "Rows Removed by Filter: 200000").
-- Pending rows with no time attached are served in claim order by queue_ready_idx; rows
-- with a scheduled or retry time by queue_due_idx, a range scan up to now() on their due
-- time, so rows not yet due are never read. queue_claim_idx stays for the depth queries.
CREATE INDEX queue_ready_idx ON courier.queue (endpoint_id, priority DESC, id)
    WHERE status = 'pending' AND scheduled_at IS NULL AND next_retry_at IS NULL;
CREATE INDEX queue_due_idx ON courier.queue (endpoint_id, (greatest(scheduled_at, next_retry_at)))
    WHERE status = 'pending' AND (scheduled_at IS NOT NULL OR next_retry_at IS NOT NULL);

-- Table upkeep (issue 13): every delivery inserts, updates and deletes a queue row. By
-- default autovacuum waits for 20% of the table's rows to die, which behind a backlog of
-- millions is millions of dead rows; vacuum after a fixed number instead, unthrottled. Under
-- sustained churn with a small backlog (`courier bench churn`) the bound is set by the
-- server's autovacuum_naptime, not by these settings: see the issue 13 report.
-- The counter tables are rewritten on every report and get the same treatment.
ALTER TABLE courier.queue SET (
    autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = 10000,
    autovacuum_analyze_scale_factor = 0, autovacuum_analyze_threshold = 50000,
    autovacuum_vacuum_cost_delay = 0);
ALTER TABLE courier.queue_depth SET (
    autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0);
ALTER TABLE courier.delivery_totals SET (
    autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0);
