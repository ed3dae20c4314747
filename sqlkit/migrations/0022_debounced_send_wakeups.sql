-- Sends wake the workers at commit, and only one committing producer per endpoint at a time
-- sends the NOTIFY (issue 13). A transaction that has NOTIFYed takes PostgreSQL's cluster-wide
-- notify lock before its commit record and holds it through the WAL flush, so producers that
-- each NOTIFYed committed one at a time: single sends topped out near 1 / fsync latency
-- (about 1,000/s here) however many producers ran, and group commit was lost.
--
-- A send asks for a wake-up by setting courier.wake_at_commit for its own INSERT; the queue's
-- depth-counter trigger then writes this backend's pending counter row, and the constraint
-- triggers below queue one event per such write (per statement, not per row: a batch of
-- 1,000 queues one), evaluated at commit by courier._wake_workers_at_commit(). The WHEN
-- clauses are evaluated as the row is written, so each statement's own request is what counts.
-- Constraint triggers cannot be CREATE OR REPLACEd, so they live here; the function's body is
-- in functions/sending.sql.
CREATE FUNCTION courier._wake_workers_at_commit() RETURNS trigger
LANGUAGE plpgsql
AS $$ BEGIN RETURN NULL; END $$;

CREATE CONSTRAINT TRIGGER queue_depth_wake_on_insert AFTER INSERT ON courier.queue_depth
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (NEW.status = 'pending' AND NEW.messages > 0
          AND current_setting('courier.wake_at_commit', true) = 'on')
    EXECUTE FUNCTION courier._wake_workers_at_commit();

CREATE CONSTRAINT TRIGGER queue_depth_wake_on_update AFTER UPDATE ON courier.queue_depth
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (NEW.status = 'pending' AND NEW.messages > OLD.messages
          AND current_setting('courier.wake_at_commit', true) = 'on')
    EXECUTE FUNCTION courier._wake_workers_at_commit();
