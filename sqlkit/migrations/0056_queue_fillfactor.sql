-- Issue 39: a batch lease or claim rewrites every row it takes (status, lease, visible_at), and a
-- page at fillfactor 70 (about 25 messages, room for 11 new versions) could not hold them: a
-- dequeue(100) wrote 57 of its 100 new versions on another page, each as a whole tuple (180 bytes
-- of WAL, against 131 for one the same page holds, whose record carries only what changed) and
-- with a LOCK record of its own (54 bytes) for the old one while the new page was found. At 50,
-- every row taken from a page has room beside it: dequeue(100) + ack from 529 to 481 bytes of WAL
-- a message in `courier bench cost` (pgmq's read(100) + delete: 438). The queue holds messages in
-- flight, not history, so the 40% more pages cost little; applies to pages filled from now on.
ALTER TABLE courier.queue SET (fillfactor = 50);
