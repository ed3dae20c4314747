-- What the counters cost a send, a receive, and a transaction of many sends.
--
-- Every send wrote a WAL record to its counter: 125 of a send's 548 bytes (a row lock from
-- INSERT ... ON CONFLICT DO UPDATE, then a HOT update; pg_waldump). Depth is a function of
-- courier.queue, so the counters need not survive a crash by themselves: they become UNLOGGED,
-- which writes no WAL, and a crash (which empties unlogged tables) is repaired by counting the
-- queue once (rebuild_queue_depth(), functions/internals.sql). queue_depth_built marks the
-- counters whole; it is unlogged too, so a crash empties both at once.
ALTER TABLE courier.queue_depth SET UNLOGGED;

CREATE UNLOGGED TABLE courier.queue_depth_built (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    built_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO courier.queue_depth_built DEFAULT VALUES;  -- they were whole when this ran

-- The outcome counters behind metrics()' *_total series cost every receive(1) and small ack the
-- same 125 bytes. They are counters in Prometheus' sense, whose readers take a drop for a reset
-- (the console's rates do too): unlogged, they count from zero again after a crash, as a
-- process's own counters do after a restart. A clean shutdown keeps them.
ALTER TABLE courier.delivery_totals SET UNLOGGED;

-- A transaction of 20,000 sends took 9.5 s (pgmq's: 0.1 s): each updated its backend's one
-- counter row again, and the versions one transaction makes cannot be pruned before it ends,
-- so every update walked all the earlier ones. Each run of 64 writes in a transaction now
-- counts into a row of its own (slot), and compact_queue_depth() folds the slots back.
ALTER TABLE courier.queue_depth ADD COLUMN slot integer NOT NULL DEFAULT 0;
ALTER TABLE courier.queue_depth DROP CONSTRAINT queue_depth_pkey;
ALTER TABLE courier.queue_depth ADD PRIMARY KEY (endpoint_id, status, backend_pid, slot);

-- Backpressure read every counter row in every send (two of its 13 shared buffers, and under
-- a held xmin horizon every version of every row). The maintenance leader now writes the
-- active count here each second, and a send reads the counters only when that estimate is old
-- or the queue is past half of max_queue_size (functions/sending.sql).
ALTER TABLE courier.send_limits ADD COLUMN active_estimate bigint;
ALTER TABLE courier.send_limits ADD COLUMN estimated_at timestamptz;
