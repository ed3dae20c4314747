-- Pull topics: endpoints with protocol 'pull', whose consumers take messages themselves.
--   queue-ti:     enqueue (keyed upsert), dequeue with a visibility timeout and a lease,
--                 ack / nack / extend_lease fenced by that lease, <topic>.dlq and requeue,
--                 per-topic max_retries, message_ttl_seconds, max_depth, throughput_limit,
--                 the expiry and delete reapers.
--   NServiceBus:  receive, a destructive FIFO read that drops expired messages, and peek.
--   LonnyMQ:      scheduled messages, served in due-time-then-id order from one index.
--
-- Pull messages are rows of courier.queue like any other; what marks them is visible_at
-- (see the baseline migration), which is never NULL for them and always NULL for push messages. While a
-- message is processing, visible_at is the end of its visibility timeout, and the row is due
-- again once that passes: dequeue and receive take pending rows (queue_pull_due_idx) and such
-- lapsed leases (queue_pull_leased_idx) alike, in due order. processing_started_at stays NULL for pull rows so that the push
-- engine's stale recovery (which counts from it) never takes a message a consumer holds.
--
-- Statuses follow queue-ti's lifecycle: pending -> processing -> ack -> deleted (the row goes);
-- nack -> pending, or once past max_retries -> courier.dlq (<topic>.dlq) and the archive as
-- failed; TTL passed -> expired (reaper), then deleted for good by the delete reaper.

-- A queue is read by its indexes. The consumer's calls (dequeue, receive, peek and every
-- fenced settle) look their rows up by TID, id or a due index, and say so with
-- enable_seqscan = off: on a queue of a few hundred rows, as a drained topic's often is, the
-- planner would rather read every page, testing every row against the batch's TIDs or ids (a
-- sixth of a receive(1)'s instructions), and dequeue's and receive's generic plans, made once
-- per session, would keep that scan however far the queue grew before the next ANALYZE.
-- Under callgrind, a receive(1) from 300 rows costs 153,000 instructions less with it; from
-- 3,000, where the planner takes the TID scan anyway, 16,000 more (the setting 2,800, the rest
-- index scans of the one-page tables it reads, endpoints, settings and a depth counter).
-- tests/test_pull_plans.py holds both ends: 100k rows and 300.

-- Resolving topics and their limits -----------------------------------------------------

-- The pull endpoint named p_topic, or an error that says what is wrong with the name.
CREATE OR REPLACE FUNCTION courier._pull_topic(p_topic text) RETURNS courier.endpoints
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_endpoint courier.endpoints;
BEGIN
    SELECT * INTO v_endpoint FROM courier.endpoints WHERE name = p_topic;
    IF FOUND AND v_endpoint.protocol = 'pull' THEN
        RETURN v_endpoint;
    END IF;
    IF p_topic LIKE '%.dlq' THEN
        RAISE EXCEPTION '[courier] topic names ending in ".dlq" are reserved: % holds the dead letters of %, '
                        'which only dead-lettering puts there', p_topic, left(p_topic, -4)
            USING ERRCODE = '22023',
                  HINT = format('Consume them with courier.dequeue(%L) and ack or nack; put one back with '
                                '`courier topic requeue %s ID` (courier.requeue)', p_topic, p_topic);
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION '[courier] topic "%" does not exist', coalesce(p_topic, 'NULL')
            USING ERRCODE = 'P0002', HINT = 'Create it with `courier topic create` (an endpoint with protocol pull)';
    END IF;
    RAISE EXCEPTION '[courier] endpoint "%" is a % endpoint, not a pull topic', p_topic, v_endpoint.protocol
        USING ERRCODE = '42809', HINT = 'Send to push endpoints with courier.send(); consumers pull from topics';
END
$$;

-- The topic a dequeue takes from: the pull endpoint named p_topic, as _pull_topic finds it, or
-- NULL for <topic>.dlq of an existing pull topic, whose dead letters dequeue() hands out
-- (_dequeue_dead_letters). The name is looked at only once the lookup has failed, so a topic's
-- own dequeue does what it did before. Any other name gets _pull_topic's error, and the .dlq of
-- a name that is not a pull topic the error of that name.
CREATE OR REPLACE FUNCTION courier._dequeue_topic(p_topic text) RETURNS courier.endpoints
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_endpoint courier.endpoints;
BEGIN
    SELECT * INTO v_endpoint FROM courier.endpoints WHERE name = p_topic;
    IF FOUND AND v_endpoint.protocol = 'pull' THEN
        RETURN v_endpoint;
    END IF;
    IF NOT FOUND AND p_topic LIKE '%.dlq' THEN
        PERFORM courier._pull_topic(left(p_topic, -4));  -- raises unless that is a pull topic
        RETURN NULL;
    END IF;
    RETURN courier._pull_topic(p_topic);  -- raises what is wrong with the name
END
$$;

-- An endpoint's own limit p_key from its config, else the global setting p_setting. A JSON
-- null in the config, like a missing key, means the global default (queue-ti's precedence).
-- plpgsql, not SQL: a SQL function that reads a table is not inlined, and PostgreSQL 15 parses
-- and plans its query on every call (57 us of each send_batch, in pg_stat_user_functions).
CREATE OR REPLACE FUNCTION courier._endpoint_limit(p_config jsonb, p_key text, p_setting text) RETURNS numeric
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN coalesce((p_config ->> p_key)::numeric, (SELECT value::numeric FROM courier.settings WHERE name = p_setting));
END
$$;

-- A topic's max_retries: its config's, else its retry policy's (config_max_retries, migration
-- 0051), else default_max_retries as courier.consume_limits holds it (migration 0049), read as
-- dequeue and nack read it. plpgsql, for the reason above: as SQL it read courier.settings in a
-- subquery, so it was never inlined and was planned again in every statement that called it
-- (200,000 instructions of a dequeue(1) + nack).
CREATE OR REPLACE FUNCTION courier._endpoint_max_retries(p_endpoint courier.endpoints) RETURNS integer
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN coalesce(p_endpoint.config_max_retries, (SELECT l.default_max_retries FROM courier.consume_limits l));
END
$$;

-- The retries a pull message of the topic has before it leaves the queue, cut short by the
-- topic's DLQ threshold (dlq_threshold, else default_dlq_threshold): NULL when the threshold
-- does not cut them (least() skips a NULL). A threshold of N moves a message to the DLQ after
-- its Nth failed attempt; 0 is no DLQ, which never cuts retries.
CREATE OR REPLACE FUNCTION courier._dlq_retry_cap(p_endpoint courier.endpoints) RETURNS integer
LANGUAGE sql STABLE
AS $$ SELECT nullif(courier._endpoint_limit(p_endpoint.config, 'dlq_threshold', 'default_dlq_threshold'), 0)::integer - 1 $$;

-- Raises SQLSTATE 53401 when p_adding more messages would take the endpoint past its max_depth
-- (its config's, else default_max_depth; 0 is unlimited). A check, not a lock: producers
-- racing at the limit can overshoot it by one batch each, as with max_queue_size.
CREATE OR REPLACE FUNCTION courier._enforce_max_depth(p_endpoint_id bigint, p_adding bigint) RETURNS void
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_name text;
    v_limit numeric;
    v_active bigint;
BEGIN
    SELECT e.name, courier._endpoint_limit(e.config, 'max_depth', 'default_max_depth')
    INTO v_name, v_limit FROM courier.endpoints e WHERE e.id = p_endpoint_id;
    IF coalesce(v_limit, 0) = 0 THEN
        RETURN;
    END IF;
    v_active := courier._active_messages(p_endpoint_id::integer);
    IF v_active + p_adding > v_limit THEN
        RAISE EXCEPTION '[courier] "%" is full: % pending/processing message(s) plus % new would exceed its max_depth %',
                v_name, v_active, p_adding, v_limit
            USING ERRCODE = '53401',
                  HINT = 'Consume to make room and retry with backoff, or raise max_depth (endpoint config or default_max_depth)';
    END IF;
END
$$;

-- When a message sent now to an endpoint of protocol p_protocol and scheduled at p_scheduled_at
-- becomes visible: NULL for push endpoints, which keeps their rows out of the pull index.
CREATE OR REPLACE FUNCTION courier._pull_visible_at(p_protocol text, p_scheduled_at timestamptz) RETURNS timestamptz
LANGUAGE sql STABLE
AS $$ SELECT CASE WHEN p_protocol = 'pull' THEN coalesce(p_scheduled_at, now()) END $$;

-- The time to live of an endpoint's messages in seconds, NULL for none: its config's
-- message_ttl_seconds, else default_message_ttl (0 is none). Batch sends take it once per
-- call and add it to each message's due time.
CREATE OR REPLACE FUNCTION courier._message_ttl(p_config jsonb) RETURNS double precision
LANGUAGE sql STABLE
AS $$ SELECT nullif(courier._endpoint_limit(p_config, 'message_ttl_seconds', 'default_message_ttl'), 0)::double precision $$;

-- When a message due at p_due expires under the endpoint's TTL (message_ttl_seconds, else
-- default_message_ttl; 0: never). The TTL runs from when the message is due, so a scheduled
-- message never expires before it could be taken.
CREATE OR REPLACE FUNCTION courier._ttl_expires_at(p_config jsonb, p_due timestamptz) RETURNS timestamptz
LANGUAGE sql STABLE
AS $$ SELECT p_due + make_interval(secs => courier._message_ttl(p_config)) $$;

-- throughput_limit (messages per second; its config's, else default_throughput_limit; 0 is
-- unlimited) as a token bucket holding one second's worth, in the columns the push rate
-- limit uses. Returns how many of p_wanted may be handed out now and takes them; the caller
-- gives back what it did not use. Serialises the consumers of a limited topic only.
CREATE OR REPLACE FUNCTION courier._take_throughput(p_endpoint courier.endpoints, p_wanted integer) RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    v_rate double precision := courier._endpoint_limit(p_endpoint.config, 'throughput_limit', 'default_throughput_limit');
    v_burst double precision;
    v_tokens double precision;
    v_take integer;
BEGIN
    IF coalesce(v_rate, 0) = 0 THEN
        RETURN p_wanted;
    END IF;
    v_burst := greatest(v_rate, 1);
    SELECT least(v_burst, coalesce(rate_tokens, v_burst) + v_rate * extract(epoch FROM now() - coalesce(rate_refilled_at, now())))
    INTO v_tokens FROM courier.endpoints WHERE id = p_endpoint.id FOR UPDATE;
    v_take := least(p_wanted, greatest(floor(v_tokens), 0))::integer;
    UPDATE courier.endpoints SET rate_tokens = v_tokens - v_take, rate_refilled_at = now() WHERE id = p_endpoint.id;
    RETURN v_take;
END
$$;

CREATE OR REPLACE FUNCTION courier._return_throughput(p_endpoint courier.endpoints, p_unused integer) RETURNS void
LANGUAGE sql
AS $$
    UPDATE courier.endpoints SET rate_tokens = rate_tokens + p_unused
    WHERE id = p_endpoint.id AND p_unused > 0 AND rate_tokens IS NOT NULL
      AND coalesce(courier._endpoint_limit(p_endpoint.config, 'throughput_limit', 'default_throughput_limit'), 0) > 0
$$;

