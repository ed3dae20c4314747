-- endpoints.ordering_keys (migration 0048) becomes a rule for dequeue, not only a hint for
-- receive: every write that brings a keyed message marks its endpoint in its own transaction
-- (_note_ordering_keys: the insert trigger, and _send_one, which counts its own insert), and
-- dequeue on an unmarked topic takes only messages without a key, without the ordering-key
-- checks (a subplan PostgreSQL readies in every execution: 52,000 instructions of a
-- dequeue(1) + ack). Until now only receive marked pull topics, so endpoints that got keyed
-- messages since 0048 are marked here, as 0048 marked them then.
UPDATE courier.endpoints SET ordering_keys = true
WHERE NOT ordering_keys
  AND id IN (SELECT q.endpoint_id FROM courier.queue q
             WHERE q.ordering_key IS NOT NULL AND q.status IN ('pending', 'processing'));
