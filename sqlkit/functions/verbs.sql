-- The verbs users of other queues expect (issue 42): cancel a message (River's JobCancel,
-- graphile-worker's remove_job), purge an endpoint's pending messages or its DLQ (pgmq's
-- purge_queue, SQS PurgeQueue), and delete a message by id without a lease (pgmq's delete).
-- None of them is on the send, claim or report path, and those paths carry nothing for them:
-- a cancel is fenced by the lease check every report, release, renewal and ack already makes.
--
-- Each records who did it in the event log: the actor column is the session's login role, as
-- for every event, and p_actor (optional) says on whose behalf, for callers that share a role
-- (`courier serve` passes http:TOKEN-NAME, the CLI cli:OS-USER).

-- A queued message's state as a person asks about it: pending split into scheduled (its time
-- has not come) and retrying (waiting out a backoff).
CREATE OR REPLACE FUNCTION courier._message_state(p_message courier.queue) RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT CASE
        WHEN p_message.status <> 'pending' THEN p_message.status
        WHEN p_message.next_retry_at > now() THEN 'retrying'
        WHEN p_message.scheduled_at > now() OR p_message.visible_at > now() THEN 'scheduled'
        ELSE 'pending' END
$$;

-- The endpoint a verb names, by name (field p_field): a push endpoint or a pull topic, or with
-- a name ending in .dlq (reserved: no endpoint has one), a topic's or endpoint's dead letters.
-- Held FOR KEY SHARE to commit, so a drop_endpoint meanwhile waits and then sees what is left.
CREATE OR REPLACE FUNCTION courier._verb_endpoint(p_name text, p_field text, OUT endpoint courier.endpoints,
                                                  OUT dead_letters boolean)
LANGUAGE plpgsql
AS $$
BEGIN
    IF p_name IS NULL OR p_name = '' THEN
        RAISE EXCEPTION '[courier] %: give the name of an endpoint or topic', p_field
            USING ERRCODE = '22023', COLUMN = p_field;
    END IF;
    SELECT * INTO endpoint FROM courier.endpoints e WHERE e.name = p_name FOR KEY SHARE;
    dead_letters := false;
    IF NOT FOUND AND p_name LIKE '%.dlq' THEN
        SELECT * INTO endpoint FROM courier.endpoints e WHERE e.name = left(p_name, -4) FOR KEY SHARE;
        dead_letters := FOUND;
    END IF;
    IF endpoint.id IS NULL THEN
        RAISE EXCEPTION '[courier] %: endpoint "%" does not exist', p_field, p_name
            USING ERRCODE = 'P0002', COLUMN = p_field,
                  HINT = 'List endpoints with `courier endpoint list` (SELECT name FROM courier.endpoints)';
    END IF;
END
$$;

-- Why message p_id cannot be cancelled or deleted now that it is not in the queue as pending
-- (or processing, for a cancel): it finished (the archive says how), or it never existed.
CREATE OR REPLACE FUNCTION courier._refuse_unqueued(p_id bigint, p_verb text, p_queued_status text) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_archived text;
BEGIN
    IF p_queued_status IS NOT NULL THEN  -- finished, waiting in the queue for the archiver
        RAISE EXCEPTION '[courier] id: cannot % message %: it already finished as %', p_verb, p_id, p_queued_status
            USING ERRCODE = '55000', COLUMN = 'id',
                  HINT = 'Only a message still queued can be; a finished one moves to the archive';
    END IF;
    SELECT a.status INTO v_archived FROM courier.archive a WHERE a.id = p_id LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION '[courier] id: cannot % message %: it already finished and is in the archive as %',
                p_verb, p_id, v_archived
            USING ERRCODE = '55000', COLUMN = 'id',
                  HINT = CASE WHEN v_archived = 'failed'
                              THEN 'A dead-lettered message''s DLQ entry goes with `courier purge ENDPOINT --dlq`'
                              ELSE 'Archived messages leave with their partition (archive retention)' END;
    END IF;
    RAISE EXCEPTION '[courier] id: message % does not exist', p_id
        USING ERRCODE = 'P0002', COLUMN = 'id',
              HINT = 'A message''s id is the one its send or enqueue returned';
END
$$;

-- Cancel ----------------------------------------------------------------------------------

-- Moves one locked message, pending or processing, to the archive as cancelled and logs it;
-- returns its state before. A message in processing leaves the queue with its lease: its
-- holder's report (report_outcomes, report_and_claim), release or renewal then finds no row
-- under that lease and is a no-op counted as stale (report.stale_lease), and a pull consumer's
-- ack or nack answers not_found. Nothing can deliver it again: no row is left to recover.
CREATE OR REPLACE FUNCTION courier._cancel(p_message courier.queue, p_actor text) RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    v_state text := courier._message_state(p_message);
BEGIN
    IF courier._cancelled_in_flight(p_message) THEN
        RETURN 'cancelled';  -- cancelled before, its delivery still under way
    END IF;
    IF p_message.status = 'processing' AND p_message.visible_at IS NULL AND p_message.ordering_key IS NOT NULL THEN
        -- Its delivery is under way: the next message of its ordering key must not start
        -- before it ends, so the row stays in processing, holding the key, under lease -1 (a
        -- claim's lease is positive, and a row never claimed has 0): the worker's report,
        -- release or renewal no longer matches it,
        -- and whichever of those comes first deletes it (_count_stale_reports), as stale or
        -- dead-worker recovery does if none comes. The archive has it as cancelled from now.
        PERFORM courier._archive_copy(p_message, 'cancelled');
        UPDATE courier.queue SET lease = -1, expires_at = NULL, updated_at = now() WHERE id = p_message.id;
    ELSE
        PERFORM courier._archive_messages(ARRAY[p_message.id], ARRAY['pending', 'processing'], 'cancelled');
    END IF;
    PERFORM courier._log_event('message.cancelled', p_message.endpoint_id, jsonb_strip_nulls(jsonb_build_object(
        'message_id', p_message.id, 'was', v_state, 'by', p_actor,
        'worker_id', CASE WHEN p_message.status = 'processing' THEN p_message.worker_id END)));
    RETURN v_state;
END
$$;

-- A message still in the send stage (migration 0054) moved into the queue, with the rest of the
-- stage, so that a verb that finds a message by id finds it there.
CREATE OR REPLACE FUNCTION courier._unstage_message(p_id bigint) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    IF EXISTS (SELECT FROM courier.send_stage s WHERE s.id = p_id) THEN
        PERFORM courier._unstage();
    END IF;
END
$$;

-- Whether the message was cancelled while its delivery was under way and holds its ordering
-- key until that delivery ends (_cancel): in processing under lease -1, which no claim gives.
CREATE OR REPLACE FUNCTION courier._cancelled_in_flight(p_message courier.queue) RETURNS boolean
LANGUAGE sql IMMUTABLE
AS $$ SELECT p_message.status = 'processing' AND p_message.lease = -1 $$;

-- The archive's row for a message that stays in the queue a while longer (_cancel).
CREATE OR REPLACE FUNCTION courier._archive_copy(m courier.queue, p_status text) RETURNS void
LANGUAGE sql
AS $$
    INSERT INTO courier.archive (id, endpoint_id, payload, headers, metadata, status, priority, retry_count,
                                 max_retries, scheduled_at, expires_at, idempotency_key, correlation_id,
                                 ordering_key, last_error, error_history, worker_id, response, completed_at,
                                 created_at, key, payload_binary, body)
    VALUES (m.id, m.endpoint_id, m.payload, m.headers, m.metadata, p_status, m.priority, m.retry_count,
            m.max_retries, m.scheduled_at, m.expires_at, m.idempotency_key, m.correlation_id, m.ordering_key,
            m.last_error, m.error_history, m.worker_id, m.response, now(), m.created_at, m.key, m.payload_binary,
            m.body)
$$;

CREATE OR REPLACE FUNCTION courier._endpoint_name(p_endpoint_id integer) RETURNS text
LANGUAGE sql STABLE
AS $$ SELECT coalesce((SELECT e.name FROM courier.endpoints e WHERE e.id = p_endpoint_id), '#' || p_endpoint_id) $$;

-- Cancels message p_id while it is pending, scheduled, retrying or in processing: it leaves
-- the queue at once, for the archive as cancelled (an in-flight delivery cannot be called back,
-- but its outcome is discarded and it is never retried). Returns the message's id, endpoint and
-- state before (`was`). Cancelling a cancelled message again changes nothing and returns `was`
-- cancelled; a message that finished otherwise is refused (55000), an unknown id is P0002.
CREATE OR REPLACE FUNCTION courier.cancel_message(p_id bigint, p_actor text DEFAULT NULL)
RETURNS TABLE (id bigint, endpoint_name text, was text)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_message courier.queue;
    v_endpoint_id integer;
BEGIN
    IF p_id IS NULL THEN
        RAISE EXCEPTION '[courier] id: give the id of the message to cancel' USING ERRCODE = '22023', COLUMN = 'id';
    END IF;
    PERFORM courier._unstage_message(p_id);
    SELECT * INTO v_message FROM courier.queue q WHERE q.id = p_id FOR UPDATE;
    IF FOUND AND v_message.status IN ('pending', 'processing') THEN
        was := courier._cancel(v_message, p_actor);
        id := p_id;
        endpoint_name := courier._endpoint_name(v_message.endpoint_id);
        RETURN NEXT;
        RETURN;
    END IF;
    IF v_message.id IS NULL THEN
        SELECT a.endpoint_id INTO v_endpoint_id FROM courier.archive a WHERE a.id = p_id AND a.status = 'cancelled';
        IF FOUND THEN
            RETURN QUERY SELECT p_id, courier._endpoint_name(v_endpoint_id), 'cancelled'::text;
            RETURN;
        END IF;
    END IF;
    PERFORM courier._refuse_unqueued(p_id, 'cancel', v_message.status);
END
$$;

-- Cancels the active (pending or processing) message of endpoint or topic p_endpoint_name whose
-- idempotency key or pull key is p_key, as cancel_message() does; one row per message cancelled
-- (a topic's message may hold the key as either: both are cancelled). None is P0002.
CREATE OR REPLACE FUNCTION courier.cancel_message_by_key(p_endpoint_name text, p_key text, p_actor text DEFAULT NULL)
RETURNS TABLE (id bigint, endpoint_name text, was text)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_found record := courier._verb_endpoint(p_endpoint_name, 'endpoint');
    v_endpoint courier.endpoints := v_found.endpoint;
    v_ids bigint[];
    v_message courier.queue;
BEGIN
    IF v_found.dead_letters THEN
        RAISE EXCEPTION '[courier] endpoint: "%" names a DLQ, whose entries are not queued messages', p_endpoint_name
            USING ERRCODE = '22023', COLUMN = 'endpoint',
                  HINT = 'Delete them with `courier purge ENDPOINT --dlq`, or redrive them';
    END IF;
    IF p_key IS NULL OR p_key = '' THEN
        RAISE EXCEPTION '[courier] key: give the idempotency key or pull key of the message to cancel'
            USING ERRCODE = '22023', COLUMN = 'key';
    END IF;
    -- Each from its own unique index of active keys.
    v_ids := ARRAY(SELECT q.id FROM courier.queue q
                   WHERE q.endpoint_id = v_endpoint.id AND q.idempotency_key = p_key
                     AND q.status IN ('pending', 'processing')
                   UNION
                   SELECT q.id FROM courier.queue q
                   WHERE q.endpoint_id = v_endpoint.id AND q.key = p_key AND q.status IN ('pending', 'processing'));
    FOR v_message IN
        SELECT * FROM courier.queue q WHERE q.id = ANY (v_ids) ORDER BY q.id FOR UPDATE
    LOOP
        CONTINUE WHEN v_message.status NOT IN ('pending', 'processing');  -- finished while we waited
        id := v_message.id;
        endpoint_name := v_endpoint.name;
        was := courier._cancel(v_message, p_actor);
        RETURN NEXT;
    END LOOP;
    IF NOT FOUND OR id IS NULL THEN
        RAISE EXCEPTION '[courier] key: no pending or processing message of "%" has key "%"', v_endpoint.name, p_key
            USING ERRCODE = 'P0002', COLUMN = 'key',
                  HINT = 'The key is matched with idempotency keys and pull keys; a message that already finished '
                         '(delivered, dead-lettered, expired or cancelled) cannot be cancelled';
    END IF;
END
$$;

-- Purge -----------------------------------------------------------------------------------

-- How many messages purge_queue() would take now: the endpoint's pending messages, or its DLQ's
-- failed entries (p_dlq, or a name ending in .dlq), from the maintained counters (no count(*)).
CREATE OR REPLACE FUNCTION courier.purge_queue_count(p_endpoint_name text, p_dlq boolean DEFAULT false)
RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_endpoint courier.endpoints;
    v_dead_letters boolean;
BEGIN
    SELECT * INTO v_endpoint FROM courier.endpoints e WHERE e.name = p_endpoint_name;
    v_dead_letters := coalesce(p_dlq, false);
    IF NOT FOUND AND p_endpoint_name LIKE '%.dlq' THEN
        SELECT * INTO v_endpoint FROM courier.endpoints e WHERE e.name = left(p_endpoint_name, -4);
        v_dead_letters := FOUND;
    END IF;
    IF v_endpoint.id IS NULL THEN
        RAISE EXCEPTION '[courier] endpoint: endpoint "%" does not exist', p_endpoint_name
            USING ERRCODE = 'P0002', COLUMN = 'endpoint',
                  HINT = 'List endpoints with `courier endpoint list` (SELECT name FROM courier.endpoints)';
    END IF;
    IF v_dead_letters THEN
        RETURN coalesce((SELECT sum(d.messages) FROM courier.dlq_depth d
                         WHERE d.endpoint_id = v_endpoint.id AND d.status = 'failed'), 0);
    END IF;
    RETURN coalesce((SELECT sum(d.messages) FROM courier.queue_depth d
                     WHERE d.endpoint_id = v_endpoint.id AND d.status = 'pending'), 0)
           - CASE WHEN v_endpoint.protocol = 'pull' THEN courier._leased_count(v_endpoint.id) ELSE 0 END  -- _counted_status
           + (SELECT count(*) FROM courier.send_stage s WHERE s.endpoint_id = v_endpoint.id);  -- staged sends
END
$$;

-- Removes every pending message of endpoint or topic p_endpoint_name (scheduled and retrying
-- ones too) in one statement, and returns how many: to the archive as purged, or with
-- p_archive false dropped outright. Messages in processing are never touched (a claim that
-- takes a message while this runs wins it; a pull message whose lease ran out stays in
-- processing until it is dequeued again), nor finished ones waiting for the archiver.
-- With p_dlq (or a name ending in .dlq), the endpoint's failed DLQ entries are deleted instead
-- (redriven ones stay, as the audit trail cleanup_dlq ages out): every dead-lettered message is
-- in the archive already, as failed, so p_archive changes nothing there.
-- DELETE, never TRUNCATE: the statement triggers keep queue_depth and dlq_depth exact.
CREATE OR REPLACE FUNCTION courier.purge_queue(p_endpoint_name text, p_dlq boolean DEFAULT false,
                                               p_archive boolean DEFAULT true, p_actor text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_found record := courier._verb_endpoint(p_endpoint_name, 'endpoint');
    v_endpoint courier.endpoints := v_found.endpoint;
    v_dead_letters boolean := v_found.dead_letters OR coalesce(p_dlq, false);
    v_archive boolean := coalesce(p_archive, true);
    v_count bigint;
BEGIN
    IF v_dead_letters THEN
        DELETE FROM courier.dlq d WHERE d.endpoint_id = v_endpoint.id AND d.status = 'failed';
        GET DIAGNOSTICS v_count = ROW_COUNT;
        IF v_count > 0 THEN
            PERFORM courier._log_event('dlq.purged', v_endpoint.id, jsonb_strip_nulls(jsonb_build_object(
                'name', v_endpoint.name, 'count', v_count, 'by', p_actor)));
        END IF;
        RETURN v_count;
    END IF;
    PERFORM courier._unstage();  -- staged sends (migration 0054) are pending messages too
    -- The pending messages, each part from the index that holds it: ready push messages,
    -- scheduled and retrying push messages, and pull messages.
    WITH doomed AS (
        SELECT q.id FROM courier.queue q
        WHERE q.endpoint_id = v_endpoint.id AND q.status = 'pending'
          AND q.scheduled_at IS NULL AND q.next_retry_at IS NULL AND q.visible_at IS NULL
        UNION ALL
        SELECT q.id FROM courier.queue q
        WHERE q.endpoint_id = v_endpoint.id AND q.status = 'pending' AND q.visible_at IS NULL
          AND (q.scheduled_at IS NOT NULL OR q.next_retry_at IS NOT NULL)
        UNION ALL
        SELECT q.id FROM courier.queue q
        WHERE q.endpoint_id = v_endpoint.id AND q.status = 'pending' AND q.visible_at IS NOT NULL
    ),
    moved AS (
        -- status again: a claim that took a row meanwhile made it processing, and it stays.
        DELETE FROM courier.queue q USING doomed d
        WHERE q.id = d.id AND q.status = 'pending'
        RETURNING q.*
    ),
    archived AS (
        INSERT INTO courier.archive (id, endpoint_id, payload, headers, metadata, status, priority, retry_count,
                                     max_retries, scheduled_at, expires_at, idempotency_key, correlation_id,
                                     ordering_key, last_error, error_history, worker_id, response, completed_at,
                                     created_at, key, payload_binary, body)
        SELECT m.id, m.endpoint_id, m.payload, m.headers, m.metadata, 'purged', m.priority,
               m.retry_count, m.max_retries, m.scheduled_at, m.expires_at, m.idempotency_key, m.correlation_id,
               m.ordering_key, m.last_error, m.error_history, m.worker_id, m.response,
               now(), m.created_at, m.key, m.payload_binary, m.body
        FROM moved m
        WHERE v_archive
    )
    SELECT count(*) INTO v_count FROM moved;
    IF v_count > 0 THEN
        PERFORM courier._log_event('queue.purged', v_endpoint.id, jsonb_strip_nulls(jsonb_build_object(
            'name', v_endpoint.name, 'count', v_count, 'archived', v_archive, 'by', p_actor)));
    END IF;
    RETURN v_count;
END
$$;

-- Delete ----------------------------------------------------------------------------------

-- Deletes message p_id outright, without a lease (pgmq's delete), in any state but processing:
-- pending, scheduled, retrying, or finished and not yet archived. Nothing goes to the archive
-- (as pgmq's delete, it is gone); the event log keeps who deleted which message of which
-- endpoint, and in what state. Returns that state. A message in processing is refused (55000):
-- its worker or consumer holds it, and cancel_message() is the verb that takes it from them.
CREATE OR REPLACE FUNCTION courier.delete_message(p_id bigint, p_actor text DEFAULT NULL) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_message courier.queue;
    v_state text;
BEGIN
    IF p_id IS NULL THEN
        RAISE EXCEPTION '[courier] id: give the id of the message to delete' USING ERRCODE = '22023', COLUMN = 'id';
    END IF;
    PERFORM courier._unstage_message(p_id);
    SELECT * INTO v_message FROM courier.queue q WHERE q.id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM courier._refuse_unqueued(p_id, 'delete', NULL);
    END IF;
    IF v_message.status = 'processing' THEN
        RAISE EXCEPTION '[courier] id: message % is in processing (%), and delete takes a message in any other state',
                p_id, coalesce('worker ' || v_message.worker_id, 'leased by a consumer')
            USING ERRCODE = '55000', COLUMN = 'id',
                  HINT = 'Cancel it instead (`courier message cancel ID`, courier.cancel_message): its outcome '
                         'is then discarded and it is never retried';
    END IF;
    v_state := courier._message_state(v_message);
    DELETE FROM courier.queue q WHERE q.id = p_id;
    PERFORM courier._log_event('message.deleted', v_message.endpoint_id, jsonb_strip_nulls(jsonb_build_object(
        'message_id', p_id, 'was', v_state, 'by', p_actor)));
    RETURN v_state;
END
$$;