CREATE OR REPLACE FUNCTION courier._require_count(p_what text, p_count integer, p_max integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_count IS NULL OR p_count NOT BETWEEN 1 AND p_max THEN
        RAISE EXCEPTION '[courier] % must be between 1 and %, got %', p_what, p_max, coalesce(p_count::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
END
$$;

-- What _require_pull_leases checks, as an expression: SQL, so inlined into a plpgsql IF, which
-- calls _require_pull_leases for its error only when this is false. A PERFORM of it in every ack
-- was a statement and a plpgsql call of their own.
CREATE OR REPLACE FUNCTION courier._pull_leases_ok(p_ids bigint[], p_leases integer[]) RETURNS boolean
LANGUAGE sql IMMUTABLE
AS $$
    SELECT p_ids IS NOT NULL AND coalesce(cardinality(p_ids), 0) = coalesce(cardinality(p_leases), 0)
       AND cardinality(p_ids) <= 10000
       AND array_position(p_ids, NULL) IS NULL AND array_position(p_leases, NULL) IS NULL
$$;

CREATE OR REPLACE FUNCTION courier._require_pull_leases(p_ids bigint[], p_leases integer[]) RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_ids IS NULL OR coalesce(cardinality(p_ids), 0) <> coalesce(cardinality(p_leases), 0)
       OR array_position(p_ids, NULL) IS NOT NULL OR array_position(p_leases, NULL) IS NOT NULL THEN
        RAISE EXCEPTION '[courier] every message id needs the lease its dequeue returned (ids and leases of equal length, no NULLs)'
            USING ERRCODE = '22023', HINT = 'Pass the id and lease columns of courier.dequeue() for each message';
    END IF;
    IF cardinality(p_ids) > 10000 THEN
        RAISE EXCEPTION '[courier] at most 10000 messages per call, got %', cardinality(p_ids) USING ERRCODE = '22023';
    END IF;
END
$$;

-- Enqueue ----------------------------------------------------------------------------------

-- Adds a message to a pull topic and returns its id. With p_key, a pending message of the
-- topic with that key is replaced in place (payload, binary payload, body, metadata, and the
-- schedule if one is given) and keeps its id; a message with that key in processing is never
-- touched, and the enqueue is refused (23505) until it is acked or nacked, or its visibility
-- timeout passes (then it is due again, and replaced). A binary payload alone is stored with
-- payload JSON null. Without p_scheduled_at a new message is due after the topic's delay_seconds
-- (SQS delay queues; a replaced one keeps its due time). p_max_retries is the message's own
-- limit of retries, over the topic's max_retries (a replacement given none keeps its own).
-- p_max_retries came last (issue 42, item 9): the signature before it is dropped, or calls that
-- leave it out would be ambiguous.
DROP FUNCTION IF EXISTS courier.enqueue(text, jsonb, text, jsonb, bytea, text, timestamptz, integer);
CREATE OR REPLACE FUNCTION courier.enqueue(
    p_topic          text,
    p_payload        jsonb,
    p_key            text        DEFAULT NULL,
    p_metadata       jsonb       DEFAULT NULL,
    p_payload_binary bytea       DEFAULT NULL,
    p_body           text        DEFAULT NULL,
    p_scheduled_at   timestamptz DEFAULT NULL,
    p_ttl_seconds    integer     DEFAULT NULL,
    p_max_retries    integer     DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_topic courier.endpoints;
    v_payload jsonb;
    v_metadata jsonb;
    v_size bigint;
    v_scheduled_at timestamptz;  -- p_scheduled_at, or the topic's delay_seconds when it has one
    v_due timestamptz;
    v_id bigint;
    v_status text;
    v_lapsed boolean;
    v_exhausted boolean;
    v_replaced boolean;
    v_limits courier.send_limits;
    v_ttl numeric;
    v_held boolean;
    v_wake text;
    v_topic_id integer;
    v_slot integer;  -- its counter row (_count_sent_in_slot)
    v_delayed boolean;
BEGIN
    -- As a send does: a drop of the topic waits for this enqueue (read the topic after it).
    v_held := courier._hold_endpoint_for_send(p_topic);
    IF p_key IS NULL AND p_metadata IS NULL AND p_payload_binary IS NULL AND p_body IS NULL
       AND p_scheduled_at IS NULL AND p_ttl_seconds IS NULL AND p_max_retries IS NULL AND p_payload IS NOT NULL THEN
        -- A plain enqueue, as send() is a plain send: one statement reads the topic, its delay
        -- and TTL and the limits, asks for the wake-up and inserts (the topic read on its own
        -- first, as the general path below does, was 4% of an enqueue). Nothing inserted: the
        -- name is not a pull topic (_pull_topic raises), or a limit stands in the way
        -- (_send_refusal raises), or neither any more, and it goes round again.
        v_size := octet_length(p_payload::text);
        -- Staged as send() stages (sending.sql): while a mover is alive, for a topic that is not
        -- paused, with no delay and no max_depth, while the leader's estimate leaves room. The
        -- topic's next dequeue or receive takes it from the stage (_take_staged), else the leader
        -- moves it into the queue within a second. courier.never_staged as in send(). send()'s
        -- statement, written here rather than called: a call costs every enqueue a plpgsql
        -- function's entry and exit (see _pull_topic's lookup below).
        IF current_setting('courier.never_staged', true) IS DISTINCT FROM p_topic THEN
            INSERT INTO courier.send_stage (endpoint_id, payload)
            SELECT e.id, p_payload
            FROM courier.endpoints e, courier.send_limits l
            WHERE e.name = p_topic AND e.protocol = 'pull' AND e.enabled AND e.paused_at IS NULL
              AND e.config_delay IS NULL AND e.config_max_depth IS NULL AND l.default_max_depth = 0
              AND courier._admit_staged(l, v_size)
            RETURNING id INTO v_id;
            IF v_id IS NOT NULL THEN
                RETURN v_id;
            END IF;
        END IF;
        LOOP
            INSERT INTO courier.queue (endpoint_id, payload, scheduled_at, visible_at, expires_at)
            SELECT e.id, p_payload, now() + e.config_delay, coalesce(now() + e.config_delay, now()),
                   coalesce(now() + e.config_delay, now()) + make_interval(secs => nullif(
                       coalesce(e.config_ttl_seconds, l.default_message_ttl), 0))
            FROM courier.endpoints e, courier.send_limits l
            WHERE e.name = p_topic AND e.protocol = 'pull' AND e.enabled
              AND courier._admit_one(l, e.id, v_size, coalesce(e.config_max_depth, l.default_max_depth),
                                     e.config_delay IS NULL)
            RETURNING id, endpoint_id, cmin::text::bigint >> 7, scheduled_at IS NOT NULL
                INTO v_id, v_topic_id, v_slot, v_delayed;
            v_held := set_config('courier.insert_counted', 'off', true) IS NOT NULL;
            EXIT WHEN v_id IS NOT NULL;
            v_topic := courier._pull_topic(p_topic);
            PERFORM courier._send_refusal(p_topic, 1, v_size);
        END LOOP;
        v_held := courier._count_sent_in_slot(v_topic_id, 0, 1, v_slot);
        IF v_delayed THEN
            v_held := set_config('courier.never_staged', p_topic, false) IS NOT NULL;
        END IF;
        RETURN v_id;
    END IF;
    -- The general path's variables are set here, not in DECLARE, where every enqueue, a plain
    -- one too, evaluated them on entry (6,500 instructions, 1%).
    v_payload := coalesce(p_payload, CASE WHEN p_payload_binary IS NOT NULL THEN 'null'::jsonb END);
    v_metadata := coalesce(p_metadata, '{}');
    v_scheduled_at := p_scheduled_at;
    v_replaced := false;
    -- _pull_topic's lookup, here: its call cost every enqueue a plpgsql function's entry and
    -- exit. Any other name is looked at by it, for its error.
    SELECT * INTO v_topic FROM courier.endpoints e WHERE e.name = p_topic AND e.protocol = 'pull';
    IF NOT FOUND THEN
        v_topic := courier._pull_topic(p_topic);
    END IF;
    IF v_payload IS NULL THEN
        RAISE EXCEPTION '[courier] payload must not be NULL' USING ERRCODE = '22004',
            HINT = 'Give a JSON payload, a binary payload (p_payload_binary), or both';
    END IF;
    -- As in _send_one: the options a plain enqueue leaves out are checked only when given, each
    -- IF being an expression of its own.
    IF p_metadata IS NOT NULL OR p_key IS NOT NULL OR p_scheduled_at IS NOT NULL OR p_ttl_seconds IS NOT NULL
       OR p_max_retries IS NOT NULL THEN
        IF jsonb_typeof(v_metadata) <> 'object' THEN
            RAISE EXCEPTION '[courier] metadata must be a JSON object, got %', jsonb_typeof(v_metadata) USING ERRCODE = '22023';
        END IF;
        IF v_metadata <> '{}' AND jsonb_path_exists(v_metadata, 'strict $.**{32}') THEN
            RAISE EXCEPTION '[courier] metadata is nested more than 32 levels deep' USING ERRCODE = '22023';
        END IF;
        IF length(p_key) NOT BETWEEN 1 AND 255 THEN
            RAISE EXCEPTION '[courier] key must be 1 to 255 characters, got %', length(p_key) USING ERRCODE = '22023';
        END IF;
        IF p_scheduled_at = 'infinity' OR p_scheduled_at = '-infinity' THEN
            RAISE EXCEPTION '[courier] scheduled_at must be a finite time' USING ERRCODE = '22023';
        END IF;
        IF p_ttl_seconds NOT BETWEEN 1 AND 31536000 THEN
            RAISE EXCEPTION '[courier] ttl_seconds must be between 1 and 31536000, got %', p_ttl_seconds
                USING ERRCODE = '22023', HINT = 'Leave it out for the topic''s message_ttl_seconds';
        END IF;
        IF p_max_retries NOT BETWEEN 0 AND 1000 THEN
            PERFORM courier._check_max_retries(p_max_retries);
        END IF;
    END IF;
    IF p_scheduled_at IS NULL AND v_topic.config ? 'delay_seconds' THEN
        v_scheduled_at := now() + make_interval(secs => nullif((v_topic.config ->> 'delay_seconds')::integer, 0));
    END IF;
    v_due := coalesce(v_scheduled_at, now());
    v_size := octet_length(v_payload::text) + coalesce(octet_length(p_payload_binary), 0) + coalesce(octet_length(p_body), 0);
    IF p_key IS NULL THEN
        -- No key, nothing to replace: one statement, as a send's, reads the limits (size,
        -- max_queue_size, max_depth), asks for the wake-up and inserts. It inserts nothing when
        -- a limit stands in the way, and _send_refusal says which; with none left (the topic
        -- enabled meanwhile), round again. No ON CONFLICT: it would insert speculatively, a WAL
        -- record more (48 bytes) in every enqueue. The message is counted below (_count_sent).
        LOOP
            INSERT INTO courier.queue (endpoint_id, payload, payload_binary, body, metadata, scheduled_at,
                                       visible_at, expires_at, max_retries)
            SELECT v_topic.id, v_payload, p_payload_binary, p_body, v_metadata, v_scheduled_at, v_due,
                   v_due + make_interval(secs => coalesce(p_ttl_seconds, nullif(coalesce(
                       (v_topic.config ->> 'message_ttl_seconds')::numeric, l.default_message_ttl), 0))),
                   p_max_retries
            FROM courier.send_limits l,
                 LATERAL (SELECT coalesce((v_topic.config ->> 'max_depth')::bigint, l.default_max_depth) AS max_depth
                          OFFSET 0) d
            WHERE v_topic.enabled AND courier._admit_one(l, v_topic.id, v_size, d.max_depth, v_due <= now())
            RETURNING id, cmin::text::bigint >> 7 INTO v_id, v_slot;
            v_held := set_config('courier.insert_counted', 'off', true) IS NOT NULL;
            EXIT WHEN v_id IS NOT NULL;
            PERFORM courier._send_refusal(p_topic, 1, v_size);
            v_topic := courier._pull_topic(p_topic);
        END LOOP;
        v_held := courier._count_sent_in_slot(v_topic.id, 0, 1, v_slot);
        RETURN v_id;
    END IF;
    -- With a key: every limit a send reads, in one row read once.
    SELECT * INTO v_limits FROM courier.send_limits;
    -- The endpoint's state, the size and max_queue_size, with send()'s errors.
    IF NOT v_topic.enabled OR v_size > v_limits.max_payload_size
       OR NOT courier._room_for(v_limits, 1) THEN
        PERFORM courier._send_refusal(p_topic, 1, v_size);
    END IF;
    v_ttl := nullif(coalesce((v_topic.config ->> 'message_ttl_seconds')::numeric, v_limits.default_message_ttl), 0);

    -- Consumers waiting on the topic (a long poll, a Consumer) are woken at commit, as a send's
    -- workers are (sending.sql): a NOTIFY here would make concurrent enqueues commit one at a time.
    v_wake := set_config('courier.wake_at_commit',
                         CASE WHEN v_due <= now() AND v_limits.notify_on_send THEN 'on' ELSE 'off' END, true);
    LOOP
        IF p_key IS NOT NULL THEN
            UPDATE courier.queue q
            SET payload = v_payload, payload_binary = p_payload_binary, body = p_body, metadata = v_metadata,
                max_retries = coalesce(p_max_retries, q.max_retries),
                scheduled_at = coalesce(p_scheduled_at, q.scheduled_at),
                visible_at = coalesce(p_scheduled_at, q.visible_at),
                expires_at = CASE WHEN p_ttl_seconds IS NOT NULL
                                  THEN coalesce(p_scheduled_at, q.visible_at) + make_interval(secs => p_ttl_seconds)
                                  WHEN p_scheduled_at IS NULL THEN q.expires_at
                                  ELSE courier._ttl_expires_at(v_topic.config, p_scheduled_at) END,
                updated_at = now()
            WHERE q.endpoint_id = v_topic.id AND q.key = p_key AND q.status = 'pending'
            RETURNING q.id INTO v_id;
            IF v_id IS NOT NULL THEN
                v_replaced := true;
                EXIT;
            END IF;
        END IF;

        IF coalesce((v_topic.config ->> 'max_depth')::numeric, v_limits.default_max_depth) > 0 THEN
            PERFORM courier._enforce_max_depth(v_topic.id, 1);
        END IF;
        -- The message is counted below, not by the insert trigger (_count_sent).
        v_held := set_config('courier.insert_counted', 'on', true) IS NOT NULL;
        INSERT INTO courier.queue (endpoint_id, payload, payload_binary, body, metadata, key, scheduled_at,
                                   visible_at, expires_at, max_retries)
        VALUES (v_topic.id, v_payload, p_payload_binary, p_body, v_metadata, p_key, v_scheduled_at,
                v_due, v_due + make_interval(secs => coalesce(p_ttl_seconds, v_ttl)), p_max_retries)
        ON CONFLICT (endpoint_id, key) WHERE key IS NOT NULL AND status IN ('pending', 'processing')
        DO NOTHING
        RETURNING id INTO v_id;
        v_held := set_config('courier.insert_counted', 'off', true) IS NOT NULL;
        IF v_id IS NOT NULL THEN
            EXIT;
        END IF;

        SELECT q.id, q.status, q.visible_at <= now(),
               q.retry_count + 1 > least(coalesce(q.max_retries, courier._endpoint_max_retries(v_topic)),
                                     courier._dlq_retry_cap(v_topic))
        INTO v_id, v_status, v_lapsed, v_exhausted
        FROM courier.queue q
        WHERE q.endpoint_id = v_topic.id AND q.key = p_key AND q.status IN ('pending', 'processing')
        FOR UPDATE;
        IF v_status = 'processing' AND v_lapsed THEN
            -- Its visibility timeout passed: it is due again, as the hint below promises. Handled as
            -- dequeue handles a lapsed lease (the lost attempt counted, the old lease fenced out, past
            -- max_retries into <topic>.dlq), then round again: replaced in place, or queued anew.
            UPDATE courier.queue q
            SET status = CASE WHEN v_exhausted THEN q.status ELSE 'pending' END, lease = courier._next_lease(q.lease),
                retry_count = q.retry_count + 1, visible_at = CASE WHEN v_exhausted THEN q.visible_at ELSE now() END,
                last_error = CASE WHEN v_exhausted
                                  THEN format('[PERMANENT] visibility timeout passed without an ack %s times; '
                                              'max_retries (%s) exceeded', q.retry_count + 1,
                                              coalesce(q.max_retries, courier._endpoint_max_retries(v_topic)))
                                  ELSE 'Visibility timeout passed without an ack' END,
                error_history = q.error_history || jsonb_build_object('attempt', q.retry_count + 1, 'at', now(),
                                                                      'outcome', 'lease_expired', 'lease', q.lease),
                updated_at = now()
            WHERE q.id = v_id;
            IF v_exhausted THEN
                PERFORM courier._pull_dead_letter(ARRAY[v_id]);
            END IF;
            CONTINUE;
        END IF;
        IF v_status = 'processing' THEN
            RAISE EXCEPTION '[courier] message % with key "%" is being processed and cannot be replaced', v_id, p_key
                USING ERRCODE = '23505',
                      HINT = 'Enqueue again once it has been acked or nacked, or its visibility timeout has passed';
        END IF;
        -- It went to pending (nacked) or away (acked) meanwhile: go round again.
    END LOOP;
    IF NOT v_replaced THEN
        v_held := courier._count_sent(v_topic.id, 0);
    END IF;
    -- Replaced in place, the message changed no depth counter, so nothing wakes at commit. Given a
    -- due time, it may have been scheduled for later and be due now: a rare path, woken here.
    -- Without one its due time stands, and whoever waits for it was woken when it was enqueued.
    IF v_replaced AND p_scheduled_at IS NOT NULL AND current_setting('courier.wake_at_commit') = 'on' THEN
        PERFORM pg_notify('courier_new_msg', v_topic.id::text);
    END IF;
    RETURN v_id;
END
$$;

-- Many messages for one topic in one statement, each with enqueue()'s options but a key (a keyed
-- message replaces another and goes through enqueue() alone). Element i is p_payloads[i] (JSON)
-- or p_payloads_binary[i] (bytes, its JSON payload then null), with p_metadata[i],
-- p_scheduled_at[i], p_ttl_seconds[i] and p_max_retries[i]; an option array left NULL, or an
-- element of it, takes enqueue()'s default. Every array given holds one element per message.
-- All are enqueued, or none, with the first bad element named in the error. Ids come back in the
-- order of the elements, and the messages are due in that order. `courier serve` writes the
-- single enqueues that arrive together as one of these: a statement, a counter write and a commit
-- for the lot instead of one each (see console/serve/enqueues.py).
CREATE OR REPLACE FUNCTION courier.enqueue_batch(
    p_topic             text,
    p_payloads          jsonb[],
    p_payloads_binary   bytea[]       DEFAULT NULL,
    p_metadata          jsonb[]       DEFAULT NULL,
    p_scheduled_at      timestamptz[] DEFAULT NULL,
    p_ttl_seconds       integer[]     DEFAULT NULL,
    p_max_retries       integer[]     DEFAULT NULL
) RETURNS bigint[]
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_count integer := greatest(coalesce(cardinality(p_payloads), 0), coalesce(cardinality(p_payloads_binary), 0));
    v_topic courier.endpoints;
    v_largest bigint;
    v_bad_at bigint;      -- the first element enqueue() would refuse, why, and its SQLSTATE
    v_bad text;
    v_bad_code text;
    v_delayed timestamptz;
    v_ttl double precision;
    v_ids bigint[];
    v_held boolean;
