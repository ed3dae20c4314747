-- Issue 39: send_batch stages too (functions/sending.sql, _send_batch). The stage's commit-time
-- wake-up is a deferred row trigger (send_stage_wake), and PostgreSQL queues and fires a deferred
-- row trigger for every row: about 8,500 instructions a message of a batch of 100, a fifth of
-- the batch's cost, for one wake-up. So a staged batch puts its first message in
-- courier.send_stage, whose trigger wakes the endpoint at commit as a single send's does, and the
-- rest in this child table, which inherits the stage's columns and defaults (ids from the queue's
-- sequence) but not its trigger. Every reader of courier.send_stage (the claim, the mover, the
-- lookups by id and the counts) reads both; the writers name each table (the movers delete from
-- each by ctid, which is unique only within one table).
--
-- A staged message that no claim takes is written twice (the stage, then the queue by the
-- leader's move), where a batch sent to the queue is written once. So a batch stages only while
-- claims are taking the stage, which a batch reads from the stage's oldest message: staged less
-- than 100 ms ago (or none). An endpoint's worker behind its producers leaves it older, and
-- batches go to the queue. Single sends stage regardless: a statement's fixed cost, which the
-- stage saves, is most of theirs.
CREATE TABLE courier.send_stage_batch (PRIMARY KEY (id)) INHERITS (courier.send_stage);

