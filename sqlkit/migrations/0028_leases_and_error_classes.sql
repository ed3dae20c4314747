-- Issue 23, items 11 and 12.
--
-- Maintenance leadership was a session advisory lock, and any database user can take any
-- advisory key: the application role holding it stopped every maintenance job for good. It
-- is now a lease in a row that only courier_owner writes, taken and renewed through
-- try_lead_maintenance_v1() (SECURITY DEFINER) with an expiry; maintained_at says when the
-- leader last ran its jobs, for health_check(). The singleton key keeps it one row.
CREATE TABLE courier.maintenance_lease (
    singleton      boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    worker_id      text,
    backend_pid    integer,
    backend_start  timestamptz,
    expires_at     timestamptz NOT NULL DEFAULT '-infinity',
    elected_at     timestamptz,
    maintained_at  timestamptz
);
INSERT INTO courier.maintenance_lease DEFAULT VALUES;

-- The locks Courier's own jobs serialise on (archive partition creation, counter compaction),
-- as rows no other role can lock: locking a row needs UPDATE on its table.
CREATE TABLE courier.internal_locks (
    name text PRIMARY KEY
);
INSERT INTO courier.internal_locks (name) VALUES ('archive_partitions'), ('compact_queue_depth');

-- analytics_errors.error_class held the text before the first colon of each error, which for
-- a pull topic is what the application wrote (nack, receive_failed): the monitor role, which
-- reads these aggregates, read card numbers and names in it. Classes are now derived by
-- courier.error_class() from Courier's own vocabulary; the old rows go, and the next
-- analytics run writes them again.
DELETE FROM courier.analytics_errors;