BEGIN
    IF (p_payloads IS NOT NULL AND cardinality(p_payloads) <> v_count)
       OR (p_payloads_binary IS NOT NULL AND cardinality(p_payloads_binary) <> v_count)
       OR cardinality(p_metadata) <> v_count OR cardinality(p_scheduled_at) <> v_count
       OR cardinality(p_ttl_seconds) <> v_count OR cardinality(p_max_retries) <> v_count THEN
        RAISE EXCEPTION '[courier] the arrays of a batch must all hold one element per message (%)', v_count
            USING ERRCODE = '22023', HINT = 'Leave an option''s array NULL for its default in every message';
    END IF;
    -- Each element's size as enqueue() counts it, and the first element enqueue() would refuse.
    -- Payloads alone (the usual batch) have only their NULLs to find: 3,000 instructions a message less.
    IF p_metadata IS NULL AND p_scheduled_at IS NULL AND p_ttl_seconds IS NULL AND p_max_retries IS NULL THEN
        SELECT max(octet_length(coalesce(u.payload, 'null')::text) + coalesce(octet_length(u.payload_binary), 0)),
               min(u.ord) FILTER (WHERE u.payload IS NULL AND u.payload_binary IS NULL), 'payload must not be NULL', '22004'
        INTO v_largest, v_bad_at, v_bad, v_bad_code
        FROM unnest(p_payloads, p_payloads_binary) WITH ORDINALITY AS u(payload, payload_binary, ord);
    ELSE
        SELECT max(octet_length(coalesce(u.payload, 'null')::text) + coalesce(octet_length(u.payload_binary), 0)),
               min(u.ord) FILTER (WHERE u.problem IS NOT NULL),
               (array_agg(u.problem ORDER BY u.ord) FILTER (WHERE u.problem IS NOT NULL))[1],
               (array_agg(u.code ORDER BY u.ord) FILTER (WHERE u.problem IS NOT NULL))[1]
        INTO v_largest, v_bad_at, v_bad, v_bad_code
        FROM (SELECT u.*,
                     CASE WHEN u.payload IS NULL AND u.payload_binary IS NULL THEN 'payload must not be NULL'
                          WHEN jsonb_typeof(u.metadata) <> 'object' THEN 'metadata must be a JSON object'
                          WHEN u.metadata <> '{}' AND jsonb_path_exists(u.metadata, 'strict $.**{32}')
                              THEN 'metadata is nested more than 32 levels deep'
                          WHEN NOT isfinite(u.scheduled_at) THEN 'scheduled_at must be a finite time'
                          WHEN u.ttl_seconds NOT BETWEEN 1 AND 31536000
                              THEN format('ttl_seconds must be between 1 and 31536000, got %s', u.ttl_seconds)
                          WHEN u.max_retries NOT BETWEEN 0 AND 1000
                              THEN format('max_retries must be between 0 and 1000, got %s', u.max_retries)
                     END AS problem,
                     CASE WHEN u.payload IS NULL AND u.payload_binary IS NULL THEN '22004' ELSE '22023' END AS code
              FROM unnest(p_payloads, p_payloads_binary, p_metadata, p_scheduled_at, p_ttl_seconds, p_max_retries)
                   WITH ORDINALITY AS u(payload, payload_binary, metadata, scheduled_at, ttl_seconds, max_retries, ord)) u;
    END IF;
    IF v_bad_at IS NOT NULL THEN
        RAISE EXCEPTION '[courier] batch element %: %', v_bad_at, v_bad USING ERRCODE = v_bad_code;
    END IF;

    -- Plain JSON payloads stage as send_batch's do, while dequeues take what is staged.
    IF v_count > 0 AND p_payloads_binary IS NULL AND p_metadata IS NULL AND p_scheduled_at IS NULL
       AND p_ttl_seconds IS NULL AND p_max_retries IS NULL THEN
        v_ids := courier._stage_batch(p_topic, p_payloads, v_largest, true);
        IF v_ids IS NOT NULL THEN
            RETURN v_ids;
        END IF;
    END IF;
    -- As enqueue() does: a drop of the topic waits for this batch; then the limits, all at once.
    v_held := courier._hold_endpoint_for_send(p_topic);
    SELECT * INTO v_topic FROM courier.endpoints e WHERE e.name = p_topic AND e.protocol = 'pull';
    IF NOT FOUND THEN
        v_topic := courier._pull_topic(p_topic);
    END IF;
    v_topic := courier._endpoint_with_room(p_topic, v_count, v_largest);
    IF v_count = 0 THEN
        RETURN '{}';
    END IF;
    v_delayed := now() + make_interval(secs => nullif((v_topic.config ->> 'delay_seconds')::integer, 0));
    v_ttl := courier._message_ttl(v_topic.config);

    -- One wake-up for the batch, when any of it is due now (see the top of sending.sql), and one
    -- counter write (_count_sent), the insert trigger standing aside.
    PERFORM set_config('courier.wake_at_commit',
                       CASE WHEN v_delayed IS NULL AND (p_scheduled_at IS NULL
                                                        OR EXISTS (SELECT FROM unnest(p_scheduled_at) s(at)
                                                                   WHERE s.at IS NULL OR s.at <= now()))
                            THEN 'on' ELSE 'off' END, true);
    PERFORM set_config('courier.insert_counted', 'on', true);
    WITH inserted AS (
        INSERT INTO courier.queue (endpoint_id, payload, payload_binary, metadata, scheduled_at, visible_at,
                                   expires_at, max_retries)
        SELECT v_topic.id, coalesce(u.payload, 'null'), u.payload_binary, coalesce(u.metadata, '{}'),
               coalesce(u.scheduled_at, v_delayed), coalesce(u.scheduled_at, v_delayed, now()),
               coalesce(u.scheduled_at, v_delayed, now())
                   + make_interval(secs => coalesce(u.ttl_seconds::double precision, v_ttl)),
               u.max_retries
        FROM unnest(p_payloads, p_payloads_binary, p_metadata, p_scheduled_at, p_ttl_seconds, p_max_retries)
             WITH ORDINALITY AS u(payload, payload_binary, metadata, scheduled_at, ttl_seconds, max_retries, ord)
        ORDER BY u.ord
        RETURNING id
    )
    SELECT array_agg(id ORDER BY id) INTO v_ids FROM inserted;
    PERFORM set_config('courier.insert_counted', 'off', true);
    PERFORM courier._count_sent(v_topic.id, 0, v_count);
    RETURN v_ids;
END
$$;

-- Dequeue, ack, nack, leases -------------------------------------------------------------------

