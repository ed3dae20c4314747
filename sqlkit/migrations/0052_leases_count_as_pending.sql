-- A leased pull message is counted as pending (courier._counted_status, functions/internals.sql):
-- a lease, and whatever ends one without settling it, leaves the depth counters alone, and ack
-- and receive take the message off the one count. Fold what the counters hold as processing for
-- pull topics into pending, with writers and compaction held off so that the new triggers take
-- over from exact counts. Push endpoints keep both counts.
LOCK TABLE courier.queue IN SHARE MODE;
SELECT 1 FROM courier.internal_locks WHERE name = 'compact_queue_depth' FOR UPDATE;

INSERT INTO courier.queue_depth AS d (endpoint_id, status, backend_pid, slot, messages)
SELECT c.endpoint_id, 'pending', 0, 0, sum(c.messages)
FROM courier.queue_depth c JOIN courier.endpoints e ON e.id = c.endpoint_id AND e.protocol = 'pull'
WHERE c.status = 'processing'
GROUP BY c.endpoint_id
ON CONFLICT (endpoint_id, status, backend_pid, slot) DO UPDATE SET messages = d.messages + excluded.messages;

DELETE FROM courier.queue_depth c USING courier.endpoints e
WHERE e.id = c.endpoint_id AND e.protocol = 'pull' AND c.status = 'processing';
