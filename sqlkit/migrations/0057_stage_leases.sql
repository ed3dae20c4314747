-- Issue 39: a pull message dequeued from the send stage is leased where it waits. Its lease is
-- written into its stage row (a HOT update of a narrow row with only a primary key), not into a
-- new row of courier.queue with three index entries: a dequeue(10) + ack of staged messages wrote
-- 569 bytes of WAL a message, against pgmq's read + delete at about 400. An ack deletes the row
-- from the stage; the maintenance leader moves every row, leased ones with their lease, into
-- the queue each second, so a lease outlives its stage row by at most that second and every
-- other verb finds it in the queue (functions/sending.sql, _take_staged and _move_stage_rows).
-- NULL on every staged send: the two columns fit the row's null bitmap, and cost a send nothing.
ALTER TABLE courier.send_stage ADD COLUMN lease integer, ADD COLUMN visible_until timestamptz;
-- Room on each page for the leased version of every row beside it: a lease that found its page
-- full would write the whole row on another page, and an index entry for it.
ALTER TABLE courier.send_stage SET (fillfactor = 50);
ALTER TABLE courier.send_stage_batch SET (fillfactor = 50);