-- Moves the given pull messages (locked by the caller), which have used up their retries, out
-- of the queue. Into <topic>.dlq (courier.dlq with original_topic and dlq_moved_at, retry_count
-- reset and max_retries 0, as queue-ti, and the error history kept), unless the topic's DLQ
-- threshold is 0: then they end failed, in the archive only (queue-ti's status). Either way the
-- queue row goes to the archive as failed. Returns the ids that ended failed without a DLQ.
CREATE OR REPLACE FUNCTION courier._pull_dead_letter(p_ids bigint[]) RETURNS bigint[]
LANGUAGE plpgsql
AS $$
DECLARE
    v_endpoint_ids integer[];
    v_failed_ids integer[];
    v_failed bigint[];
BEGIN
    WITH leaving AS (
        SELECT m.*, e.name AS topic,
               courier._endpoint_limit(e.config, 'dlq_threshold', 'default_dlq_threshold') > 0 AS to_dlq
        FROM courier.queue m JOIN courier.endpoints e ON e.id = m.endpoint_id
        WHERE m.id = ANY (p_ids)
    ),
    dead AS (
        INSERT INTO courier.dlq (original_message_id, endpoint_id, endpoint_name, payload, headers, metadata,
                                 priority, correlation_id, scheduled_at, expires_at, retry_count, last_error,
                                 error_history, original_created_at, original_topic, dlq_moved_at, key,
                                 payload_binary, body, max_retries)
        SELECT m.id, m.endpoint_id, m.topic, m.payload, m.headers, m.metadata, m.priority, m.correlation_id,
               m.scheduled_at, m.expires_at, 0, m.last_error, m.error_history, m.created_at, m.topic, now(), m.key,
               m.payload_binary, m.body, 0
        FROM leaving m
        WHERE m.to_dlq
        ORDER BY m.id
        RETURNING endpoint_id
    )
    SELECT (SELECT array_agg(endpoint_id) FROM dead),
           (SELECT array_agg(endpoint_id) FROM leaving WHERE NOT to_dlq),
           (SELECT array_agg(id) FROM leaving WHERE NOT to_dlq)
    INTO v_endpoint_ids, v_failed_ids, v_failed;
    PERFORM courier._count_outcomes(v_endpoint_ids, 'dead_lettered');
    PERFORM courier._count_outcomes(v_failed_ids, 'failed');
    PERFORM courier._archive_messages(p_ids, NULL, 'failed');
    RETURN coalesce(v_failed, '{}');
END
$$;

-- What a lease that lapsed does to its message when dequeue takes it again: whether that was
-- its last attempt (then it is parked for the DLQ), its last_error, and its error_history entry.
-- Functions, not expressions in dequeue's UPDATE: PostgreSQL readies every function and operator
-- a statement names in every execution, and these run only for a lapsed lease (20,000
-- instructions of a dequeue(1) + ack as expressions). plpgsql, so that they are not inlined.
CREATE OR REPLACE FUNCTION courier._lease_exhausted(p_retry_count integer, p_max_retries integer, p_default integer,
                                                    p_cap integer) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    RETURN p_retry_count + 1 > least(coalesce(p_max_retries, p_default), p_cap);
END
$$;

CREATE OR REPLACE FUNCTION courier._lease_lapsed_error(p_retry_count integer, p_max_retries integer, p_default integer,
                                                       p_cap integer) RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF courier._lease_exhausted(p_retry_count, p_max_retries, p_default, p_cap) THEN
        RETURN format('[PERMANENT] visibility timeout passed without an ack %s times; max_retries (%s) exceeded',
                      p_retry_count + 1, least(coalesce(p_max_retries, p_default), p_cap));
    END IF;
    RETURN 'Visibility timeout passed without an ack';
END
$$;

CREATE OR REPLACE FUNCTION courier._lease_lapsed_history(p_history jsonb, p_retry_count integer, p_lease integer)
RETURNS jsonb
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN p_history || jsonb_build_object('attempt', p_retry_count + 1, 'at', now(), 'outcome', 'lease_expired',
                                           'lease', p_lease);
END
$$;

-- Takes up to p_count due messages of the topic (never more), highest priority first and in
-- due-time-then-id order within a priority, each with a new lease, invisible to other
-- consumers for the visibility timeout (p_visibility_timeout_seconds, else the topic's
-- visibility_timeout, else the setting). Due means pending
-- and scheduled no later than now, or processing under a lease whose timeout has passed (the
-- consumer died or overran): taking such a message counts the lost attempt, and one already
-- past max_retries goes to the DLQ instead of being handed out again. Expired messages are
-- skipped (the expiry reaper marks them). throughput_limit may return fewer. A disabled
-- topic hands out nothing. A message with an ordering key waits while another message of its
-- key is in processing or ahead of it (whatever their priorities: a key keeps its id order).
--
-- The candidates come one priority level at a time, highest first, each two ranges keyed
-- (endpoint, priority, due time, id): of queue_pull_due_idx (pending messages) and of
-- queue_pull_leased_idx (leased ones, due when the lease lapsed), each stopping at the first
-- message not yet due. A level costs two index descents when it holds nothing due, and no level
-- steps over messages scheduled for later or leased, however many a higher one holds.
--
-- One statement picks the candidates (SKIP LOCKED) and leases them, finding each row again by
-- its ctid (a TID scan; the rows are locked, so their ctids hold): looking the batch up again
-- by id, as two statements must, was a seventh of a dequeue. A candidate past max_retries is
-- not handed out: the same UPDATE records its lost attempt and parks it at visible_at =
-- -infinity, where the probe after it finds it in one step per priority level (no other
-- consumer can take it meanwhile: it stays locked until this transaction ends, by which time
-- it is in the DLQ). A batch that came back full had no such candidate, and skips the probe.
--
-- Plan notes: its statements keep one generic plan each (plan_cache_mode). Left to choose,
-- plpgsql planned the candidates query again on every call: a generic plan cannot see the
-- LIMIT, so it looks dearer than a custom one, and re-planning was about a fifth of a
-- dequeue(10)'s backend CPU. The generic plans are the ones tests/test_pull_plans.py proves are
-- served by indexes: the two pull indexes for the candidates, a TID scan for the update.
CREATE OR REPLACE FUNCTION courier.dequeue(p_topic text, p_count integer DEFAULT 1,
                                           p_visibility_timeout_seconds integer DEFAULT NULL)
RETURNS TABLE (id bigint, lease integer, payload jsonb, payload_binary bytea, body text, metadata jsonb, key text,
               retry_count integer, max_retries integer, created_at timestamptz, visible_until timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
SET jit = off
SET enable_seqscan = off  -- see "A queue is read by its indexes" at the top of this file
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_topic courier.endpoints;
    v_found record;
    v_timeout integer;
    v_max_retries integer;
    v_dlq_cap integer;
    v_rate numeric;
    v_limit integer := p_count;
    v_dead bigint[];
    v_taken integer := 0;
    v_staged integer := 0;
    v_want integer;
    v_got integer;
    v_set text;
BEGIN
    IF p_count IS NULL OR p_count NOT BETWEEN 1 AND 10000 THEN  -- a plain expression: no statement per call
        PERFORM courier._require_count('count', p_count, 10000);
    END IF;
    -- The topic and its values (config's typed columns, migration 0051; else the settings, as
    -- courier.consume_limits holds them: migration 0049) in one statement; _dequeue_topic only when that finds nothing, for <topic>.dlq and
    -- the errors.
    SELECT e AS topic,
           coalesce(p_visibility_timeout_seconds, e.config_visibility_timeout, l.visibility_timeout) AS timeout,
           coalesce(e.config_max_retries, l.default_max_retries) AS max_retries,
           coalesce(e.config_throughput_limit, l.default_throughput_limit) AS rate,
           nullif(coalesce(e.config_dlq_threshold, l.default_dlq_threshold), 0) - 1 AS dlq_cap
    INTO v_found
    FROM courier.endpoints e, courier.consume_limits l
    WHERE e.name = p_topic AND e.protocol = 'pull';
    IF NOT FOUND THEN
        IF courier._dequeue_topic(p_topic) IS NULL THEN  -- <topic>.dlq; a wrong name raises
            RETURN QUERY SELECT * FROM courier._dequeue_dead_letters(p_topic, p_count, p_visibility_timeout_seconds);
        ELSIF NOT EXISTS (SELECT FROM courier.consume_limits) THEN
            RAISE EXCEPTION '[courier] the row of courier.consume_limits is missing' USING ERRCODE = '55000',
                HINT = 'Change any setting (courier.set_setting) to write it again';
        END IF;
        RETURN;  -- else a topic made between the two looks: nothing in it to dequeue yet
    END IF;
    v_topic := v_found.topic;
    v_timeout := v_found.timeout;
    v_max_retries := v_found.max_retries;
    v_rate := v_found.rate;
    v_dlq_cap := v_found.dlq_cap;
    IF v_timeout NOT BETWEEN 1 AND 43200 THEN
        RAISE EXCEPTION '[courier] visibility_timeout_seconds must be between 1 and 43200, got %', v_timeout
            USING ERRCODE = '22023';
    END IF;
    IF NOT v_topic.enabled OR v_topic.paused_at IS NOT NULL THEN  -- paused (pause_endpoint): nothing, no error
        RETURN;
    END IF;
    -- Its first lease: receive looks for lapsed leases on the topic from then on (migration 0059).
    -- The mark never waits, as receive's ordering-key mark: a dequeue that finds the topic's row
    -- locked (another first dequeue marking it, in a transaction still open) goes on without it,
    -- and the next one marks. Until then only receive would miss a lapsed lease; dequeue never does.
    IF NOT v_topic.leases THEN
        UPDATE courier.endpoints SET leases = true
        WHERE id = (SELECT e.id FROM courier.endpoints e WHERE e.id = v_topic.id AND NOT e.leases FOR UPDATE SKIP LOCKED);
    END IF;
    IF v_rate > 0 THEN
        v_limit := courier._take_throughput(v_topic, p_count);
        IF v_limit < 1 THEN
            RETURN;
        END IF;
    END IF;

    -- A lease changes no count: a leased pull message is counted as pending until it is acked
    -- (_counted_status). The update trigger stands aside for this statement rather than read both
    -- transition tables to find that out (15,300 instructions a message of a dequeue(10) + ack).
    LOOP  -- once, or again when the stage held a lapsed lease of the topic (below)
        v_want := v_limit - v_taken - v_staged;
        v_set := set_config('courier.update_counted', 'on', true);
        -- A topic whose messages have never carried an ordering key (endpoints.ordering_keys, which
        -- every write of a keyed message sets in its own transaction: _note_ordering_keys) is
        -- dequeued without the ordering-key checks, whose subplans PostgreSQL readies in every
        -- execution whether or not a row has a key: 52,000 instructions of a dequeue(1) + ack (3.5%).
        -- It takes only messages without a key, so a keyed message committed after the topic was
        -- read above waits for the next dequeue, which reads the mark; none is ever handed out
        -- unchecked, and the order of a key does not depend on the mark.
        IF v_topic.ordering_keys THEN
            RETURN QUERY
            WITH candidates AS (
                -- Each priority level the topic has used (migration 0039), highest first.
                SELECT p.priority, c.tid, c.id, c.due FROM generate_series(10, 0, -1) AS p(priority)
                CROSS JOIN LATERAL (
                    -- Due pending messages and lapsed leases, each from its own index (migration
                    -- 0059), merged in due order. A lapsed lease the merge leaves out stays
                    -- locked, untouched, until this transaction ends: a lapse is rare, and locking
                    -- the two ranges lazily would need a Merge Append, which PostgreSQL does not
                    -- plan for a UNION whose branches lock.
                    -- Ordering keys, as the push claim's rule: one message of a key at a time, in id order.
                    -- No other message of the key in processing under a running lease, and none before it
                    -- (a smaller id) waiting: pending, scheduled, held back, or in processing under a
                    -- lapsed lease, which is taken again first. A batch never holds two of a key: the
                    -- second sees the first pending in the statement's snapshot, as a concurrent consumer
                    -- does until the first one's lease commits. Inline subplans on the ordering indexes
                    -- on ordering_key, run only for rows with a key (a plpgsql function per row was 4x
                    -- dearer: a dequeue past 19,000 messages of busy keys took 125 ms instead of 32 ms).
                    SELECT m.* FROM (
                        SELECT * FROM (
                            SELECT q.ctid AS tid, q.id, q.visible_at AS due
                            FROM courier.queue q
                            WHERE q.endpoint_id = v_topic.id AND q.priority = p.priority
                              AND q.visible_at <= now() AND q.visible_at IS NOT NULL AND q.status = 'pending'
                              AND (q.expires_at IS NULL OR q.expires_at > now())
                              AND (q.ordering_key IS NULL OR (
                                    NOT EXISTS (SELECT 1 FROM courier.queue q2
                                                WHERE q2.ordering_key = q.ordering_key AND q2.status = 'processing'
                                                  AND q2.endpoint_id = q.endpoint_id AND q2.id <> q.id
                                                  AND (q2.visible_at > now() OR q2.id < q.id))
                                AND NOT EXISTS (SELECT 1 FROM courier.queue q2
                                                WHERE q2.ordering_key = q.ordering_key AND q2.status = 'pending'
                                                  AND q2.endpoint_id = q.endpoint_id AND q2.id < q.id)))
                            ORDER BY q.visible_at, q.id
                            LIMIT v_want
                            FOR UPDATE SKIP LOCKED) due
                        UNION ALL
                        SELECT * FROM (
                            SELECT q.ctid AS tid, q.id, q.visible_at AS due
                            FROM courier.queue q
                            WHERE q.endpoint_id = v_topic.id AND q.priority = p.priority
                              AND q.visible_at <= now() AND q.visible_at IS NOT NULL
                              AND q.status = 'processing'
                              AND q.processing_started_at IS NULL  -- the leased index (migration 0059)
                              AND (q.expires_at IS NULL OR q.expires_at > now())
                              AND (q.ordering_key IS NULL OR (
                                    NOT EXISTS (SELECT 1 FROM courier.queue q2
                                                WHERE q2.ordering_key = q.ordering_key AND q2.status = 'processing'
                                                  AND q2.endpoint_id = q.endpoint_id AND q2.id <> q.id
                                                  AND (q2.visible_at > now() OR q2.id < q.id))
                                AND NOT EXISTS (SELECT 1 FROM courier.queue q2
                                                WHERE q2.ordering_key = q.ordering_key AND q2.status = 'pending'
                                                  AND q2.endpoint_id = q.endpoint_id AND q2.id < q.id)))
                            ORDER BY q.visible_at, q.id
                            LIMIT v_want
                            FOR UPDATE SKIP LOCKED) lapsed
                    ) m
                    ORDER BY m.due, m.id
                    LIMIT v_want) c
                WHERE v_topic.priorities & (1 << p.priority) <> 0
                LIMIT v_want
            ),
            leased AS (
                UPDATE courier.queue q
                SET status = 'processing', lease = courier._next_lease(q.lease),
                    visible_at = CASE WHEN q.status = 'processing'
                                           AND courier._lease_exhausted(q.retry_count, q.max_retries, v_max_retries, v_dlq_cap)
                                      THEN '-infinity' ELSE now() + make_interval(secs => v_timeout) END,
                    retry_count = q.retry_count + (q.status = 'processing')::integer,
                    last_error = CASE WHEN q.status <> 'processing' THEN q.last_error
                                      ELSE courier._lease_lapsed_error(q.retry_count, q.max_retries, v_max_retries, v_dlq_cap) END,
                    error_history = CASE WHEN q.status = 'processing'
                                         THEN courier._lease_lapsed_history(q.error_history, q.retry_count, q.lease)
                                         ELSE q.error_history END,
                    updated_at = now()
                WHERE q.ctid = ANY (ARRAY(SELECT c.tid FROM candidates c))
                RETURNING q.id, q.lease, q.payload, q.payload_binary, q.body, q.metadata, q.key, q.retry_count,
                          q.max_retries, q.created_at, q.visible_at
            )
            SELECT t.id, t.lease, t.payload, t.payload_binary, t.body, t.metadata, t.key, t.retry_count,
                   coalesce(t.max_retries, v_max_retries), t.created_at, t.visible_at
            FROM leased t JOIN candidates c ON c.id = t.id
            WHERE t.visible_at <> '-infinity'  -- not parked for the DLQ (below)
            ORDER BY c.priority DESC, c.due, c.id;
        ELSE  -- the same statement but for the ordering-key test (tests/test_pull_integrity.py holds them so)
            RETURN QUERY
            WITH candidates AS (
                -- Each priority level the topic has used (migration 0039), highest first.
                SELECT p.priority, c.tid, c.id, c.due FROM generate_series(10, 0, -1) AS p(priority)
                CROSS JOIN LATERAL (
                    -- Due pending messages and lapsed leases, each from its own index (migration
                    -- 0059), merged in due order. A lapsed lease the merge leaves out stays
                    -- locked, untouched, until this transaction ends: a lapse is rare, and locking
                    -- the two ranges lazily would need a Merge Append, which PostgreSQL does not
                    -- plan for a UNION whose branches lock.
                    SELECT m.* FROM (
                        SELECT * FROM (
                            SELECT q.ctid AS tid, q.id, q.visible_at AS due
                            FROM courier.queue q
                            WHERE q.endpoint_id = v_topic.id AND q.priority = p.priority
                              AND q.visible_at <= now() AND q.visible_at IS NOT NULL AND q.status = 'pending'
                              AND (q.expires_at IS NULL OR q.expires_at > now())
                              AND q.ordering_key IS NULL  -- the topic has never had one (see above)
                            ORDER BY q.visible_at, q.id
                            LIMIT v_want
                            FOR UPDATE SKIP LOCKED) due
                        UNION ALL
                        SELECT * FROM (
                            SELECT q.ctid AS tid, q.id, q.visible_at AS due
                            FROM courier.queue q
                            WHERE q.endpoint_id = v_topic.id AND q.priority = p.priority
                              AND q.visible_at <= now() AND q.visible_at IS NOT NULL
                              AND q.status = 'processing'
                              AND q.processing_started_at IS NULL  -- the leased index (migration 0059)
                              AND (q.expires_at IS NULL OR q.expires_at > now())
                              AND q.ordering_key IS NULL  -- the topic has never had one (see above)
                            ORDER BY q.visible_at, q.id
                            LIMIT v_want
                            FOR UPDATE SKIP LOCKED) lapsed
                    ) m
                    ORDER BY m.due, m.id
                    LIMIT v_want) c
                WHERE v_topic.priorities & (1 << p.priority) <> 0
                LIMIT v_want
            ),
            leased AS (
                UPDATE courier.queue q
                SET status = 'processing', lease = courier._next_lease(q.lease),
                    visible_at = CASE WHEN q.status = 'processing'
                                           AND courier._lease_exhausted(q.retry_count, q.max_retries, v_max_retries, v_dlq_cap)
                                      THEN '-infinity' ELSE now() + make_interval(secs => v_timeout) END,
                    retry_count = q.retry_count + (q.status = 'processing')::integer,
                    last_error = CASE WHEN q.status <> 'processing' THEN q.last_error
                                      ELSE courier._lease_lapsed_error(q.retry_count, q.max_retries, v_max_retries, v_dlq_cap) END,
                    error_history = CASE WHEN q.status = 'processing'
                                         THEN courier._lease_lapsed_history(q.error_history, q.retry_count, q.lease)
                                         ELSE q.error_history END,
                    updated_at = now()
                WHERE q.ctid = ANY (ARRAY(SELECT c.tid FROM candidates c))
                RETURNING q.id, q.lease, q.payload, q.payload_binary, q.body, q.metadata, q.key, q.retry_count,
                          q.max_retries, q.created_at, q.visible_at
            )
            SELECT t.id, t.lease, t.payload, t.payload_binary, t.body, t.metadata, t.key, t.retry_count,
                   coalesce(t.max_retries, v_max_retries), t.created_at, t.visible_at
            FROM leased t JOIN candidates c ON c.id = t.id
            WHERE t.visible_at <> '-infinity'  -- not parked for the DLQ (below)
            ORDER BY c.priority DESC, c.due, c.id;
        END IF;
        GET DIAGNOSTICS v_got = ROW_COUNT;
        v_taken := v_taken + v_got;
        v_set := set_config('courier.update_counted', 'off', true);
        -- Then the stage (plain enqueues and sends, migration 0054): newer than what the queue held,
        -- priority 0, no key, no delay, so nothing above should have gone after them. A message
        -- leased there whose lease lapsed is moved into the queue by the look (_take_staged), which
        -- says so in courier.stage_lapsed: the queue is looked at once more, to take it again now.
        EXIT WHEN v_taken + v_staged >= v_limit;
        RETURN QUERY
        SELECT s.id, s.lease, s.payload, NULL::bytea, NULL::text, '{}'::jsonb, NULL::text, 0, v_max_retries,
               s.created_at, s.visible_until
        FROM courier._take_staged(v_topic.id, v_limit - v_taken - v_staged, NULL, v_timeout) s;
        GET DIAGNOSTICS v_got = ROW_COUNT;
        v_staged := v_staged + v_got;
        EXIT WHEN v_taken + v_staged >= v_limit OR current_setting('courier.stage_lapsed', true) IS DISTINCT FROM 'on';
        v_set := set_config('courier.stage_lapsed', 'off', true);
    END LOOP;
    IF v_rate > 0 THEN
        PERFORM courier._return_throughput(v_topic, v_limit - v_taken - v_staged);
    END IF;

    IF v_taken < v_limit THEN  -- a full batch had no candidate past max_retries: nothing parked
        -- One range per level, as the candidates: a plain join was left to the statistics, and
        -- with few leased rows when planned, its generic plan read every leased pull message.
        -- At most v_limit per level: only this call's parked rows are visible (others' are
        -- uncommitted until they are in the DLQ).
        SELECT array_agg(d.id) INTO v_dead
        FROM generate_series(10, 0, -1) AS p(priority)
        CROSS JOIN LATERAL (
            SELECT q.id FROM courier.queue q
            WHERE q.endpoint_id = v_topic.id AND q.priority = p.priority
              AND q.visible_at = '-infinity' AND q.visible_at IS NOT NULL
              AND q.status = 'processing' AND q.processing_started_at IS NULL  -- parked rows: the leased index
            LIMIT v_limit) d
        WHERE v_topic.priorities & (1 << p.priority) <> 0;
        IF v_dead IS NOT NULL THEN
            PERFORM courier._pull_dead_letter(v_dead);
        END IF;
    END IF;
END
$$;

-- Long poll in SQL (pgmq's read_with_poll, SQS's WaitTimeSeconds), for clients that speak only
-- SQL and cannot LISTEN: CALL courier.dequeue_wait(topic, count, visibility_timeout_seconds,
-- wait_seconds) answers with what dequeue() would, as soon as there is anything, else after
-- wait_seconds (0 to 20, SQS's bound) with nothing: a JSON array in its INOUT parameter
-- messages, one object per message with dequeue()'s columns (payload_binary in base64), [] for
-- none. JSON, because every client reads it; an array of a composite type needs each driver
-- taught the type, and a refcursor closes with the transaction the CALL ends in.
--
-- A procedure, not a function: a function runs in one transaction, and its statement's snapshot
-- holds back the xmin horizon (what vacuum may remove, in every table of the database) for the
-- whole wait, while its now() stands still, so that a schedule coming due or a lease lapsing
-- would go unseen. pgmq's read_with_poll loops with pg_sleep in such a function. This one
-- commits after an empty try and after each sleep, so that every try is a transaction of its
-- own. The sleeps hold a snapshot (PL/pgSQL takes one for any statement after a COMMIT), for
-- at most 250 ms and taken afresh each time: the horizon trails by no more than a short query
-- would hold it. It sleeps 10 ms, doubling to 250 ms, between tries, and 10 ms again while a
-- producer's commit to the topic is under way (topic_sends_committing(), as a Consumer's
-- linger). A notification cannot reach it (they wait until the session is idle), so a message
-- is taken within one sleep of its commit.
--
-- COMMIT in a procedure needs a CALL that is a statement of its own outside a transaction block,
-- and a procedure that is neither SECURITY DEFINER nor SETs a setting: this one runs with the
-- caller's rights (dequeue is granted to courier_application) and names its functions by
-- schema. In a transaction block (after BEGIN, in a string of several statements, from a
-- function) a wait_seconds above 0 is refused at once, before any dequeue, with 2D000: waiting
-- there would hold the snapshot it exists to let go, and one try instead would turn a client's
-- waiting loop into a busy loop. wait_seconds 0 is one try, a dequeue(), anywhere.
CREATE OR REPLACE PROCEDURE courier.dequeue_wait(p_topic text, p_count integer DEFAULT 1,
                                                 p_visibility_timeout_seconds integer DEFAULT NULL,
                                                 p_wait_seconds integer DEFAULT 5,
                                                 INOUT messages jsonb DEFAULT NULL)
LANGUAGE plpgsql
AS $$
DECLARE
    v_deadline timestamptz;
    v_sleep double precision := 0.01;
    v_atomic text;
    v_here text;
BEGIN
    IF p_wait_seconds IS NULL OR p_wait_seconds NOT BETWEEN 0 AND 20 THEN
        RAISE EXCEPTION '[courier] wait_seconds must be between 0 and 20, got %', coalesce(p_wait_seconds::text, 'NULL')
            USING ERRCODE = '22023', HINT = 'Seconds to wait for a message (at most 20, as SQS''s long poll); 0 makes one try';
    END IF;
    IF p_wait_seconds > 0 THEN
        -- Whether this CALL may commit. In a block with an exception handler (a subtransaction)
        -- a COMMIT is refused either way, and the refusal says why: "cannot commit while a
        -- subtransaction is active" where the CALL could commit, else the refusal of a context
        -- that cannot, which a DO in such a block always meets. Compared as the server words
        -- them (lc_messages), whatever its language.
        BEGIN
            DO $probe$ BEGIN COMMIT; END $probe$;
        EXCEPTION WHEN invalid_transaction_termination THEN
            v_atomic := SQLERRM;
        END;
        BEGIN
            COMMIT;
        EXCEPTION WHEN invalid_transaction_termination THEN
            v_here := SQLERRM;
        END;
        IF v_here IS NOT DISTINCT FROM v_atomic THEN
            RAISE EXCEPTION '[courier] dequeue_wait cannot wait inside a transaction block'
                USING ERRCODE = '2D000',
                      DETAIL = 'It commits between its tries, so that it holds no snapshot while it waits.',
                      HINT = 'CALL it as a statement of its own in autocommit mode (not after BEGIN, nor from a '
                             'function), or pass p_wait_seconds => 0 for one try';
        END IF;
        v_deadline := pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => p_wait_seconds);
    END IF;
    LOOP
        SELECT coalesce(pg_catalog.jsonb_agg(
                   pg_catalog.to_jsonb(d) - 'ordinality'
                   || pg_catalog.jsonb_build_object('payload_binary',
                          pg_catalog.translate(pg_catalog.encode(d.payload_binary, 'base64'), E'\n', ''))
                   ORDER BY d.ordinality), '[]')
        INTO messages
        FROM courier.dequeue(p_topic, p_count, p_visibility_timeout_seconds) WITH ORDINALITY AS d;
        EXIT WHEN pg_catalog.jsonb_array_length(messages) > 0 OR p_wait_seconds = 0
                  OR pg_catalog.clock_timestamp() >= v_deadline;
        IF courier.topic_sends_committing(p_topic) THEN
            v_sleep := 0.01;
        END IF;
        COMMIT;  -- the empty try's transaction, and its snapshot, end here
        PERFORM pg_catalog.pg_sleep(greatest(0, least(v_sleep,
                    extract(epoch FROM v_deadline - pg_catalog.clock_timestamp()))));
        COMMIT;  -- and the sleep's: the next try has a snapshot and a now() of its own
        v_sleep := least(v_sleep * 2, 0.25);
    END LOOP;
END
$$;

-- Archives a completed copy of the pull messages at p_tids (locked by the caller, which
-- deletes them next: each has an idempotency key and is being acked or received). The archive
-- keeps their keys, which _delivered_key_holder finds for idempotency_retention_seconds: a
-- producer's retry, or a publish retried after its fan-out was consumed, gets the delivered
-- message's id instead of queueing a second copy, as for a delivered push message.
CREATE OR REPLACE FUNCTION courier._keep_delivered_keys(p_tids tid[]) RETURNS void
LANGUAGE sql
AS $$
    INSERT INTO courier.archive (id, endpoint_id, payload, headers, metadata, status, priority, retry_count,
                                 max_retries, scheduled_at, expires_at, idempotency_key, correlation_id,
                                 ordering_key, last_error, error_history, completed_at, created_at, key,
                                 payload_binary, body)
    SELECT m.id, m.endpoint_id, m.payload, m.headers, m.metadata, 'completed', m.priority, m.retry_count,
           m.max_retries, m.scheduled_at, m.expires_at, m.idempotency_key, m.correlation_id, m.ordering_key,
           m.last_error, m.error_history, now(), m.created_at, m.key, m.payload_binary, m.body
    FROM courier.queue m
    WHERE m.ctid = ANY (p_tids) AND m.idempotency_key IS NOT NULL
