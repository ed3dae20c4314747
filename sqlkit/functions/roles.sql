-- Ownership and privileges, applied last by every `courier migrate` that changes anything, in
-- the same transaction, so that no function or table is ever visible with other rights.
--
-- Every object of schema courier belongs to courier_owner (a NOLOGIN role with no special
-- attributes, made by the baseline migration), so SECURITY DEFINER functions run with its rights and
-- never a superuser's. The three roles get what SPEC.md gives them and nothing else: no
-- TRIGGER, TRUNCATE or REFERENCES for anyone, nothing for PUBLIC, and for the monitor no
-- column that holds a payload, headers, metadata, a secret, an error text or a captured body.
DO $$
DECLARE
    v_owner pg_roles;
    v_object record;
BEGIN
    SELECT * INTO v_owner FROM pg_roles WHERE rolname = 'courier_owner';
    IF v_owner.rolsuper OR v_owner.rolcreaterole OR v_owner.rolcreatedb OR v_owner.rolbypassrls
       OR v_owner.rolreplication OR v_owner.rolcanlogin THEN
        RAISE EXCEPTION '[courier] role courier_owner has attributes it must not have'
            USING ERRCODE = '42501', HINT = 'ALTER ROLE courier_owner NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE '
                                            'NOREPLICATION NOBYPASSRLS';
    END IF;
    IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
       AND NOT pg_has_role(current_user, 'courier_owner', 'MEMBER') THEN
        EXECUTE format('GRANT courier_owner TO %I', current_user);  -- to hand objects over
    END IF;
    IF (SELECT nspowner FROM pg_namespace WHERE nspname = 'courier') <> v_owner.oid THEN
        ALTER SCHEMA courier OWNER TO courier_owner;
    END IF;
    FOR v_object IN
        SELECT c.oid::regclass AS name,
               CASE c.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW'
                              ELSE 'TABLE' END AS kind
        FROM pg_class c
        WHERE c.relnamespace = 'courier'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
          AND c.relowner <> v_owner.oid
          -- identity and serial sequences follow their table
          AND NOT (c.relkind = 'S' AND EXISTS (SELECT 1 FROM pg_depend d
                                               WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                                                 AND d.deptype IN ('a', 'i')))
    LOOP
        EXECUTE format('ALTER %s %s OWNER TO courier_owner', v_object.kind, v_object.name);
    END LOOP;
    FOR v_object IN
        SELECT p.oid::regprocedure AS name, CASE p.prokind WHEN 'p' THEN 'PROCEDURE' ELSE 'FUNCTION' END AS kind
        FROM pg_proc p WHERE p.pronamespace = 'courier'::regnamespace AND p.proowner <> v_owner.oid
    LOOP
        EXECUTE format('ALTER %s %s OWNER TO courier_owner', v_object.kind, v_object.name);
    END LOOP;
    FOR v_object IN
        SELECT t.oid::regtype AS name FROM pg_type t JOIN pg_class c ON c.oid = t.typrelid
        WHERE t.typnamespace = 'courier'::regnamespace AND c.relkind = 'c' AND t.typowner <> v_owner.oid
    LOOP
        EXECUTE format('ALTER TYPE %s OWNER TO courier_owner', v_object.name);
    END LOOP;
END
$$;

-- What later objects get when they are created: archive partitions made by
-- maintain_archive_partitions(), and anything a later migration adds.
ALTER DEFAULT PRIVILEGES FOR ROLE courier_owner REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;
ALTER DEFAULT PRIVILEGES FOR ROLE courier_owner IN SCHEMA courier
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO courier_admin;
ALTER DEFAULT PRIVILEGES FOR ROLE courier_owner IN SCHEMA courier GRANT USAGE, SELECT ON SEQUENCES TO courier_admin;
ALTER DEFAULT PRIVILEGES FOR ROLE courier_owner IN SCHEMA courier GRANT EXECUTE ON FUNCTIONS TO courier_admin;

-- Start from nothing, then grant.
REVOKE ALL ON SCHEMA courier FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA courier FROM PUBLIC, courier_admin, courier_application, courier_monitor;
-- ALL FUNCTIONS leaves procedures out (courier.dequeue_wait), and a new one is PUBLIC's to call.
REVOKE ALL ON ALL PROCEDURES IN SCHEMA courier FROM PUBLIC, courier_admin, courier_application, courier_monitor;
REVOKE ALL ON ALL TABLES IN SCHEMA courier FROM PUBLIC, courier_admin, courier_application, courier_monitor;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA courier FROM PUBLIC, courier_admin, courier_application, courier_monitor;
GRANT USAGE ON SCHEMA courier TO courier_admin, courier_application, courier_monitor;

-- Applications send (and, later, publish and consume); nothing else.
GRANT EXECUTE ON FUNCTION
    courier.send(text, jsonb),
    courier.send_with_options(text, jsonb, integer, timestamptz, text, uuid, timestamptz, text, jsonb, jsonb, integer,
                              boolean, integer),
    courier.send_batch(text, jsonb[]),
    courier.send_batch_with_priority(text, jsonb[], integer),
    courier.send_batch_with_options(text, jsonb[], integer[], timestamptz[], text[], uuid[], timestamptz[], text[],
                                    jsonb[], jsonb[], integer[]),
    courier.enable_fast_mode(),
    courier.publish(text, jsonb, text, uuid),
    courier.publish_batch(text, jsonb[]),
    courier.enqueue(text, jsonb, text, jsonb, bytea, text, timestamptz, integer, integer),
    courier.enqueue_batch(text, jsonb[], bytea[], jsonb[], timestamptz[], integer[], integer[]),
    courier.dequeue(text, integer, integer),
    courier.ack(bigint[], integer[]),
    courier.ack(bigint, integer),
    courier.nack(bigint[], integer[], text, integer, boolean),
    courier.nack(bigint, integer, text, integer, boolean),
    courier.snooze(bigint[], integer[], integer),
    courier.snooze(bigint, integer, integer),
    courier.extend_lease(bigint[], integer[], integer),
    courier.settle_in_topics(text, bigint[], integer[], text[], text, integer, integer),
    courier.release(bigint[], integer[]),
    courier.receive(text, integer),
    courier.lock_received(text, bigint),
    courier.receive_failed(text, bigint, text),
    courier.peek(text),
    courier.topic_id(text),
    courier.topic_sends_committing(text)
