-- What a receive loop (sqlkit.consumer.ReceiveLoop, or any client using NServiceBus's receive
-- mode) needs beside courier.receive: a way to report a message its handler failed on, so
-- that one poison message at the head of a FIFO topic cannot stall it.

-- Records a failed handling of message p_id of p_topic, which the caller received and then
-- rolled back (so the row is pending again): its retry_count goes up with p_error, and it
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
    v_error text := courier._redact_text(left(p_error, 10000));
    v_row courier.queue;
    v_exhausted boolean;
BEGIN
    SELECT * INTO v_row FROM courier.queue q
    WHERE q.id = p_id AND q.endpoint_id = v_topic.id AND q.status = 'pending' AND q.visible_at IS NOT NULL
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN 'not_found';
    END IF;
    v_exhausted := v_row.retry_count + 1 > coalesce(v_row.max_retries, courier._endpoint_max_retries(v_topic));
    UPDATE courier.queue q
    SET retry_count = q.retry_count + 1, last_error = v_error, updated_at = now(),
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