$$;

-- Acks messages held under their leases: each is deleted (queue-ti's "deleted": done, gone for
-- good; a DELETE touches no index, which keeps a consumer's ack as cheap as the raw claim-and-
-- delete it replaces). Per id, in the order given: 'acked'; 'lease_lost' when the message is
-- still there under another lease (its visibility timeout passed and another consumer took it:
-- the ack is refused, counted and logged); 'not_found' when nothing is held under that id and
-- lease (unknown id, already acked, dead-lettered, expired or received).
-- A message with an idempotency key is archived as completed too (_keep_delivered_keys), so that
-- its key turns duplicates away for idempotency_retention_seconds as a delivered push message's
-- does; the first DELETE leaves such rows alone, and only an ack that holds one pays for that.
--
-- Plan notes: the rows are found by primary key (= ANY), and each one's lease is looked up in
-- a jsonb object of id -> lease rather than joined to unnest(p_ids, p_leases). The join's plan
-- followed the statistics: with few rows in processing when the table was last analyzed, the
-- planner expected one row and chose a nested loop that re-read the unnest for every row
-- (100 x 100 comparisons, 2.6 ms of an ack of 100 instead of 0.4 ms). A lookup has no plan to
-- get wrong, so the statement keeps one generic plan (plan_cache_mode), as do nack's,
-- extend_lease's and _give_back's. Left to choose, plpgsql went on planning it in every call
-- wherever the statistics made the generic plan look dearer than a custom one (a topic never
-- analyzed, for one): 142 us of planning in an ack of one that then ran in 59 us.
CREATE OR REPLACE FUNCTION courier.ack(p_ids bigint[], p_leases integer[])
RETURNS TABLE (id bigint, result text)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
SET jit = off
SET enable_seqscan = off  -- see "A queue is read by its indexes" at the top of this file
SET plan_cache_mode = force_generic_plan  -- see ack's plan notes
AS $$
#variable_conflict use_column
DECLARE
    v_acked bigint[];
    v_count integer := 0;
    v_leases jsonb;
    v_tids tid[];
    v_endpoint_ids integer[];
    v_writes integer;
    v_set text;
BEGIN
    IF NOT coalesce(courier._pull_leases_ok(p_ids, p_leases), false) THEN
        PERFORM courier._require_pull_leases(p_ids, p_leases);
    END IF;
    v_leases := jsonb_object(p_ids::text[], p_leases::text[]);
    -- The delivered counters (as _count_outcomes keeps them) and the depth counter (a leased pull
    -- message is counted pending: _counted_status) in the same statement as the DELETE, which
    -- already has the acked rows; the delete trigger stands aside (courier.delete_counted).
    v_writes := coalesce(nullif(current_setting('courier.depth_writes', true), '')::integer, 0);
    v_set := set_config('courier.depth_writes', (v_writes + 1)::text, true)
             || set_config('courier.delete_counted', 'on', true);
    -- The stage first for a lease taken there (_stage_lease; the leader may have moved the
    -- message into the queue since, lease and all), then the queue for the rest: a move under way
    -- is waited for and its row found gone, and the next statement sees it in the queue.
    IF courier._any_stage_lease(p_leases) THEN
        -- A staged message is not in the depth counters until it is moved: only delivered counts.
        WITH acked AS (
            DELETE FROM courier.send_stage s
            WHERE s.id = ANY (p_ids) AND s.visible_until IS NOT NULL AND s.lease = (v_leases ->> s.id::text)::integer
            RETURNING s.id, s.endpoint_id
        ),
        counted AS (
            INSERT INTO courier.delivery_totals AS d (endpoint_id, outcome, backend_pid, total)
            SELECT a.endpoint_id, 'delivered', pg_backend_pid(), count(*) FROM acked a GROUP BY a.endpoint_id
            ON CONFLICT (endpoint_id, outcome, backend_pid) DO UPDATE SET total = d.total + excluded.total
        )
        SELECT array_agg(a.id), count(*) INTO v_acked, v_count FROM acked a;
    END IF;
    IF v_count < cardinality(p_ids) THEN
        WITH acked AS (
            DELETE FROM courier.queue q
            WHERE q.id = ANY (p_ids) AND q.status = 'processing' AND q.visible_at IS NOT NULL
              AND q.lease = (v_leases ->> q.id::text)::integer AND q.idempotency_key IS NULL
            RETURNING q.id, q.endpoint_id
        ),
        counted AS (
            INSERT INTO courier.delivery_totals AS d (endpoint_id, outcome, backend_pid, total)
            SELECT a.endpoint_id, 'delivered', pg_backend_pid(), count(*) FROM acked a GROUP BY a.endpoint_id
            ON CONFLICT (endpoint_id, outcome, backend_pid) DO UPDATE SET total = d.total + excluded.total
        ),
        depth AS (
            INSERT INTO courier.queue_depth AS d (endpoint_id, status, backend_pid, slot, messages)
            SELECT a.endpoint_id, 'pending', pg_backend_pid(), v_writes >> 6, -count(*) FROM acked a GROUP BY a.endpoint_id
            ON CONFLICT (endpoint_id, status, backend_pid, slot) DO UPDATE SET messages = d.messages + excluded.messages
        )
        SELECT v_acked || array_agg(a.id), v_count + count(*) INTO v_acked, v_count FROM acked a;
    END IF;
    v_set := set_config('courier.delete_counted', 'off', true);
    IF v_count = cardinality(p_ids) THEN  -- the common case: all acked, no second look needed
        RETURN QUERY SELECT u.id, 'acked'::text FROM unnest(p_ids) AS u(id);
        RETURN;
    END IF;
    IF 0 > ANY (p_leases) THEN  -- dead letters of <topic>.dlq (negative leases: _settle_dead_letters)
        v_acked := v_acked || courier._settle_dead_letters('ack', p_ids, p_leases);
        IF cardinality(v_acked) = cardinality(p_ids) THEN
            RETURN QUERY SELECT u.id, 'acked'::text FROM unnest(p_ids) AS u(id);
            RETURN;
        END IF;
    END IF;
    v_tids := ARRAY(SELECT q.ctid FROM courier.queue q
                    WHERE q.id = ANY (p_ids) AND q.status = 'processing' AND q.visible_at IS NOT NULL
                      AND q.lease = (v_leases ->> q.id::text)::integer AND q.idempotency_key IS NOT NULL
                    FOR UPDATE);
    IF cardinality(v_tids) > 0 THEN
        PERFORM courier._keep_delivered_keys(v_tids);
        WITH acked AS (
            DELETE FROM courier.queue q WHERE q.ctid = ANY (v_tids)
            RETURNING q.id, q.endpoint_id
        )
        SELECT v_acked || array_agg(a.id), array_agg(a.endpoint_id) INTO v_acked, v_endpoint_ids FROM acked a;
        PERFORM courier._count_outcomes(v_endpoint_ids, 'delivered');
        IF cardinality(v_acked) = cardinality(p_ids) THEN
            RETURN QUERY SELECT u.id, 'acked'::text FROM unnest(p_ids) AS u(id);
            RETURN;
        END IF;
    END IF;
    RETURN QUERY SELECT * FROM courier._lease_results(p_ids, p_leases, v_acked, 'acked', 'ack');
END
$$;

-- The per-id results of a fenced call that applied to the ids in p_done.
-- An id given twice under two leases is refused (22023), and the whole call with it: one of the
-- leases is stale, and which one the call applied was an accident of its plan (ack(ARRAY[4,4],
-- ARRAY[1,0]) took the last lease and left the message in processing). The same id and lease
-- twice is the same request twice: applied once, its result given for both. Every fenced call
-- ends here whenever it did not apply to every id it was given, which an id given twice always
-- causes (a row changes once): ack's common case, all applied, pays nothing for the check.
CREATE OR REPLACE FUNCTION courier._lease_results(p_ids bigint[], p_leases integer[], p_done bigint[],
                                                  p_done_result text, p_kind text)
RETURNS TABLE (id bigint, result text)
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict use_column
DECLARE
    v_lost bigint[];
    v_repeated record;
BEGIN
    -- A message still taken in the send stage under another lease is there to be found lost.
    PERFORM courier._unstage_ids(p_ids);
    SELECT u.id, string_agg(DISTINCT u.lease::text, ', ') AS leases INTO v_repeated
    FROM unnest(p_ids, p_leases) WITH ORDINALITY AS u(id, lease, ord)
    GROUP BY u.id HAVING count(DISTINCT u.lease) > 1
    ORDER BY min(u.ord) LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION '[courier] ids: message % is given under several leases (%) in one % call',
                v_repeated.id, v_repeated.leases, p_kind
            USING ERRCODE = '22023', HINT = 'Name each message once, with the lease its dequeue returned';
    END IF;
    IF 0 > ANY (p_leases) THEN
        -- Dead letters of <topic>.dlq among them (negative leases): each id looked up in the table
        -- its lease names. A dead letter is lost when it is still in the DLQ under another lease.
        SELECT array_agg(u.id) FILTER (WHERE u.lost) INTO v_lost FROM (
            SELECT u.id, u.id <> ALL (coalesce(p_done, '{}'))
                         AND CASE WHEN u.lease < 0
                                  THEN EXISTS (SELECT 1 FROM courier.dlq d WHERE d.id = u.id AND d.status = 'failed'
                                                                             AND d.lease <> u.lease)
                                  ELSE EXISTS (SELECT 1 FROM courier.queue q WHERE q.id = u.id
                                                                               AND q.visible_at IS NOT NULL
                                                                               AND q.lease <> u.lease
                                                                               AND q.lease <> 0) END AS lost
            FROM unnest(p_ids, p_leases) AS u(id, lease)) u;
        RETURN QUERY
        SELECT u.id, CASE WHEN u.id = ANY (coalesce(p_done, '{}')) THEN p_done_result
                          WHEN u.id = ANY (coalesce(v_lost, '{}')) THEN 'lease_lost'
                          ELSE 'not_found' END
        FROM unnest(p_ids, p_leases) WITH ORDINALITY AS u(id, lease, ord)
        ORDER BY u.ord;
        PERFORM courier._count_stale_reports(p_kind, coalesce(cardinality(v_lost), 0), v_lost);
        RETURN;
    END IF;
    RETURN QUERY
    SELECT u.id,
           CASE WHEN u.id = ANY (coalesce(p_done, '{}')) THEN p_done_result
                -- Lease 0: never dequeued, so no lease of it was lost; it is not leased.
                WHEN q.id IS NOT NULL AND q.lease <> u.lease AND q.lease <> 0 THEN 'lease_lost'
                ELSE 'not_found' END
    FROM unnest(p_ids, p_leases) WITH ORDINALITY AS u(id, lease, ord)
    LEFT JOIN courier.queue q ON q.id = u.id AND q.visible_at IS NOT NULL
    ORDER BY u.ord;
    IF coalesce(cardinality(p_done), 0) < cardinality(p_ids) THEN
        SELECT array_agg(u.id) INTO v_lost
        FROM unnest(p_ids, p_leases) AS u(id, lease) JOIN courier.queue q ON q.id = u.id
        WHERE q.visible_at IS NOT NULL AND q.lease <> u.lease AND q.lease <> 0 AND u.id <> ALL (coalesce(p_done, '{}'));
        PERFORM courier._count_stale_reports(p_kind, coalesce(cardinality(v_lost), 0), v_lost);
    END IF;
END
$$;

-- The one-message forms of ack, nack and snooze pass their message to the array form, which
-- does and checks everything as its owner. plpgsql, so that the call is planned once: as SQL
-- with a SET clause it was never inlined and was planned in every call. SECURITY INVOKER with no
-- search_path of their own, since they name nothing but the array form, schema-qualified, by its
-- exact argument types: on PostgreSQL 15 leaving a function with a SET clause walks every
-- setting. Callgrind, a dequeue(1) and a one-message ack: 1,347,589 -> 1,280,114 instructions
-- (the array form: 1,268,631).
CREATE OR REPLACE FUNCTION courier.ack(p_id bigint, p_lease integer) RETURNS text
LANGUAGE plpgsql SECURITY INVOKER
AS $$ BEGIN RETURN (SELECT a.result FROM courier.ack(ARRAY[p_id], ARRAY[p_lease]) a); END $$;

-- Nacks messages held under their leases, with an error: each goes back to pending, due again
-- after p_delay_seconds (0: at once) ('nacked', its retry_count one higher), or once that
-- passes max_retries (the message's, else the topic's max_retries, else its retry_policy's,
-- else default_max_retries) to <topic>.dlq ('dead_lettered'), or with the topic's DLQ off to
-- the archive ('failed'). 'lease_lost' and 'not_found' as for ack(). With p_count_attempt
-- false it is a snooze (River's JobSnooze): see snooze().
-- It took only an error before the delay and count_attempt (issue 42): the same name with more
-- defaulted arguments would make every call with three arguments ambiguous.
DROP FUNCTION IF EXISTS courier.nack(bigint[], integer[], text);
DROP FUNCTION IF EXISTS courier.nack(bigint, integer, text);
CREATE OR REPLACE FUNCTION courier.nack(p_ids bigint[], p_leases integer[], p_error text DEFAULT NULL,
                                        p_delay_seconds integer DEFAULT 0, p_count_attempt boolean DEFAULT true)
RETURNS TABLE (id bigint, result text)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
SET jit = off
SET enable_seqscan = off  -- see "A queue is read by its indexes" at the top of this file
SET plan_cache_mode = force_generic_plan  -- see ack's plan notes
AS $$
#variable_conflict use_column
DECLARE
    v_error text := courier._redact_text(left(p_error, 10000));
    v_nacked bigint[];
    v_dead bigint[];
    v_failed bigint[] := '{}';
    v_leases jsonb;
    v_set text;
BEGIN
    IF NOT coalesce(courier._pull_leases_ok(p_ids, p_leases), false) THEN
        PERFORM courier._require_pull_leases(p_ids, p_leases);
    END IF;
    PERFORM courier._require_delay(p_delay_seconds);
    IF p_count_attempt IS NULL THEN
        PERFORM courier._raise_invalid('count_attempt must be true or false, got NULL');
    ELSIF NOT p_count_attempt THEN
        RETURN QUERY SELECT z.id, z.result FROM courier.snooze(p_ids, p_leases, p_delay_seconds) z;
        RETURN;
    END IF;
    IF courier._any_stage_lease(p_leases) THEN  -- leased where they were staged: into the queue, lease and all
        PERFORM courier._unstage_ids(p_ids);
    END IF;
    v_leases := jsonb_object(p_ids::text[], p_leases::text[]);  -- as _give_back
    -- A nack moves no count (_counted_status; one past its retries stays in processing until it
    -- is dead-lettered, a DELETE): the update trigger stands aside.
    v_set := set_config('courier.update_counted', 'on', true);
    -- Past max_retries or the DLQ threshold, as dequeue reads them (config's typed columns, else
    -- consume_limits) in the statement: no call per message. One UPDATE, whose WHERE a concurrent
    -- settle makes PostgreSQL check again on the row's new version (so two nacks of one lease
    -- count one attempt), with no row lock taken first: a SELECT ... FOR UPDATE before it wrote a
    -- lock record of 54 bytes a message. A message past its retries stays in processing (the
    -- dead-letter step below deletes it): that is how RETURNING tells it apart.
    WITH nacked AS (
        UPDATE courier.queue q
        SET retry_count = q.retry_count + 1, last_error = v_error, updated_at = now(),
            error_history = q.error_history || jsonb_build_object('attempt', q.retry_count + 1, 'at', now(),
                                                                  'outcome', 'nack', 'error', v_error),
            status = CASE WHEN q.retry_count + 1 > least(coalesce(q.max_retries, e.config_max_retries, l.default_max_retries),
                                                         nullif(coalesce(e.config_dlq_threshold, l.default_dlq_threshold), 0) - 1)
                          THEN q.status ELSE 'pending' END,
            visible_at = CASE WHEN q.retry_count + 1 > least(coalesce(q.max_retries, e.config_max_retries, l.default_max_retries),
                                                             nullif(coalesce(e.config_dlq_threshold, l.default_dlq_threshold), 0) - 1)
                              THEN q.visible_at ELSE now() + make_interval(secs => p_delay_seconds) END
        FROM courier.endpoints e LEFT JOIN courier.consume_limits l ON true  -- never missing (see dequeue); were it, no cap
        WHERE q.id = ANY (p_ids) AND q.status = 'processing' AND q.visible_at IS NOT NULL
          AND q.lease = (v_leases ->> q.id::text)::integer AND e.id = q.endpoint_id
        RETURNING q.id, q.status = 'processing' AS exhausted
    )
    SELECT array_agg(n.id) FILTER (WHERE NOT n.exhausted), array_agg(n.id) FILTER (WHERE n.exhausted)
    INTO v_nacked, v_dead FROM nacked n;
    v_set := set_config('courier.update_counted', 'off', true);
    IF 0 > ANY (p_leases) THEN  -- dead letters of <topic>.dlq: back to it, never further
        v_nacked := v_nacked || courier._settle_dead_letters('nack', p_ids, p_leases,
                                                             now() + make_interval(secs => p_delay_seconds), v_error);
    END IF;
    IF v_dead IS NOT NULL THEN
        v_failed := courier._pull_dead_letter(v_dead);
    END IF;
    IF v_dead IS NULL AND cardinality(v_nacked) = cardinality(p_ids) THEN  -- the common case: all nacked
        RETURN QUERY SELECT u.id, 'nacked'::text FROM unnest(p_ids) AS u(id);
        RETURN;
    END IF;
    RETURN QUERY
    SELECT r.id, CASE WHEN r.id = ANY (v_failed) THEN 'failed'
                      WHEN r.id = ANY (coalesce(v_dead, '{}')) THEN 'dead_lettered' ELSE r.result END
    FROM courier._lease_results(p_ids, p_leases, v_nacked || v_dead, 'nacked', 'nack') r;
