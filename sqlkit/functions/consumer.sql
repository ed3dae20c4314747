-- What a receive loop (sqlkit.consumer.ReceiveLoop, or any client using NServiceBus's receive
-- mode) needs beside courier.receive: a way to report a message its handler failed on, so
-- that one poison message at the head of a FIFO topic cannot stall it.

-- Records a failed handling of message p_id of p_topic, which the caller received and then
-- rolled back (so the row is pending again, or processing under a dequeuer's lease that had
-- run out, which is given up): its retry_count goes up with p_error, and it
-- becomes visible again after a back-off of retry_count seconds (at most 60), which lets the
-- messages behind it through. Past the topic's max_retries it goes to <topic>.dlq instead.
-- Returns 'retry', 'dead_lettered', or 'not_found' when the message is gone or another
-- receiver holds it (then nothing is changed).
CREATE OR REPLACE FUNCTION courier.receive_failed(p_topic text, p_id bigint, p_error text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_topic courier.endpoints := courier._pull_topic(p_topic);
    v_error text := left(p_error, 10000);
    v_row courier.queue;
    v_exhausted boolean;
BEGIN
    SELECT * INTO v_row FROM courier.queue q
    WHERE q.id = p_id AND q.endpoint_id = v_topic.id AND q.visible_at IS NOT NULL
      AND (q.status = 'pending' OR q.visible_at <= now())  -- or received after a dequeuer's lease ran out
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN 'not_found';
    END IF;
    v_exhausted := v_row.retry_count + 1 > coalesce(v_row.max_retries, courier._endpoint_max_retries(v_topic));
    UPDATE courier.queue q
    SET status = 'pending', retry_count = q.retry_count + 1, last_error = v_error, updated_at = now(),
        error_history = q.error_history || jsonb_build_object('attempt', q.retry_count + 1, 'at', now(),
                                                              'outcome', 'receive_failed', 'error', v_error),
        visible_at = CASE WHEN v_exhausted THEN q.visible_at
                          ELSE now() + make_interval(secs => least(q.retry_count + 1, 60)) END
    WHERE q.id = p_id;
    IF v_exhausted THEN
        PERFORM courier._pull_dead_letter(ARRAY[p_id]);
        RETURN 'dead_lettered';
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
BEGIN
    SELECT q.id INTO v_id FROM courier.queue q
    WHERE q.id = p_id AND q.endpoint_id = v_topic.id AND q.visible_at IS NOT NULL
    FOR UPDATE;
    RETURN v_id;
END
$$;
