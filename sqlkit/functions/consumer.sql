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
-- True when p_xmax, a row's xmax, is a transaction (or subtransaction) that aborted: the row
-- was deleted or locked by it, and the deletion undone. xmax holds 32 bits; the full id is
-- taken from the current epoch (the previous one when it would lie in the future).
-- pg_xact_status is NULL for an id too old to know: not aborted, as far as anyone can tell.
CREATE OR REPLACE FUNCTION courier._aborted_xmax(p_xmax xid) RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT CASE WHEN p_xmax::text::bigint < 3 THEN false  -- 0: none; 1 and 2: bootstrap and frozen
                ELSE pg_xact_status((CASE WHEN f >= n THEN f - 4294967296 ELSE f END)::text::xid8)
                     IS NOT DISTINCT FROM 'aborted' END
    FROM (SELECT n, (n & ~4294967295::bigint) | p_xmax::text::bigint AS f
          FROM (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS n) next_xid) full_xid
$$;

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
    WHERE q.id = p_id AND q.endpoint_id = v_topic.id AND q.status IN ('pending', 'processing')
      AND q.visible_at IS NOT NULL AND q.visible_at <= now() AND (q.expires_at IS NULL OR q.expires_at > now())
      AND courier._aborted_xmax(q.xmax)
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN 'not_found';
    END IF;
    v_exhausted := v_row.retry_count + 1 > coalesce(v_row.max_retries, courier._endpoint_max_retries(v_topic));
    UPDATE courier.queue q
    SET retry_count = q.retry_count + 1, last_error = v_error, updated_at = now(),
        error_history = q.error_history || jsonb_build_object('attempt', q.retry_count + 1, 'at', now(),
                                                              'outcome', 'receive_failed', 'error', v_error),
        status = 'pending', lease = q.lease + (q.status = 'processing')::integer,
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
