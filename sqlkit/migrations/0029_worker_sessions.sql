-- Issue 23: a killed worker's claims are recovered within seconds, not after the
-- stale-recovery timeout. Each worker process (an incarnation: a fixed --worker-id restarted
-- by a supervisor is a new one) registers every database session it works through; once none
-- of an incarnation's sessions is left in pg_stat_activity the process is gone, and the
-- maintenance leader hands its claims back (recover_dead_workers_claims, functions/claiming.sql).
CREATE TABLE courier.worker_sessions (
    worker_id     text NOT NULL,
    incarnation   text NOT NULL,
    backend_pid   integer NOT NULL,
    role_oid      oid NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT now(),
    lost_at       timestamptz,  -- when the leader first found the incarnation without a live session
    PRIMARY KEY (worker_id, incarnation, backend_pid)
);
