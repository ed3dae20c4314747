-- Whether a topic's messages have ever carried an ordering key. receive's ordering-key checks
-- (two subplans in its candidate statement) cost every receive(1) 53,000 instructions, 7%, to
-- ready, whether or not a message has a key. So receive takes its candidates without them while
-- this is false, and looks at what it got: a candidate with a key sets it (in receive's own
-- transaction) and the candidates are taken again with the checks, so no message of a key is
-- ever received out of turn, and the next receives check from the start. It is never cleared.
ALTER TABLE courier.endpoints ADD COLUMN ordering_keys boolean NOT NULL DEFAULT false;
-- Marked here for the topics holding keyed messages that can still be taken: one pass over
-- queue_ordering_idx, which holds exactly those (a topic missed would only look twice, once).
UPDATE courier.endpoints SET ordering_keys = true
WHERE id IN (SELECT q.endpoint_id FROM courier.queue q
             WHERE q.ordering_key IS NOT NULL AND q.status IN ('pending', 'processing'));
