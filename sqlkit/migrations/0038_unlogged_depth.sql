-- The depth counters cost every send a WAL record: a send's depth write was 125 of its 548
-- bytes (a row lock and a HOT update of its backend's counter row, pg_waldump). Depth is a
-- function of courier.queue, so it need not survive a crash on its own: the counters become
-- UNLOGGED, which writes no WAL, and a crash (which empties unlogged tables) is repaired by
-- counting the queue once (rebuild_queue_depth(), functions/internals.sql). queue_depth_built
-- says the counters are whole: it is unlogged too, so a crash empties both at once.
ALTER TABLE courier.queue_depth SET UNLOGGED;

CREATE UNLOGGED TABLE courier.queue_depth_built (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    built_at  timestamptz NOT NULL DEFAULT now()
);
-- The counters were whole when this migration ran.
INSERT INTO courier.queue_depth_built DEFAULT VALUES;