END
$$;

CREATE OR REPLACE FUNCTION courier.nack(p_id bigint, p_lease integer, p_error text DEFAULT NULL,
                                        p_delay_seconds integer DEFAULT 0, p_count_attempt boolean DEFAULT true)
RETURNS text
LANGUAGE plpgsql SECURITY INVOKER  -- as ack's one-message form
AS $$
BEGIN
    RETURN (SELECT n.result FROM courier.nack(ARRAY[p_id], ARRAY[p_lease], p_error, p_delay_seconds, p_count_attempt) n);
END
$$;

-- How long a nack or a snooze keeps a message out of sight: 0 (due at once) to 12 hours, the
-- bound of a visibility timeout.
CREATE OR REPLACE FUNCTION courier._require_delay(p_delay_seconds integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_delay_seconds IS NULL OR p_delay_seconds NOT BETWEEN 0 AND 43200 THEN
        RAISE EXCEPTION '[courier] delay_seconds must be between 0 and 43200, got %', coalesce(p_delay_seconds::text, 'NULL')
            USING ERRCODE = '22023', HINT = 'Seconds until the message is due again (at most 12 hours)';
    END IF;
END
$$;

-- Extends the visibility timeout of held messages to now + p_visibility_timeout_seconds (the
-- consumer's heartbeat for long work). Per id: 'extended' with the new deadline, or
-- 'lease_lost' / 'not_found' as for ack().
CREATE OR REPLACE FUNCTION courier.extend_lease(p_ids bigint[], p_leases integer[], p_visibility_timeout_seconds integer)
RETURNS TABLE (id bigint, result text, visible_until timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
SET jit = off
SET enable_seqscan = off  -- see "A queue is read by its indexes" at the top of this file
SET plan_cache_mode = force_generic_plan  -- see ack's plan notes
AS $$
#variable_conflict use_column
DECLARE
    v_extended bigint[];
    v_leases jsonb;
    v_set text;
    v_until timestamptz := now() + make_interval(secs => p_visibility_timeout_seconds);
BEGIN
    IF NOT coalesce(courier._pull_leases_ok(p_ids, p_leases), false) THEN
        PERFORM courier._require_pull_leases(p_ids, p_leases);
    END IF;
    IF p_visibility_timeout_seconds IS NULL OR p_visibility_timeout_seconds NOT BETWEEN 1 AND 43200 THEN
        RAISE EXCEPTION '[courier] visibility_timeout_seconds must be between 1 and 43200, got %',
                coalesce(p_visibility_timeout_seconds::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF courier._any_stage_lease(p_leases) THEN  -- as nack
        PERFORM courier._unstage_ids(p_ids);
    END IF;
    v_leases := jsonb_object(p_ids::text[], p_leases::text[]);  -- as _give_back
    v_set := set_config('courier.update_counted', 'on', true);  -- a longer lease moves no count
    WITH extended AS (
        UPDATE courier.queue q SET visible_at = v_until
        WHERE q.id = ANY (p_ids) AND q.status = 'processing' AND q.visible_at IS NOT NULL
          AND q.lease = (v_leases ->> q.id::text)::integer
        RETURNING q.id
    )
    SELECT array_agg(x.id) INTO v_extended FROM extended x;
    v_set := set_config('courier.update_counted', 'off', true);
    IF 0 > ANY (p_leases) THEN  -- dead letters of <topic>.dlq
        v_extended := v_extended || courier._settle_dead_letters('extend', p_ids, p_leases, v_until);
    END IF;
    IF cardinality(v_extended) = cardinality(p_ids) THEN  -- the common case: all extended
        RETURN QUERY SELECT u.id, 'extended'::text, v_until FROM unnest(p_ids) AS u(id);
        RETURN;
    END IF;
    RETURN QUERY
    SELECT r.id, r.result, CASE WHEN r.result = 'extended' THEN v_until END
    FROM courier._lease_results(p_ids, p_leases, v_extended, 'extended', 'extend_lease') r;
END
$$;

-- Ack, nack or extend (p_verb) only the messages of topics p_topics (NULL: every topic), in one
-- call: `courier serve` settles with the topics a token may consume, so a token's scope is
-- checked in the same round trip as the settle. A message of another topic is left alone and
-- answered 'forbidden'; the rest answer as ack(), nack() or extend_lease() do.
-- It took no delay before snooze and nack's delay (issue 42): the same name with one more
-- defaulted argument would make every call ambiguous.
DROP FUNCTION IF EXISTS courier.settle_in_topics(text, bigint[], integer[], text[], text, integer);
CREATE OR REPLACE FUNCTION courier.settle_in_topics(p_verb text, p_ids bigint[], p_leases integer[],
                                                    p_topics text[], p_error text DEFAULT NULL,
                                                    p_visibility_timeout_seconds integer DEFAULT NULL,
                                                    p_delay_seconds integer DEFAULT 0)
RETURNS TABLE (id bigint, result text, visible_until timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_outside bigint[];
    v_ids bigint[];
    v_leases integer[];
BEGIN
    IF p_verb IS NULL OR p_verb NOT IN ('ack', 'nack', 'snooze', 'extend') THEN
        PERFORM courier._raise_invalid(format('verb must be ack, nack, snooze or extend, got %s',
                                              coalesce(p_verb, 'NULL')));
    END IF;
    IF NOT coalesce(courier._pull_leases_ok(p_ids, p_leases), false) THEN
        PERFORM courier._require_pull_leases(p_ids, p_leases);
    END IF;
    IF p_topics IS NOT NULL AND 0 > ANY (p_leases) THEN
        -- Dead letters of <topic>.dlq among them (negative leases): in the scope of a token that
        -- names <topic>.dlq (or *), not of one that names only <topic>.
        SELECT coalesce(array_agg(u.id), '{}') INTO v_outside
        FROM unnest(p_ids, p_leases) AS u(id, lease)
        JOIN courier.endpoints e
          ON e.id = CASE WHEN u.lease < 0 THEN (SELECT d.endpoint_id FROM courier.dlq d WHERE d.id = u.id)
                         ELSE coalesce((SELECT q.endpoint_id FROM courier.queue q WHERE q.id = u.id),
                                       (SELECT s.endpoint_id FROM courier.send_stage s WHERE s.id = u.id)) END
        WHERE NOT (CASE WHEN u.lease < 0 THEN e.name || '.dlq' ELSE e.name END = ANY (p_topics));
    ELSE
        -- In the queue or leased in the stage (_take_staged): one snapshot sees each in one place.
        SELECT coalesce(array_agg(q.id), '{}') INTO v_outside
        FROM (SELECT q.id, q.endpoint_id FROM courier.queue q WHERE q.id = ANY (p_ids)
              UNION ALL
              SELECT s.id, s.endpoint_id FROM courier.send_stage s WHERE s.id = ANY (p_ids)) q
        JOIN courier.endpoints e ON e.id = q.endpoint_id
        WHERE p_topics IS NOT NULL AND NOT (e.name = ANY (p_topics));
    END IF;
    SELECT coalesce(array_agg(u.id ORDER BY u.n), '{}'), coalesce(array_agg(u.lease ORDER BY u.n), '{}')
    INTO v_ids, v_leases
    FROM unnest(p_ids, p_leases) WITH ORDINALITY AS u(id, lease, n)
    WHERE NOT (u.id = ANY (v_outside));
    RETURN QUERY SELECT o.id, 'forbidden'::text, NULL::timestamptz FROM unnest(v_outside) AS o(id);
    IF cardinality(v_ids) = 0 AND cardinality(v_outside) > 0 THEN
        RETURN;
    END IF;
    IF p_verb = 'ack' THEN
        RETURN QUERY SELECT a.id, a.result, NULL::timestamptz FROM courier.ack(v_ids, v_leases) a;
    ELSIF p_verb = 'nack' THEN
        RETURN QUERY SELECT n.id, n.result, NULL::timestamptz
                     FROM courier.nack(v_ids, v_leases, p_error, coalesce(p_delay_seconds, 0)) n;
    ELSIF p_verb = 'snooze' THEN
        RETURN QUERY SELECT z.id, z.result, z.visible_until FROM courier.snooze(v_ids, v_leases, p_delay_seconds) z;
    ELSE
        RETURN QUERY SELECT x.id, x.result, x.visible_until
                     FROM courier.extend_lease(v_ids, v_leases, p_visibility_timeout_seconds) x;
    END IF;
END
$$;

-- Gives messages held under their leases back, pending again and due at p_due, with no attempt
-- counted and no error recorded: release and snooze, which differ only in when. Per id: p_result
-- where it applied, else 'lease_lost' or 'not_found' (_lease_results, counting as p_kind).
CREATE OR REPLACE FUNCTION courier._give_back(p_ids bigint[], p_leases integer[], p_due timestamptz,
                                              p_result text, p_kind text)
RETURNS TABLE (id bigint, result text)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan  -- see ack's plan notes
AS $$
#variable_conflict use_column
DECLARE
    v_given bigint[];
    v_leases jsonb;
    v_set text;
BEGIN
    IF NOT coalesce(courier._pull_leases_ok(p_ids, p_leases), false) THEN
        PERFORM courier._require_pull_leases(p_ids, p_leases);
    END IF;
    IF courier._any_stage_lease(p_leases) THEN  -- as nack
        PERFORM courier._unstage_ids(p_ids);
    END IF;
    -- Each row's lease from a jsonb map, as ack finds it, in a plan made once: a join with the
    -- leases, planned again in every call against a bad generic plan, was most of the call.
    v_leases := jsonb_object(p_ids::text[], p_leases::text[]);
    -- A lease given back moves no count (_counted_status): the update trigger stands aside.
    v_set := set_config('courier.update_counted', 'on', true);
    WITH given AS (
        UPDATE courier.queue q SET status = 'pending', visible_at = p_due, updated_at = now()
        WHERE q.id = ANY (p_ids) AND q.status = 'processing' AND q.visible_at IS NOT NULL
          AND q.lease = (v_leases ->> q.id::text)::integer
        RETURNING q.id
    )
    SELECT array_agg(g.id) INTO v_given FROM given g;
    v_set := set_config('courier.update_counted', 'off', true);
    IF 0 > ANY (p_leases) THEN  -- dead letters of <topic>.dlq
        v_given := v_given || courier._settle_dead_letters(p_kind, p_ids, p_leases, p_due);
    END IF;
    IF cardinality(v_given) = cardinality(p_ids) THEN  -- the common case: all given back
        RETURN QUERY SELECT u.id, p_result FROM unnest(p_ids) AS u(id);
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM courier._lease_results(p_ids, p_leases, v_given, p_result, p_kind);
END
$$;

-- Gives messages held under their leases back untouched: pending and due at once, no attempt
-- counted and no error recorded, unlike a nack (the message was never worked on: a client
-- that prefetched it is shutting down, say). Per id: 'released', 'lease_lost', 'not_found'.
CREATE OR REPLACE FUNCTION courier.release(p_ids bigint[], p_leases integer[])
RETURNS TABLE (id bigint, result text)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
SET jit = off
SET enable_seqscan = off  -- see "A queue is read by its indexes" at the top of this file
AS $$
BEGIN
    RETURN QUERY SELECT * FROM courier._give_back(p_ids, p_leases, now(), 'released', 'release');
END
$$;

-- Snooze (River's JobSnooze): gives messages held under their leases back to be taken again
-- after p_delay_seconds, without counting an attempt or recording an error (a job that waits on
-- something else, not one that failed). Per id: 'snoozed' with the time it is due again, or
-- 'lease_lost' / 'not_found' as for ack(). Its expiry still runs.
CREATE OR REPLACE FUNCTION courier.snooze(p_ids bigint[], p_leases integer[], p_delay_seconds integer)
RETURNS TABLE (id bigint, result text, visible_until timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
SET jit = off
SET enable_seqscan = off  -- see "A queue is read by its indexes" at the top of this file
AS $$
#variable_conflict use_column
DECLARE
    v_due timestamptz;
BEGIN
    PERFORM courier._require_delay(p_delay_seconds);
    v_due := now() + make_interval(secs => p_delay_seconds);
    RETURN QUERY
    SELECT g.id, g.result, CASE WHEN g.result = 'snoozed' THEN v_due END
    FROM courier._give_back(p_ids, p_leases, v_due, 'snoozed', 'snooze') g;
END
$$;

CREATE OR REPLACE FUNCTION courier.snooze(p_id bigint, p_lease integer, p_delay_seconds integer) RETURNS text
LANGUAGE plpgsql SECURITY INVOKER  -- as ack's one-message form
AS $$ BEGIN RETURN (SELECT z.result FROM courier.snooze(ARRAY[p_id], ARRAY[p_lease], p_delay_seconds) z); END $$;

-- Receive and peek (NServiceBus) -----------------------------------------------------------------

-- Destructive receive: deletes and returns up to p_count due messages (never more), highest
-- priority first, then lowest due time and id, skipping rows other receivers hold. The
-- candidates are picked into an array first and the DELETE matches that array: a DELETE ... USING (SELECT ... LIMIT ...
-- FOR UPDATE SKIP LOCKED) may evaluate its subquery again and delete more rows than the limit.
-- The array holds their ctids, which stand still while the rows are locked: the DELETE is a
-- TID scan rather than a primary-key lookup per message (7% of a receive of 100 under
-- callgrind), as dequeue's UPDATE is.
-- Expired messages among them are dropped, not returned, and the receive goes on for the rest.
-- Ordering keys as in dequeue: one message of a key at a time, in id order.
-- Generic plans, planned once per session, as for dequeue (see its plan notes).
CREATE OR REPLACE FUNCTION courier.receive(p_topic text, p_count integer DEFAULT 1)
RETURNS TABLE (id bigint, payload jsonb, payload_binary bytea, body text, metadata jsonb, key text,
               created_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
SET jit = off
SET enable_seqscan = off  -- see "A queue is read by its indexes" at the top of this file
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_topic courier.endpoints;
    v_found record;
    v_rate numeric;
    v_limit integer;
    v_left integer;
    v_tids tid[];
    v_keyed tid[];
    v_got integer;
    v_rounds integer := 0;
    v_ordered boolean;
    v_writes integer;
    v_set text;
BEGIN
    -- The topic and its throughput_limit in one statement, as dequeue reads them: config's typed
    -- column, else the setting as courier.consume_limits holds it (the setting read on its own was
    -- 4% of a receive(1); read from courier.settings and config's jsonb, 15,000 instructions more).
    SELECT e AS topic, coalesce(e.config_throughput_limit, l.default_throughput_limit) AS rate INTO v_found
    FROM courier.endpoints e LEFT JOIN courier.consume_limits l ON true  -- never missing (see dequeue)
    WHERE e.name = p_topic AND e.protocol = 'pull';
    IF NOT FOUND THEN
        PERFORM courier._pull_topic(p_topic);  -- raises what is wrong with the name
        RETURN;  -- a topic made between the two looks: nothing in it to receive yet
    END IF;
    v_topic := v_found.topic;
    IF p_count IS NULL OR p_count NOT BETWEEN 1 AND 10000 THEN  -- a plain expression: no statement per call
        PERFORM courier._require_count('count', p_count, 10000);
    END IF;
    IF NOT v_topic.enabled OR v_topic.paused_at IS NOT NULL THEN  -- paused: nothing, as in dequeue
        RETURN;
    END IF;
    -- The token bucket only for a topic with a throughput_limit, as in dequeue: taking and
    -- returning tokens are two more statements per receive, and most topics have no limit.
    v_rate := v_found.rate;
    v_limit := CASE WHEN v_rate > 0 THEN courier._take_throughput(v_topic, p_count) ELSE p_count END;
    v_left := v_limit;
    WHILE v_left > 0 AND v_rounds < 10 LOOP
        v_rounds := v_rounds + 1;
        -- A topic whose messages have never carried an ordering key takes its candidates
        -- without the checks (migration 0048); one that finds a key among them marks the topic
        -- and takes them again, checked. The rows the first look locked stay locked until this
        -- transaction ends, once per topic. The mark never waits: a receive that finds the
        -- topic's row locked (another receive marking it) goes on checked without marking.
        IF NOT v_topic.ordering_keys THEN
            -- A topic never dequeued from holds no lease (endpoints.leases, migration 0059): its
            -- pending messages alone, from queue_pull_due_idx.
            IF v_topic.leases THEN
                SELECT array_agg(c.ctid), array_agg(c.ctid) FILTER (WHERE c.keyed), bool_or(c.ordered)
                INTO v_tids, v_keyed, v_ordered FROM (
                    SELECT d.* FROM generate_series(10, 0, -1) AS p(priority)  -- highest first, as in dequeue
                    CROSS JOIN LATERAL (
                        -- pending messages and lapsed leases, merged in due order, as in dequeue
                        SELECT m.* FROM (
                            SELECT * FROM (
                                SELECT q.ctid, q.id, q.visible_at AS due,
                                       q.idempotency_key IS NOT NULL AND (q.expires_at IS NULL OR q.expires_at > now()) AS keyed,
                                       q.ordering_key IS NOT NULL AS ordered
                                FROM courier.queue q
                                WHERE q.endpoint_id = v_topic.id AND q.priority = p.priority
                                  AND q.visible_at <= now() AND q.visible_at IS NOT NULL AND q.status = 'pending'
                                ORDER BY q.visible_at, q.id
                                LIMIT v_left
                                FOR UPDATE SKIP LOCKED) due
                            UNION ALL
                            SELECT * FROM (
                                SELECT q.ctid, q.id, q.visible_at AS due,
                                       q.idempotency_key IS NOT NULL AND (q.expires_at IS NULL OR q.expires_at > now()) AS keyed,
                                       q.ordering_key IS NOT NULL AS ordered
                                FROM courier.queue q
                                WHERE q.endpoint_id = v_topic.id AND q.priority = p.priority
                                  AND q.visible_at <= now() AND q.visible_at IS NOT NULL
                                  AND q.status = 'processing'
                                  AND q.processing_started_at IS NULL  -- the leased index (migration 0059)
                                ORDER BY q.visible_at, q.id
                                LIMIT v_left
                                FOR UPDATE SKIP LOCKED) lapsed
                        ) m
                        ORDER BY m.due, m.id
                        LIMIT v_left) d
                    WHERE v_topic.priorities & (1 << p.priority) <> 0  -- the levels it has used (migration 0039)
                    LIMIT v_left) c;
            ELSE
                SELECT array_agg(c.ctid), array_agg(c.ctid) FILTER (WHERE c.keyed), bool_or(c.ordered)
                INTO v_tids, v_keyed, v_ordered FROM (
                    SELECT d.* FROM generate_series(10, 0, -1) AS p(priority)  -- highest first, as in dequeue
                    CROSS JOIN LATERAL (
                        SELECT q.ctid, q.idempotency_key IS NOT NULL AND (q.expires_at IS NULL OR q.expires_at > now()) AS keyed,
                               q.ordering_key IS NOT NULL AS ordered
                        FROM courier.queue q
                        WHERE q.endpoint_id = v_topic.id AND q.priority = p.priority
                          AND q.visible_at <= now() AND q.visible_at IS NOT NULL AND q.status = 'pending'
                        ORDER BY q.visible_at, q.id
                        LIMIT v_left
                        FOR UPDATE SKIP LOCKED) d
                    WHERE v_topic.priorities & (1 << p.priority) <> 0  -- the levels it has used (migration 0039)
                    LIMIT v_left) c;
            END IF;
            IF v_ordered THEN
                UPDATE courier.endpoints SET ordering_keys = true
                WHERE id = (SELECT e.id FROM courier.endpoints e WHERE e.id = v_topic.id AND NOT e.ordering_keys
                            FOR UPDATE SKIP LOCKED);
                v_topic.ordering_keys := true;
            END IF;
        END IF;
        IF v_topic.ordering_keys THEN
            SELECT array_agg(c.ctid), array_agg(c.ctid) FILTER (WHERE c.keyed) INTO v_tids, v_keyed FROM (
                SELECT d.* FROM generate_series(10, 0, -1) AS p(priority)  -- highest first, as in dequeue
                CROSS JOIN LATERAL (
                    -- pending messages and lapsed leases, merged in due order, as in dequeue; ordering keys too
                    SELECT m.* FROM (
                        SELECT * FROM (
                            SELECT q.ctid, q.id, q.visible_at AS due,
                                   q.idempotency_key IS NOT NULL AND (q.expires_at IS NULL OR q.expires_at > now()) AS keyed
                            FROM courier.queue q
                            WHERE q.endpoint_id = v_topic.id AND q.priority = p.priority
                              AND q.visible_at <= now() AND q.visible_at IS NOT NULL AND q.status = 'pending'
                              AND (q.ordering_key IS NULL OR (
                                    NOT EXISTS (SELECT 1 FROM courier.queue q2
                                                WHERE q2.ordering_key = q.ordering_key AND q2.status = 'processing'
                                                  AND q2.endpoint_id = q.endpoint_id AND q2.id <> q.id
                                                  AND (q2.visible_at > now() OR q2.id < q.id))
                                AND NOT EXISTS (SELECT 1 FROM courier.queue q2
                                                WHERE q2.ordering_key = q.ordering_key AND q2.status = 'pending'
                                                  AND q2.endpoint_id = q.endpoint_id AND q2.id < q.id)))
                            ORDER BY q.visible_at, q.id
                            LIMIT v_left
                            FOR UPDATE SKIP LOCKED) due
                        UNION ALL
                        SELECT * FROM (
                            SELECT q.ctid, q.id, q.visible_at AS due,
                                   q.idempotency_key IS NOT NULL AND (q.expires_at IS NULL OR q.expires_at > now()) AS keyed
                            FROM courier.queue q
                            WHERE q.endpoint_id = v_topic.id AND q.priority = p.priority
                              AND q.visible_at <= now() AND q.visible_at IS NOT NULL
                              AND q.status = 'processing'
                              AND q.processing_started_at IS NULL  -- the leased index (migration 0059)
                              AND (q.ordering_key IS NULL OR (
                                    NOT EXISTS (SELECT 1 FROM courier.queue q2
                                                WHERE q2.ordering_key = q.ordering_key AND q2.status = 'processing'
                                                  AND q2.endpoint_id = q.endpoint_id AND q2.id <> q.id
                                                  AND (q2.visible_at > now() OR q2.id < q.id))
                                AND NOT EXISTS (SELECT 1 FROM courier.queue q2
                                                WHERE q2.ordering_key = q.ordering_key AND q2.status = 'pending'
                                                  AND q2.endpoint_id = q.endpoint_id AND q2.id < q.id)))
                            ORDER BY q.visible_at, q.id
                            LIMIT v_left
                            FOR UPDATE SKIP LOCKED) lapsed
                    ) m
                    ORDER BY m.due, m.id
                    LIMIT v_left) d
                WHERE v_topic.priorities & (1 << p.priority) <> 0  -- the levels it has used (migration 0039)
                LIMIT v_left) c;
        END IF;
        EXIT WHEN v_tids IS NULL;
        IF v_keyed IS NOT NULL THEN  -- delivered keys keep turning duplicates away, as ack's do
            PERFORM courier._keep_delivered_keys(v_keyed);
        END IF;
        -- The counters _add_delivery_totals keeps, both outcomes, in the DELETE's statement:
        -- a statement of their own was 6% of a receive(1). So is the depth counter, as ack's
        -- (every row taken was counted pending: _counted_status); the delete trigger stands aside.
        v_writes := coalesce(nullif(current_setting('courier.depth_writes', true), '')::integer, 0);
        v_set := set_config('courier.depth_writes', (v_writes + 1)::text, true)
                 || set_config('courier.delete_counted', 'on', true);
        RETURN QUERY
        WITH gone AS (
            DELETE FROM courier.queue q WHERE q.ctid = ANY (v_tids)
            RETURNING q.id, q.payload, q.payload_binary, q.body, q.metadata, q.key, q.created_at, q.visible_at,
                      q.priority, q.expires_at IS NULL OR q.expires_at > now() AS live
        ),
        counted AS (
            INSERT INTO courier.delivery_totals AS d (endpoint_id, outcome, backend_pid, total)
            SELECT v_topic.id, CASE WHEN g.live THEN 'delivered' ELSE 'expired' END, pg_backend_pid(), count(*)
            FROM gone g GROUP BY g.live
            ON CONFLICT (endpoint_id, outcome, backend_pid) DO UPDATE SET total = d.total + excluded.total
        ),
        depth AS (
            INSERT INTO courier.queue_depth AS d (endpoint_id, status, backend_pid, slot, messages)
            SELECT v_topic.id, 'pending', pg_backend_pid(), v_writes >> 6, -count(*) FROM gone g HAVING count(*) > 0
            ON CONFLICT (endpoint_id, status, backend_pid, slot) DO UPDATE SET messages = d.messages + excluded.messages
        )
        SELECT g.id, g.payload, g.payload_binary, g.body, g.metadata, g.key, g.created_at
        FROM gone g
        WHERE g.live
        ORDER BY g.priority DESC, g.visible_at, g.id;
        GET DIAGNOSTICS v_got = ROW_COUNT;
        v_set := set_config('courier.delete_counted', 'off', true);
        v_left := v_left - v_got;
        EXIT WHEN v_got = cardinality(v_tids);  -- nothing expired: nothing more is due
    END LOOP;
    IF v_left > 0 THEN  -- then the stage, as dequeue: delivered from it, never written to the queue
        RETURN QUERY
        SELECT s.id, s.payload, NULL::bytea, NULL::text, '{}'::jsonb, NULL::text, s.created_at
        FROM courier._take_staged(v_topic.id, v_left, NULL, NULL) s;
        GET DIAGNOSTICS v_got = ROW_COUNT;
        v_left := v_left - v_got;
    END IF;
    IF v_rate > 0 THEN
        PERFORM courier._return_throughput(v_topic, v_left);
    END IF;
END
$$;

-- A cheap estimate of the topic's due messages, for a consumer deciding whether to receive
-- (NServiceBus's peek): exact up to 1000 from the two pull indexes, beyond that the maintained
-- count of pending and processing messages. For <topic>.dlq, its dead letters due now (not leased).
CREATE OR REPLACE FUNCTION courier.peek(p_topic text) RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
SET jit = off
SET enable_seqscan = off  -- see "A queue is read by its indexes" at the top of this file
AS $$
DECLARE
    v_topic courier.endpoints;
    v_due bigint;
BEGIN
    IF p_topic LIKE '%.dlq' THEN  -- its dead letters due now, as for a topic (dlq_topic_due_idx)
        v_topic := courier._pull_topic(left(p_topic, -4));
        SELECT count(*) INTO v_due FROM (
            SELECT 1 FROM courier.dlq d
            WHERE d.endpoint_id = v_topic.id AND d.status = 'failed' AND d.original_topic IS NOT NULL
              AND d.visible_at <= now()
            LIMIT 1000) due;
        IF v_due < 1000 THEN
            RETURN v_due;
        END IF;
        RETURN greatest(v_due, (SELECT coalesce(sum(d.messages), 0) FROM courier.dlq_depth d
                                WHERE d.endpoint_id = v_topic.id AND d.status = 'failed'));
    END IF;
    v_topic := courier._pull_topic(p_topic);
    SELECT count(*) INTO v_due FROM (
        SELECT 1 FROM generate_series(10, 0, -1) AS p(priority)  -- the due range of each priority
        CROSS JOIN LATERAL (  -- pending messages and lapsed leases, each from its own index
            (SELECT 1 FROM courier.queue q
             WHERE q.endpoint_id = v_topic.id AND q.priority = p.priority
               AND q.visible_at <= now() AND q.visible_at IS NOT NULL AND q.status = 'pending'
             LIMIT 1000)
            UNION ALL
            (SELECT 1 FROM courier.queue q
             WHERE q.endpoint_id = v_topic.id AND q.priority = p.priority
               AND q.visible_at <= now() AND q.visible_at IS NOT NULL
               AND q.status = 'processing' AND q.processing_started_at IS NULL
             LIMIT 1000)
            LIMIT 1000) q
        WHERE v_topic.priorities & (1 << p.priority) <> 0
        LIMIT 1000) due;
    IF v_due < 1000 THEN  -- and what waits in the stage (migration 0054), which the counters count once moved
        RETURN v_due + (SELECT count(*) FROM (SELECT 1 FROM courier.send_stage s WHERE s.endpoint_id = v_topic.id
                                                AND (s.lease IS NULL OR s.visible_until <= now())
                                              LIMIT 1000 - v_due) staged);
    END IF;
    RETURN greatest(v_due, (SELECT coalesce(sum(d.messages), 0) FROM courier.queue_depth d
                            WHERE d.endpoint_id = v_topic.id AND d.status IN ('pending', 'processing')));
END
$$;

-- <topic>.dlq ----------------------------------------------------------------------------------

-- The dead letters of a pull topic are the messages of <topic>.dlq (queue-ti), each one row of
-- courier.dlq from dead-lettering until cleanup_dlq(). dequeue('<topic>.dlq') leases them and
-- ack, nack, snooze, release and extend_lease settle them, fenced by the lease as a topic's
-- messages are; sends, enqueues and receive are refused (_pull_topic). Their leases are
-- negative, and a topic's messages' positive (_next_lease): the lease a call is given says in
-- which table its id is, since DLQ ids have a sequence of their own and overlap the queue's.
-- The settle functions look at the DLQ only when a negative lease is among those they were
-- given, so a topic's own consumers pay nothing for it.
--
-- Order: due time then id, from dlq_topic_due_idx (migration 0046), as a topic's messages come
-- from queue_pull_due_idx: a dead letter is due from when it was dead-lettered, and again when
-- a nack's delay or a lapsed lease ends. Neither the topic's pause, nor its disabling, nor its
-- throughput_limit holds its dead letters back (they are what is left to handle when its own
-- consumers cannot), and no TTL ends them: cleanup_dlq() does, as for every DLQ entry.

-- dequeue() of <topic>.dlq: up to p_count due dead letters, each under a new (negative) lease,
-- invisible to other consumers for the visibility timeout (p_visibility_timeout_seconds, else
-- the topic's visibility_timeout, else the setting). One taken again after its lease lapsed
-- has the lost attempt counted in retry_count and its error history (never more: the DLQ is
-- the last stop, there is no <topic>.dlq.dlq). max_retries is the entry's, 0 (queue-ti).
CREATE OR REPLACE FUNCTION courier._dequeue_dead_letters(p_topic text, p_count integer,
                                                         p_visibility_timeout_seconds integer)
RETURNS TABLE (id bigint, lease integer, payload jsonb, payload_binary bytea, body text, metadata jsonb, key text,
               retry_count integer, max_retries integer, created_at timestamptz, visible_until timestamptz)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_topic courier.endpoints := courier._pull_topic(left(p_topic, -4));
    v_timeout bigint := coalesce(p_visibility_timeout_seconds, (v_topic.config ->> 'visibility_timeout')::integer,
                                 courier._setting_int('visibility_timeout'));
BEGIN
    IF v_timeout NOT BETWEEN 1 AND 43200 THEN
        RAISE EXCEPTION '[courier] visibility_timeout_seconds must be between 1 and 43200, got %', v_timeout
            USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
    WITH candidates AS (
        SELECT d.ctid AS tid, d.id, d.visible_at AS due
        FROM courier.dlq d
        WHERE d.endpoint_id = v_topic.id AND d.status = 'failed' AND d.original_topic IS NOT NULL
          AND d.visible_at <= now()
        ORDER BY d.visible_at, d.id
        LIMIT p_count
        FOR UPDATE SKIP LOCKED
    ),
    leased AS (
        UPDATE courier.dlq d
        SET lease = -courier._next_lease(abs(d.lease)), leased_at = now(),
            visible_at = now() + make_interval(secs => v_timeout),
            retry_count = d.retry_count + (d.leased_at IS NOT NULL)::integer,
            error_history = CASE WHEN d.leased_at IS NOT NULL
                                 THEN d.error_history || jsonb_build_object('attempt', d.retry_count + 1, 'at', now(),
                                                                            'outcome', 'lease_expired', 'lease', d.lease,
                                                                            'topic', p_topic)
                                 ELSE d.error_history END
        WHERE d.ctid = ANY (ARRAY(SELECT c.tid FROM candidates c))
        RETURNING d.id, d.lease, d.payload, d.payload_binary, d.body, d.metadata, d.key, d.retry_count,
                  d.max_retries, d.original_created_at, d.visible_at
    )
    SELECT t.id, t.lease, t.payload, t.payload_binary, t.body, t.metadata, t.key, t.retry_count,
           coalesce(t.max_retries, 0), t.original_created_at, t.visible_at
    FROM leased t JOIN candidates c ON c.id = t.id
    ORDER BY c.due, c.id;
END
$$;

-- Settles the dead letters among p_ids that a consumer of <topic>.dlq holds under the lease
-- given with each (a negative one; ids given with a positive lease are the queue's, and left
-- alone), and returns their ids. p_verb:
--   ack      done: the entry is kept as 'acked' (acked_at) for the audit trail, as a redriven
--            one is, until cleanup_dlq() ages it out; a dlq.acked event per topic names them
--   nack     due again at p_until, the attempt counted (retry_count), p_error recorded in
--            last_error and the error history; it stays in the DLQ whatever its count
--   release, snooze
--            due again at p_until, nothing counted or recorded
--   extend   its lease runs until p_until
-- A lease that ran out still settles while no one else has taken the entry, as for a message.
CREATE OR REPLACE FUNCTION courier._settle_dead_letters(p_verb text, p_ids bigint[], p_leases integer[],
                                                        p_until timestamptz DEFAULT NULL, p_error text DEFAULT NULL)
RETURNS bigint[]
LANGUAGE plpgsql
AS $$
DECLARE
    v_done bigint[];
    v_endpoint_ids integer[];
BEGIN
    WITH settled AS (
        UPDATE courier.dlq d
        SET status = CASE WHEN p_verb = 'ack' THEN 'acked' ELSE d.status END,
            acked_at = CASE WHEN p_verb = 'ack' THEN now() ELSE d.acked_at END,
            leased_at = CASE WHEN p_verb = 'extend' THEN d.leased_at END,
            visible_at = CASE WHEN p_verb = 'ack' THEN d.visible_at ELSE p_until END,
            retry_count = d.retry_count + (p_verb = 'nack')::integer,
            last_error = CASE WHEN p_verb = 'nack' THEN p_error ELSE d.last_error END,
            error_history = CASE WHEN p_verb = 'nack'
                                 THEN d.error_history || jsonb_build_object('attempt', d.retry_count + 1, 'at', now(),
                                                                            'outcome', 'nack', 'error', p_error,
                                                                            'topic', d.original_topic || '.dlq')
                                 ELSE d.error_history END
        FROM unnest(p_ids, p_leases) AS u(id, lease)
        WHERE d.id = ANY (p_ids) AND d.id = u.id AND d.lease = u.lease AND u.lease < 0
          AND d.status = 'failed' AND d.leased_at IS NOT NULL
        RETURNING d.id, d.endpoint_id
    )
    SELECT array_agg(x.id ORDER BY x.id), array_agg(x.endpoint_id ORDER BY x.id) INTO v_done, v_endpoint_ids
    FROM settled x;
    IF p_verb = 'ack' AND v_done IS NOT NULL THEN
        PERFORM courier._log_event('dlq.acked', a.endpoint_id,
                                   jsonb_build_object('topic', e.name || '.dlq', 'count', count(*),
                                                      'dlq_ids', jsonb_agg(a.id ORDER BY a.id)))
        FROM unnest(v_done, v_endpoint_ids) AS a(id, endpoint_id) JOIN courier.endpoints e ON e.id = a.endpoint_id
        GROUP BY a.endpoint_id, e.name;
    END IF;
    RETURN coalesce(v_done, '{}');
END
$$;

-- Puts a dead-lettered pull message back on its original topic as a new pending message with
-- retry_count 0 and max_retries restored to the topic's configured value, its key, and its own
-- expiry (expires_at, as its ttl_seconds or the topic's TTL set it when it was enqueued; one
-- that had none takes the topic's TTL from now, as a new message would). A message past its
-- expiry is refused (55000): back on the topic it would only expire. The DLQ entry stays as
-- 'redriven' for the audit trail. Returns the new message id.
-- A dead letter a consumer of <topic>.dlq holds under a running lease is refused (55000), as
-- is one it acked: whoever holds it decides, and an operator's requeue cannot make a message
-- both handled and sent again. Once the lease runs out it may be requeued, and the consumer
-- that let it lapse settles nothing (its entry is no longer 'failed').
CREATE OR REPLACE FUNCTION courier.requeue(p_dlq_id bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_row courier.dlq;
    v_topic courier.endpoints;
    v_id bigint;
BEGIN
    SELECT * INTO v_row FROM courier.dlq WHERE id = p_dlq_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION '[courier] DLQ entry % does not exist', coalesce(p_dlq_id::text, 'NULL') USING ERRCODE = 'P0002';
    END IF;
    IF v_row.original_topic IS NULL THEN
        RAISE EXCEPTION '[courier] DLQ entry % is a push message of "%", not a dead-lettered pull message',
                p_dlq_id, v_row.endpoint_name
            USING ERRCODE = '22023', HINT = 'Redrive it with courier.redrive_message() or `courier dlq redrive`';
    END IF;
    IF v_row.status = 'redriven' THEN
        RAISE EXCEPTION '[courier] DLQ entry % was already requeued as message %', p_dlq_id, v_row.redriven_message_id
            USING ERRCODE = '55000';
    END IF;
    IF v_row.status = 'acked' THEN
        RAISE EXCEPTION '[courier] DLQ entry % was acked at % by a consumer of %.dlq', p_dlq_id, v_row.acked_at,
                v_row.original_topic
            USING ERRCODE = '55000',
                  HINT = format('Read its payload with `courier dlq show %s` and enqueue it again to send it anew', p_dlq_id);
    END IF;
    IF v_row.leased_at IS NOT NULL AND v_row.visible_at > now() THEN
        RAISE EXCEPTION '[courier] DLQ entry % is leased by a consumer of %.dlq until %', p_dlq_id, v_row.original_topic,
                v_row.visible_at
            USING ERRCODE = '55000',
                  HINT = 'Its consumer acks, nacks or releases it; requeue it once it is back, or after its lease ends';
    END IF;
    -- Held until commit, as _redrive holds its endpoints: a concurrent drop waits for this.
    SELECT * INTO v_topic FROM courier.endpoints WHERE id = v_row.endpoint_id AND protocol = 'pull' FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION '[courier] topic "%" of DLQ entry % no longer exists', v_row.original_topic, p_dlq_id
            USING ERRCODE = '55000', HINT = 'Recreate the topic first';
    END IF;
    IF v_row.expires_at <= now() THEN
        RAISE EXCEPTION '[courier] DLQ entry % expired at %: requeued, it would only expire', p_dlq_id, v_row.expires_at
            USING ERRCODE = '55000',
                  HINT = format('Read its payload with `courier dlq show %s` and enqueue it again to send it anew', p_dlq_id);
    END IF;
    PERFORM courier._enforce_max_depth(v_topic.id, 1);
    PERFORM courier._require_room(1);
    BEGIN
        INSERT INTO courier.queue (endpoint_id, payload, payload_binary, body, headers, metadata, key, correlation_id,
                                   error_history, visible_at, expires_at)
        VALUES (v_topic.id, v_row.payload, v_row.payload_binary, v_row.body, v_row.headers, v_row.metadata, v_row.key,
                v_row.correlation_id, v_row.error_history, now(),
                coalesce(v_row.expires_at, courier._ttl_expires_at(v_topic.config, now())))
        RETURNING id INTO v_id;
    EXCEPTION WHEN unique_violation THEN
        RAISE EXCEPTION '[courier] cannot requeue DLQ entry %: another message of "%" with key "%" is active',
                p_dlq_id, v_topic.name, v_row.key
            USING ERRCODE = '23505', HINT = 'Requeue it once that message has been acked, received or dead-lettered';
    END;
    UPDATE courier.dlq SET status = 'redriven', redriven_at = now(), redriven_message_id = v_id, leased_at = NULL
    WHERE id = p_dlq_id;
    PERFORM courier._log_event('dlq.requeue', v_topic.id,
        jsonb_build_object('dlq_id', p_dlq_id, 'message_id', v_id, 'topic', v_topic.name));
    RETURN v_id;
END
$$;

-- Reapers (queue-ti) -----------------------------------------------------------------------------

-- The expiry reaper: marks messages whose TTL has passed as expired, pending ones of every
-- endpoint (mark_expired_messages) and, for pull topics, processing ones too. At most
-- p_batch_size of each per call; returns how many it marked. The maintenance leader runs it
-- every 60 s, `courier reaper run expiry` on demand.
CREATE OR REPLACE FUNCTION courier.run_expiry_reaper(p_batch_size integer DEFAULT 10000) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_pending integer;
    v_endpoint_ids integer[];
BEGIN
    PERFORM courier._require_count('batch_size', p_batch_size, 100000);
    v_pending := courier.mark_expired_messages(p_batch_size);
    WITH expired AS (
        UPDATE courier.queue q
        SET status = 'expired', completed_at = now(), updated_at = now(), last_error = 'Expired while processing'
        WHERE q.ctid = ANY (ARRAY(SELECT c.ctid FROM courier.queue c
                                  WHERE c.status = 'processing' AND c.expires_at <= now() AND c.visible_at IS NOT NULL
                                    AND c.completed_at IS NULL  -- queue_expiry_idx
                                  ORDER BY c.expires_at LIMIT p_batch_size
                                  FOR UPDATE SKIP LOCKED))  -- once: see mark_expired_messages
          AND q.status = 'processing'
        RETURNING q.endpoint_id
    )
    SELECT array_agg(endpoint_id) INTO v_endpoint_ids FROM expired;
    PERFORM courier._count_outcomes(v_endpoint_ids, 'expired');
    PERFORM courier._record_reaper_run('expiry', v_pending + coalesce(cardinality(v_endpoint_ids), 0));
    RETURN v_pending + coalesce(cardinality(v_endpoint_ids), 0);
END
$$;

-- The delete reaper: permanently deletes expired pull messages, from the queue and from the
-- archive, at most p_batch_size of each per call; returns how many. The maintenance leader
-- runs it every delete_reaper_interval seconds (0: never), `courier reaper run delete` on demand.
CREATE OR REPLACE FUNCTION courier.run_delete_reaper(p_batch_size integer DEFAULT 10000) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_queue integer;
    v_archive integer;
    v_topics integer[] := ARRAY(SELECT e.id FROM courier.endpoints e WHERE e.protocol = 'pull');
BEGIN
    PERFORM courier._require_count('batch_size', p_batch_size, 100000);
    DELETE FROM courier.queue q
    WHERE q.ctid = ANY (ARRAY(SELECT c.ctid FROM courier.queue c
                              WHERE c.status = 'expired' AND c.visible_at IS NOT NULL
                              ORDER BY c.id LIMIT p_batch_size FOR UPDATE SKIP LOCKED))  -- see mark_expired_messages
      AND q.status = 'expired';
    GET DIAGNOSTICS v_queue = ROW_COUNT;
    DELETE FROM courier.archive a
    WHERE (a.id, a.created_at) IN (SELECT x.id, x.created_at FROM courier.archive x
                                   WHERE x.status = 'expired' AND x.endpoint_id = ANY (v_topics)
                                   LIMIT p_batch_size);
    GET DIAGNOSTICS v_archive = ROW_COUNT;
    PERFORM courier._record_reaper_run('delete', v_queue + v_archive);
    IF v_queue + v_archive > 0 THEN
        PERFORM courier._log_event('reaper.deleted', NULL, jsonb_build_object('queue', v_queue, 'archive', v_archive));
    END IF;
    RETURN v_queue + v_archive;
END
$$;

-- The delete reaper on its schedule: runs it when delete_reaper_interval is set and that long
-- has passed since its last run (by whichever worker led then); returns how many it deleted.
-- Queue and archive each give up to p_batch_size, so a full batch is 2 * p_batch_size at most.
CREATE OR REPLACE FUNCTION courier.run_delete_reaper_if_due(p_batch_size integer DEFAULT 10000) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_interval bigint := courier._setting_int('delete_reaper_interval');
BEGIN
    -- A run that deleted a full batch left more behind: the next call goes on at once.
    IF v_interval = 0 OR EXISTS (SELECT 1 FROM courier.reaper_runs
                                 WHERE reaper = 'delete' AND last_run_at > now() - make_interval(secs => v_interval)
                                   AND last_count < p_batch_size) THEN
        RETURN 0;
    END IF;
    RETURN courier.run_delete_reaper(p_batch_size);
END
$$;

CREATE OR REPLACE FUNCTION courier._record_reaper_run(p_reaper text, p_count bigint) RETURNS void
LANGUAGE sql
AS $$
    INSERT INTO courier.reaper_runs (reaper, last_run_at, last_count) VALUES (p_reaper, now(), p_count)
    ON CONFLICT (reaper) DO UPDATE SET last_run_at = excluded.last_run_at, last_count = excluded.last_count
$$;

-- When the first lease still running on a topic runs out: per priority level, the first
-- message after now() in queue_pull_leased_idx, the earliest of those. The console and
-- `courier topic list` show it.
CREATE OR REPLACE FUNCTION courier._next_lease_deadline(p_endpoint_id integer) RETURNS timestamptz
LANGUAGE sql STABLE
SET search_path = pg_catalog, courier, pg_temp
AS $$
    SELECT min(l.visible_at)
    FROM generate_series(0, 10) AS p(priority)
    CROSS JOIN LATERAL (
        SELECT q.visible_at FROM courier.queue q
        WHERE q.endpoint_id = p_endpoint_id AND q.priority = p.priority
          AND q.visible_at > now() AND q.visible_at IS NOT NULL
          AND q.status = 'processing' AND q.processing_started_at IS NULL
        ORDER BY q.visible_at LIMIT 1) l
$$;

-- Topics at a glance, for `courier topic list` and the console: the maintained counts, the
-- leased (processing) count and the nearest visibility deadline, and the effective limits.
CREATE OR REPLACE FUNCTION courier.topics()
RETURNS TABLE (topic text, enabled boolean, pending bigint, leased bigint, dead_lettered bigint,
               next_visibility_deadline timestamptz, max_retries integer, message_ttl_seconds numeric,
               max_depth numeric, throughput_limit numeric, visibility_timeout integer, dlq_threshold numeric,
               paused boolean)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
    SELECT e.name, e.enabled,
           -- The counters hold leased messages as pending (_counted_status).
           (SELECT coalesce(sum(d.messages), 0)::bigint FROM courier.queue_depth d
            WHERE d.endpoint_id = e.id AND d.status = 'pending') - coalesce(l.leased, 0),
           coalesce(l.leased, 0),
           (SELECT coalesce(sum(d.messages), 0)::bigint FROM courier.dlq_depth d
            WHERE d.endpoint_id = e.id AND d.status = 'failed'),
           courier._next_lease_deadline(e.id),
           courier._endpoint_max_retries(e),
           courier._endpoint_limit(e.config, 'message_ttl_seconds', 'default_message_ttl'),
           courier._endpoint_limit(e.config, 'max_depth', 'default_max_depth'),
           courier._endpoint_limit(e.config, 'throughput_limit', 'default_throughput_limit'),
           coalesce((e.config ->> 'visibility_timeout')::integer, courier._setting_int('visibility_timeout')),
           courier._endpoint_limit(e.config, 'dlq_threshold', 'default_dlq_threshold'),
           e.paused_at IS NOT NULL
    FROM courier.endpoints e
    LEFT JOIN courier._leased_by_endpoint() l ON l.endpoint_id = e.id  -- one pass for every topic
    WHERE e.protocol = 'pull'
    ORDER BY e.name
$$;