TO courier_application;
-- The long poll for clients that speak only SQL (pgmq's read_with_poll): dequeue, waiting.
GRANT EXECUTE ON PROCEDURE courier.dequeue_wait(text, integer, integer, integer, jsonb) TO courier_application;
-- A producer may take back what it sent (River's JobCancel, issue 42): by the id its send
-- returned or by its idempotency key. Purge and delete stay with the admin.
GRANT EXECUTE ON FUNCTION
    courier.cancel_message(bigint, text),
    courier.cancel_message_by_key(text, text, text)
TO courier_application;

-- Monitors see counts, states and health: the counter tables whole, and of the tables that
-- hold messages, endpoints and events only the columns that say where things stand.
GRANT SELECT ON courier.settings, courier.send_limits, courier.consume_limits, courier.queue_depth, courier.delivery_totals, courier.dlq_depth,
                courier.workers, courier.replays, courier.schema_migrations, courier.schema_functions,
                courier.reaper_runs
    TO courier_monitor;
GRANT SELECT (id, endpoint_id, status, priority, retry_count, max_retries, next_retry_at, scheduled_at,
              expires_at, worker_id, processing_started_at, completed_at, created_at, updated_at, lease,
              visible_at)
    ON courier.queue TO courier_monitor;
GRANT SELECT (id, original_message_id, endpoint_id, endpoint_name, priority, retry_count, status,
              scheduled_at, expires_at, original_created_at, failed_at, redriven_at, redriven_message_id,
              original_topic, dlq_moved_at)
    ON courier.dlq TO courier_monitor;
GRANT SELECT (id, endpoint_id, status, priority, retry_count, max_retries, scheduled_at, expires_at,
              worker_id, completed_at, created_at, archived_at)
    ON courier.archive TO courier_monitor;
GRANT SELECT (id, event_type, endpoint_id, actor, created_at) ON courier.event_log TO courier_monitor;
GRANT SELECT (id, name, description, created_at) ON courier.event_types TO courier_monitor;
GRANT SELECT (id, event_type_id, endpoint_id, created_at) ON courier.subscriptions TO courier_monitor;
GRANT SELECT (id, name, topics, endpoints, actions, created_at, last_used_at, revoked_at)
    ON courier.api_tokens TO courier_monitor;
-- The Spark pipeline's results are aggregates: counts, latencies and error classes per hour.
DO $$
DECLARE
    v_table regclass;
BEGIN
    FOR v_table IN SELECT c.oid::regclass FROM pg_class c
                   WHERE c.relnamespace = 'courier'::regnamespace AND c.relkind IN ('r', 'p')
                     AND c.relname LIKE 'analytics\_%' LOOP
        EXECUTE format('GRANT SELECT ON %s TO courier_monitor', v_table);
    END LOOP;
END
$$;
GRANT SELECT (id, name, protocol, retry_policy, description, enabled, circuit_state,
              circuit_failure_count, circuit_opened_at, circuit_half_open_at, last_success_at,
              last_failure_at, created_at, updated_at, paused_at)
    ON courier.endpoints TO courier_monitor;
GRANT EXECUTE ON FUNCTION
    courier.metrics(),
    courier.get_endpoint_health(text),
    courier.get_setting(text),
    courier.dlq_summary(),
    courier.get_worker_status(),
    courier.worker_protocols(),
    courier.health_check(),
    courier.archive_partitions(),
    courier.count_archive_partition(text),
    courier.peek(text),
    courier.topics()
TO courier_monitor;
-- What the maintenance leader sampled: counts and rates over time, no message in them.
GRANT SELECT ON courier.metric_samples TO courier_monitor;
-- Schedules as list_schedules() shows them: names, times and states, no payload (issue 42).
GRANT EXECUTE ON FUNCTION courier.list_schedules() TO courier_monitor;
GRANT EXECUTE ON FUNCTION courier.metric_history(timestamptz, timestamptz, boolean) TO courier_monitor;

-- Admins run Courier: every function, including the worker primitives, and the rows of every
-- table, but no DDL-like rights (TRIGGER, TRUNCATE, REFERENCES) on them.
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA courier TO courier_admin;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA courier TO courier_admin;
GRANT EXECUTE ON ALL ROUTINES IN SCHEMA courier TO courier_admin;  -- functions and procedures
-- courier.send_limits and consume_limits are courier.settings as the sends and the consumers
-- read it, written only by its trigger:
-- an admin changes settings, never that copy of them.
REVOKE INSERT, UPDATE, DELETE ON courier.send_limits, courier.consume_limits FROM courier_admin;
-- The database's identity is read by workers (every broker and webhook dedup id carries it)
-- and never changed: a changed identity would let a redelivery through as a new message.
REVOKE INSERT, UPDATE, DELETE ON courier.database_identity FROM courier_admin;
-- The maintenance lease is taken and renewed only through try_lead_maintenance(): an admin
-- session that could lock or write its row could stop maintenance as the advisory lock let
-- anyone do (issue 23).
REVOKE INSERT, UPDATE, DELETE ON courier.maintenance_lease FROM courier_admin;
