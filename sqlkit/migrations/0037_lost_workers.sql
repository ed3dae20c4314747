-- A worker process that was killed (kill -9, the OOM killer, a lost host) showed as alive until
-- its last heartbeat was 30 seconds old, and the health check counted it. Its database sessions
-- end with it, as recover_dead_workers_claims already knows: get_worker_status() now reports
-- whether each worker is connected (a new column, so the function is made again), and a worker
-- whose claims were recovered because its sessions ended is marked 'lost' until it heartbeats
-- again.
DROP FUNCTION IF EXISTS courier.get_worker_status();
ALTER TABLE courier.workers DROP CONSTRAINT workers_state_check;
ALTER TABLE courier.workers ADD CONSTRAINT workers_state_check
    CHECK (state IN ('running', 'draining', 'stopped', 'lost'));
