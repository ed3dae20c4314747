-- Privileges of the three roles, re-applied after every migration so that functions added
-- later are covered too. PostgreSQL grants EXECUTE to PUBLIC by default: take it back first.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA courier FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA courier FROM PUBLIC;
GRANT USAGE ON SCHEMA courier TO courier_admin, courier_application, courier_monitor;

-- Applications send (and, later, publish and consume); nothing else.
GRANT EXECUTE ON FUNCTION
    courier.send(text, jsonb),
    courier.send_with_options(text, jsonb, integer, timestamptz, text, uuid, timestamptz, text, jsonb, jsonb),
    courier.send_batch(text, jsonb[]),
    courier.send_batch_with_priority(text, jsonb[], integer),
    courier.enable_fast_mode()
TO courier_application;

-- Monitors read everything and change nothing.
GRANT SELECT ON ALL TABLES IN SCHEMA courier TO courier_monitor;
-- ... except endpoint configs, which hold credentials and signing secrets.
REVOKE SELECT ON courier.endpoints FROM courier_monitor;
GRANT SELECT (id, name, protocol, retry_policy, description, enabled, circuit_state,
              circuit_failure_count, circuit_opened_at, circuit_half_open_at, last_success_at,
              last_failure_at, last_error, created_at, updated_at)
    ON courier.endpoints TO courier_monitor;
GRANT EXECUTE ON FUNCTION
    courier.metrics(),
    courier.get_endpoint_health(text),
    courier.get_setting(text),
    courier.dlq_summary(),
    courier.get_worker_status(),
    courier.health_check(),
    courier.archive_partitions(),
    courier.count_archive_partition(text)
TO courier_monitor;

-- Admins run Courier: every table and function, including the worker primitives.
GRANT ALL ON ALL TABLES IN SCHEMA courier TO courier_admin;
GRANT ALL ON ALL SEQUENCES IN SCHEMA courier TO courier_admin;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA courier TO courier_admin;
