-- The priority levels an endpoint's messages have used, as a bit per level (bit p for priority
-- p; bit 0 always). Dequeue, receive, peek and the push claim of due messages walk their index one
-- level at a time, highest first: eleven descents for a topic whose messages are all priority 0,
-- 33 of receive(1)'s 54 shared buffers. They now walk only the levels set here. A send that
-- brings a level for the first time sets its bit (_count_queue_insert, functions/internals.sql),
-- in its own transaction, so the level is marked before its messages can be seen; a bit is never
-- cleared.
ALTER TABLE courier.endpoints ADD COLUMN priorities integer NOT NULL DEFAULT 1;
UPDATE courier.endpoints e
SET priorities = 1 | coalesce((SELECT bit_or(1 << q.priority) FROM courier.queue q WHERE q.endpoint_id = e.id), 0)
WHERE EXISTS (SELECT FROM courier.queue q WHERE q.endpoint_id = e.id AND q.priority <> 0);
