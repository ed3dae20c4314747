-- What a receive loop (sqlkit.consumer.ReceiveLoop, or any client using NServiceBus's receive
-- mode) needs beside courier.receive: a way to report a message its handler failed on, so
-- that one poison message at the head of a FIFO topic cannot stall it.

-- Records a failed handling of message p_id of p_topic, which the caller received and then
-- rolled back: its retry_count goes up with p_error, and it becomes visible again after a
-- back-off of retry_count seconds (at most 60), which lets the messages behind it through. Past
-- the topic's max_retries it goes to <topic>.dlq instead. Returns 'retry', 'dead_lettered', or
-- 'not_found' when the message is not one a receive just gave back (then nothing is changed).
--
-- Which message that is, the database can tell without the caller's word: a receive hands out
-- only due messages and deletes them, so a message whose receive rolled back is due (not
-- scheduled later, not held back by an earlier report, not expired), not locked by anyone (no
-- other receiver or consumer holds it), and its row still names the transaction that deleted
-- it in xmax, a transaction that aborted (_aborted_xmax). A message no one took has no xmax, or
-- that of a committed write (a nack, release, upsert or earlier report: the queue's BEFORE
-- UPDATE trigger leaves the updater's lock there). The rule is NServiceBus's: failure handling
-- applies to the message the receiving transaction took, and to nothing else. Before, any
-- pending message could be reported: one scheduled 7 days out became visible at once, an
-- untouched one on a max_retries 0 topic went to the DLQ. A message taken from under a lapsed
-- lease (status processing) comes back pending, its lease moved on (the lapsed lease is fenced).
-- A receive loop calls courier.lock_received first, in the same transaction: once it holds the
-- row, the failure is recorded even if a later attempt's report has already moved it on.
-- The status of the transaction a row's xmax names ('in progress', 'committed' or 'aborted'),
-- NULL when there is none or it is too old to know. xmax holds 32 bits; the full id is the one
-- nearest the snapshot's next id (xids live within 2^31 of it). A row being deleted right now
-- by a transaction that began after this statement's snapshot has an xmax past that next id:
-- taking the previous epoch for it, as "past the next id" used to, asked about an id 2^32 away.
CREATE OR REPLACE FUNCTION courier._xmax_status(p_xmax xid) RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT CASE WHEN p_xmax::text::bigint < 3 OR full_id < 0 THEN NULL  -- 0: none; 1, 2: bootstrap, frozen
                ELSE pg_xact_status(full_id::text::xid8) END
    FROM (SELECT CASE WHEN f > n + 2147483648 THEN f - 4294967296 ELSE f END AS full_id
          FROM (SELECT n, (n & ~4294967295::bigint) | p_xmax::text::bigint AS f
                FROM (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS n) next_xid) same_epoch
         ) nearest
$$;

-- True when a row's xmax is a transaction (or subtransaction) that aborted: the row was deleted
-- or locked by it, and the deletion undone.
CREATE OR REPLACE FUNCTION courier._aborted_xmax(p_xmax xid) RETURNS boolean
LANGUAGE sql STABLE
AS $$ SELECT courier._xmax_status(p_xmax) IS NOT DISTINCT FROM 'aborted' $$;

-- True when the row is locked by the calling transaction itself (courier.lock_received's lock).
CREATE OR REPLACE FUNCTION courier._xmax_is_current(p_xmax xid) RETURNS boolean
LANGUAGE sql STABLE
AS $$ SELECT p_xmax::text::bigint = pg_current_xact_id_if_assigned()::text::bigint & 4294967295 $$;

-- A message a receive took from the stage (_take_staged) and then rolled back is in the stage
-- again, its row naming the aborted receive in xmax as a queue row would. For lock_received and
-- receive_failed: waits while a receive still holds it (gone once that one commits), then moves
-- it into the queue (with what was staged before it: _unstage) and locks it there, so that it is
-- the message this transaction holds (_xmax_is_current). True when it did. The leader or another
-- consumer may move such a message into the queue first, in the moment after the rollback: its
-- row there names no receive, and that one failure goes unrecorded (it is delivered again, and
-- once in the queue a message never returns to the stage, so at most once a message).
CREATE OR REPLACE FUNCTION courier._received_from_stage(p_topic_id integer, p_id bigint) RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM FROM courier.send_stage s
    WHERE s.id = p_id AND s.endpoint_id = p_topic_id AND s.lease IS NULL  -- not taken there
      AND courier._xmax_status(s.xmax) IN ('aborted', 'in progress')
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM courier._unstage();
    PERFORM FROM courier.queue q WHERE q.id = p_id FOR UPDATE;
    RETURN FOUND;
END
$$;

CREATE OR REPLACE FUNCTION courier.receive_failed(p_topic text, p_id bigint, p_error text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_topic courier.endpoints := courier._pull_topic(p_topic);
    v_error text := courier._redact_text(left(p_error, 10000));
    v_row courier.queue;
    v_exhausted boolean;
BEGIN
    IF EXISTS (SELECT FROM courier.send_stage s WHERE s.id = p_id) THEN  -- received from the stage
        PERFORM courier._received_from_stage(v_topic.id, p_id);
    END IF;
    SELECT * INTO v_row FROM courier.queue q
    WHERE q.id = p_id AND q.endpoint_id = v_topic.id AND q.status IN ('pending', 'processing')
      AND q.visible_at IS NOT NULL AND (q.status = 'pending' OR q.visible_at <= now())  -- never a live lease
      AND (courier._xmax_is_current(q.xmax)  -- lock_received found it taken by a receive and waited for it
           OR (q.visible_at <= now() AND (q.expires_at IS NULL OR q.expires_at > now())
               AND courier._aborted_xmax(q.xmax)))
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN 'not_found';
    END IF;
    v_exhausted := v_row.retry_count + 1 > coalesce(v_row.max_retries, courier._endpoint_max_retries(v_topic));
    UPDATE courier.queue q
    SET retry_count = q.retry_count + 1, last_error = v_error, updated_at = now(),
        error_history = q.error_history || jsonb_build_object('attempt', q.retry_count + 1, 'at', now(),
                                                              'outcome', 'receive_failed', 'error', v_error),
        status = 'pending', lease = CASE WHEN q.status = 'processing' THEN courier._next_lease(q.lease) ELSE q.lease END,
        visible_at = CASE WHEN v_exhausted THEN q.visible_at
                          ELSE now() + make_interval(secs => least(q.retry_count + 1, 60)) END
    WHERE q.id = p_id;
    IF v_exhausted THEN
        RETURN CASE WHEN p_id = ANY (courier._pull_dead_letter(ARRAY[p_id])) THEN 'failed' ELSE 'dead_lettered' END;
    END IF;
    RETURN 'retry';
END
$$;

-- Locks message p_id of p_topic for the rest of the caller's transaction, waiting while another
-- receiver holds it, and returns its id, or NULL once it is gone (received and committed
-- elsewhere). A receive loop whose handler failed rolls its receive back and, in the next
-- transaction, calls this and then courier.receive_failed before it commits:
--     ROLLBACK; BEGIN; SELECT courier.lock_received(t, id); SELECT courier.receive_failed(t, id, e); COMMIT;
-- receive_failed skips a message someone else holds, so a receiver that took the message
-- between the rollback and the recorded failure used to make the failure go unrecorded, and
-- that receiver ran it again at once, past the back-off: 9 runs of a handler that failed every
-- time, against 4 recorded. Waiting here, each attempt is recorded after the other's. (A
-- savepoint kept the message locked throughout, but a message locked by a transaction and
-- deleted by its subtransaction carries a multixact, which made every receive 3x dearer.)
CREATE OR REPLACE FUNCTION courier.lock_received(p_topic text, p_id bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_topic courier.endpoints := courier._pull_topic(p_topic);
    v_id bigint;
    v_holder text;
    v_last_outcome text;
BEGIN
    IF EXISTS (SELECT FROM courier.send_stage s WHERE s.id = p_id)
       AND courier._received_from_stage(v_topic.id, p_id) THEN
        RETURN p_id;
    END IF;
    -- Only a message a receive took: its row names a receive that rolled back, or one still
    -- running (another receiver's, waited for below), or the other receiver that took it since
    -- the rollback has recorded its own failure first. One nobody took gives NULL.
    SELECT courier._xmax_status(q.xmax), q.error_history -> -1 ->> 'outcome' INTO v_holder, v_last_outcome
    FROM courier.queue q
    WHERE q.id = p_id AND q.endpoint_id = v_topic.id AND q.visible_at IS NOT NULL;
    IF v_holder IS DISTINCT FROM 'aborted' AND v_holder IS DISTINCT FROM 'in progress'
       AND v_last_outcome IS DISTINCT FROM 'receive_failed' THEN
        RETURN NULL;
    END IF;
    SELECT q.id INTO v_id FROM courier.queue q
    WHERE q.id = p_id AND q.endpoint_id = v_topic.id AND q.visible_at IS NOT NULL
    FOR UPDATE;
    RETURN v_id;
END
$$;
