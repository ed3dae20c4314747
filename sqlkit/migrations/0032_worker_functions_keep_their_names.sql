-- Issue 24: worker functions lose their version suffixes. Since the function files (repeatable,
-- re-applied when they change) a function keeps its name and only Courier's worker pool calls
-- these, which changes with them; the public SQL API keeps its names. The suffixed versions go,
-- and the function files create them under their plain names. Stop the workers of the previous
-- release before `courier migrate`: they call the old names.
DROP FUNCTION IF EXISTS courier.claim_batch_v3(p_worker_id text, p_batch_size integer, p_endpoint_id integer);
DROP FUNCTION IF EXISTS courier.register_worker_session_v1(p_worker_id text, p_incarnation text);
DROP FUNCTION IF EXISTS courier.release_batch_v2(p_ids bigint[], p_leases integer[], p_delay_seconds integer);
DROP FUNCTION IF EXISTS courier.renew_leases_v1(p_ids bigint[], p_leases integer[]);
DROP FUNCTION IF EXISTS courier.report_and_claim_v1(p_worker_id text, p_batch_size integer, p_endpoint_id integer,
                                                    p_ids bigint[], p_leases integer[], p_outcomes text[],
                                                    p_errors text[], p_retry_after integer[], p_responses jsonb[]);
DROP FUNCTION IF EXISTS courier.report_outcomes_v2(p_ids bigint[], p_leases integer[], p_outcomes text[],
                                                   p_errors text[], p_retry_after integer[], p_responses jsonb[]);
DROP FUNCTION IF EXISTS courier.sends_committing_v1(p_endpoint_id integer);
DROP FUNCTION IF EXISTS courier.try_lead_maintenance_v1(p_worker_id text);
DROP FUNCTION IF EXISTS courier.worker_heartbeat_v1(p_worker_id text, p_hostname text, p_pid integer,
                                                    p_concurrency integer, p_in_flight integer, p_delivered bigint,
                                                    p_failed bigint, p_state text);
