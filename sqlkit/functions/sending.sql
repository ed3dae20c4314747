-- Sending: send, send_with_options, the batch sends and fast mode, with backpressure and
-- the payload size limit.

-- A NOTIFY in a transaction takes a cluster-wide lock through that transaction's commit,
-- so notifying producers commit one at a time and group commit is lost: single sends top
-- out near 1 / fsync latency. notify_on_send = false lifts that cap; workers then find new
-- messages by polling.

-- True when p_incoming more messages fit under max_queue_size. The active count is a sum
-- over the trigger-maintained counter rows, so this is O(1) in the size of the queue.
CREATE OR REPLACE FUNCTION courier._has_room(p_incoming bigint) RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT limits.max_queue_size = 0
        OR (SELECT coalesce(sum(d.messages), 0) FROM courier.queue_depth d
            WHERE d.status IN ('pending', 'processing')) + p_incoming <= limits.max_queue_size
    FROM (SELECT value::bigint AS max_queue_size FROM courier.settings WHERE name = 'max_queue_size') limits
$$;

CREATE OR REPLACE FUNCTION courier._max_payload_size() RETURNS bigint
LANGUAGE sql STABLE
AS $$ SELECT value::bigint FROM courier.settings WHERE name = 'max_payload_size' $$;

-- Raises the reason a send to p_endpoint_name of p_incoming messages (the largest
-- p_largest bytes) cannot be accepted; returns quietly if nothing stands in the way (the
-- obstacle went away meanwhile, and the caller tries again).
CREATE OR REPLACE FUNCTION courier._send_refusal(p_endpoint_name text, p_incoming bigint, p_largest bigint)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_enabled boolean;
    v_limit bigint;
    v_active bigint;
BEGIN
    SELECT enabled INTO v_enabled FROM courier.endpoints WHERE name = p_endpoint_name;
    IF v_enabled IS NULL THEN
        RAISE EXCEPTION '[courier] endpoint "%" does not exist', p_endpoint_name
            USING ERRCODE = 'P0002', HINT = 'Create it with courier.create_endpoint() or `courier endpoint create`';
    END IF;
    IF NOT v_enabled THEN
        RAISE EXCEPTION '[courier] endpoint "%" is disabled', p_endpoint_name
            USING ERRCODE = '55000', HINT = 'Enable it with courier.enable_endpoint() or `courier endpoint enable`';
    END IF;
    v_limit := courier._max_payload_size();
    IF p_largest > v_limit THEN
        RAISE EXCEPTION '[courier] payload of % bytes exceeds max_payload_size (% bytes)', p_largest, v_limit
            USING ERRCODE = '54000', HINT = 'Send a reference to the data instead, or raise max_payload_size';
    END IF;
    IF NOT courier._has_room(p_incoming) THEN
        v_limit := courier._setting_int('max_queue_size');
        SELECT coalesce(sum(messages), 0) INTO v_active FROM courier.queue_depth
        WHERE status IN ('pending', 'processing');
        RAISE EXCEPTION '[courier] Queue backpressure: % pending/processing message(s) plus % new would exceed max_queue_size %',
                v_active, p_incoming, v_limit
            USING ERRCODE = '53400',
                  HINT = 'Retry with client-side backoff, add workers, or raise max_queue_size';
    END IF;
    PERFORM courier._enforce_max_depth((SELECT id FROM courier.endpoints WHERE name = p_endpoint_name), p_incoming);
END
$$;

CREATE OR REPLACE FUNCTION courier._check_priority(p_priority integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_priority IS NULL OR p_priority NOT BETWEEN 0 AND 10 THEN
        RAISE EXCEPTION '[courier] priority must be between 0 and 10, got %', coalesce(p_priority::text, 'NULL')
            USING ERRCODE = '22023', HINT = 'Higher values are delivered first; the default is 0';
    END IF;
END
$$;

-- Per-message headers are sent as HTTP headers: a flat object of string values. Framing and
-- hop-by-hop headers, Host, User-Agent and Courier's own X-Courier-* are Courier's to set (a
-- producer's Content-Length once truncated a payload that was then recorded as delivered),
-- and a value with CR or LF could never be sent: both are refused here, at send.
CREATE OR REPLACE FUNCTION courier._check_headers(p_headers jsonb) RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v_name text;
    v_value jsonb;
BEGIN
    FOR v_name, v_value IN SELECT key, value FROM jsonb_each(p_headers) LOOP
        IF v_name !~ '^[!#$%&''*+.^_`|~0-9A-Za-z-]+$' OR length(v_name) > 256 THEN
            RAISE EXCEPTION '[courier] header name % is not a valid HTTP header name', to_jsonb(v_name)
                USING ERRCODE = '22023';
        END IF;
        IF lower(v_name) IN ('content-length', 'transfer-encoding', 'host', 'user-agent', 'connection',
                             'keep-alive', 'te', 'trailer', 'upgrade', 'expect', 'proxy-connection',
                             'proxy-authorization', 'proxy-authenticate')
           OR lower(v_name) LIKE 'x-courier-%' THEN
            RAISE EXCEPTION '[courier] header % is set by Courier and cannot be sent per message', v_name
                USING ERRCODE = '22023', HINT = 'Leave out framing, hop-by-hop, Host, User-Agent and X-Courier-* headers';
        END IF;
        IF jsonb_typeof(v_value) <> 'string' THEN
            RAISE EXCEPTION '[courier] header % must have a string value, not %', v_name, jsonb_typeof(v_value)
                USING ERRCODE = '22023';
        END IF;
        IF v_value #>> '{}' ~ '[\r\n\x00]' THEN
            RAISE EXCEPTION '[courier] header % has a line break or NUL in its value', v_name
                USING ERRCODE = '22023', HINT = 'HTTP header values cannot contain CR, LF or NUL';
        END IF;
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION courier._send_one(
    p_endpoint_name text, p_payload jsonb, p_priority integer, p_scheduled_at timestamptz,
    p_idempotency_key text, p_correlation_id uuid, p_expires_at timestamptz, p_ordering_key text,
    p_headers jsonb, p_metadata jsonb
) RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    -- The size as delivered (JSON text), not as stored: jsonb may be compressed many times over.
    v_size bigint := octet_length(p_payload::text);
    v_hash text;
    v_id bigint;
    v_endpoint_id integer;
    v_notify boolean;
    v_existing_hash text;
BEGIN
    IF p_payload IS NULL THEN
        RAISE EXCEPTION '[courier] payload must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF p_priority IS NULL OR p_priority NOT BETWEEN 0 AND 10 THEN
        PERFORM courier._check_priority(p_priority);
    END IF;
    IF p_expires_at <= p_scheduled_at THEN
        RAISE EXCEPTION '[courier] expires_at % is not after scheduled_at %', p_expires_at, p_scheduled_at
            USING ERRCODE = '22023', HINT = 'The message would expire before it could be delivered';
    END IF;
    IF jsonb_typeof(p_headers) <> 'object' OR jsonb_typeof(p_metadata) <> 'object' THEN
        RAISE EXCEPTION '[courier] headers and metadata must be JSON objects' USING ERRCODE = '22023';
    END IF;
    IF p_headers <> '{}' THEN
        PERFORM courier._check_headers(p_headers);
    END IF;
    IF p_metadata <> '{}' AND jsonb_path_exists(p_metadata, 'strict $.**{32}') THEN
        RAISE EXCEPTION '[courier] metadata is nested more than 32 levels deep' USING ERRCODE = '22023',
            HINT = 'Flatten the metadata; deeper documents cannot be decoded safely by every client';
    END IF;
    IF length(p_idempotency_key) NOT BETWEEN 1 AND 255 OR length(p_ordering_key) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION '[courier] idempotency and ordering keys must be 1 to 255 characters' USING ERRCODE = '22023';
    END IF;
    IF p_idempotency_key IS NOT NULL THEN
        v_hash := md5(p_payload::text);
    END IF;

    LOOP
        IF p_idempotency_key IS NULL THEN
            INSERT INTO courier.queue (endpoint_id, payload, headers, metadata, priority, scheduled_at,
                                       correlation_id, expires_at, ordering_key, visible_at)
            SELECT e.id, p_payload, coalesce(p_headers, '{}'), coalesce(p_metadata, '{}'), p_priority,
                   p_scheduled_at, p_correlation_id,
                   coalesce(p_expires_at, courier._ttl_expires_at(e.config, coalesce(p_scheduled_at, now()))),
                   p_ordering_key, courier._pull_visible_at(e.protocol, p_scheduled_at)
            FROM courier.endpoints e, courier.send_limits l
            WHERE e.name = p_endpoint_name AND e.enabled AND v_size <= l.max_payload_size
              AND (l.max_queue_size = 0 OR l.max_queue_size >= 1 + (
                   SELECT coalesce(sum(d.messages), 0) FROM courier.queue_depth d
                   WHERE d.status IN ('pending', 'processing')))
              AND (coalesce((e.config ->> 'max_depth')::bigint, l.default_max_depth) = 0
                   OR coalesce((e.config ->> 'max_depth')::bigint, l.default_max_depth) >= 1 + (
                   SELECT coalesce(sum(d.messages), 0) FROM courier.queue_depth d
                   WHERE d.endpoint_id = e.id AND d.status IN ('pending', 'processing')))
            RETURNING id, endpoint_id, (SELECT value::boolean FROM courier.settings WHERE name = 'notify_on_send')
            INTO v_id, v_endpoint_id, v_notify;
        ELSE
            INSERT INTO courier.queue (endpoint_id, payload, headers, metadata, priority, scheduled_at,
                                       idempotency_key, payload_hash, correlation_id, expires_at, ordering_key,
                                       visible_at)
            SELECT e.id, p_payload, coalesce(p_headers, '{}'), coalesce(p_metadata, '{}'), p_priority,
                   p_scheduled_at, p_idempotency_key, v_hash, p_correlation_id,
                   coalesce(p_expires_at, courier._ttl_expires_at(e.config, coalesce(p_scheduled_at, now()))),
                   p_ordering_key, courier._pull_visible_at(e.protocol, p_scheduled_at)
            FROM courier.endpoints e, courier.send_limits l
            WHERE e.name = p_endpoint_name AND e.enabled AND v_size <= l.max_payload_size
              AND (l.max_queue_size = 0 OR l.max_queue_size >= 1 + (
                   SELECT coalesce(sum(d.messages), 0) FROM courier.queue_depth d
                   WHERE d.status IN ('pending', 'processing')))
              AND (coalesce((e.config ->> 'max_depth')::bigint, l.default_max_depth) = 0
                   OR coalesce((e.config ->> 'max_depth')::bigint, l.default_max_depth) >= 1 + (
                   SELECT coalesce(sum(d.messages), 0) FROM courier.queue_depth d
                   WHERE d.endpoint_id = e.id AND d.status IN ('pending', 'processing')))
            ON CONFLICT (endpoint_id, idempotency_key)
                WHERE idempotency_key IS NOT NULL AND status IN ('pending', 'processing')
            DO NOTHING
            RETURNING id, endpoint_id, (SELECT value::boolean FROM courier.settings WHERE name = 'notify_on_send')
            INTO v_id, v_endpoint_id, v_notify;

            IF v_id IS NULL THEN
                -- Keys are per endpoint: only this endpoint's message holding it counts.
                SELECT q.id, q.payload_hash INTO v_id, v_existing_hash
                FROM courier.queue q JOIN courier.endpoints e ON e.id = q.endpoint_id
                WHERE e.name = p_endpoint_name AND q.idempotency_key = p_idempotency_key
                  AND q.status IN ('pending', 'processing');
                IF v_id IS NOT NULL THEN
                    IF v_existing_hash IS DISTINCT FROM v_hash THEN
                        RAISE EXCEPTION 'Idempotency key ''%'' conflict: same key with different payload',
                                p_idempotency_key
                            USING ERRCODE = '23505',
                                  HINT = format('Message %s holds this key until it leaves pending/processing', v_id);
                    END IF;
                    RETURN v_id;  -- same payload: the existing message stands; no new NOTIFY
                END IF;
            END IF;
        END IF;
        EXIT WHEN v_id IS NOT NULL;
        -- Nothing inserted: say why. If nothing stands in the way any more (an idempotency
        -- key freed, an endpoint enabled meanwhile), go round again.
        PERFORM courier._send_refusal(p_endpoint_name, 1, v_size);
    END LOOP;

    IF (p_scheduled_at IS NULL OR p_scheduled_at <= now()) AND v_notify THEN
        PERFORM pg_notify('courier_new_msg', v_endpoint_id::text);
    END IF;
    RETURN v_id;
END
$$;

CREATE OR REPLACE FUNCTION courier.send_with_options(
    p_endpoint_name   text,
    p_payload         jsonb,
    p_priority        integer     DEFAULT 0,
    p_scheduled_at    timestamptz DEFAULT NULL,
    p_idempotency_key text        DEFAULT NULL,
    p_correlation_id  uuid        DEFAULT NULL,
    p_expires_at      timestamptz DEFAULT NULL,
    p_ordering_key    text        DEFAULT NULL,
    p_headers         jsonb       DEFAULT NULL,
    p_metadata        jsonb       DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
BEGIN
    RETURN courier._send_one(p_endpoint_name, p_payload, p_priority, p_scheduled_at, p_idempotency_key,
                             p_correlation_id, p_expires_at, p_ordering_key, p_headers, p_metadata);
END
$$;

CREATE OR REPLACE FUNCTION courier.send(p_endpoint_name text, p_payload jsonb) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
BEGIN
    RETURN courier._send_one(p_endpoint_name, p_payload, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
END
$$;

-- One INSERT for the whole batch and one NOTIFY; the whole batch is rejected if any part of
-- it is invalid or if it would push the queue past max_queue_size.
CREATE OR REPLACE FUNCTION courier._send_batch(p_endpoint_name text, p_payloads jsonb[], p_priority integer)
RETURNS bigint[]
LANGUAGE plpgsql
AS $$
DECLARE
    v_count integer := coalesce(cardinality(p_payloads), 0);
    v_largest bigint;
    v_null_at bigint;  -- also reused for the first oversized element
    v_endpoint_id integer;
    v_ids bigint[];
BEGIN
    PERFORM courier._check_priority(p_priority);
    SELECT max(octet_length(payload::text)), min(ord) FILTER (WHERE payload IS NULL)
    INTO v_largest, v_null_at
    FROM unnest(p_payloads) WITH ORDINALITY AS u(payload, ord);
    IF v_null_at IS NOT NULL THEN
        RAISE EXCEPTION '[courier] batch element % is NULL', v_null_at USING ERRCODE = '22004';
    END IF;
    IF v_largest > courier._max_payload_size() THEN
        SELECT ord INTO v_null_at FROM unnest(p_payloads) WITH ORDINALITY AS u(payload, ord)
        WHERE octet_length(payload::text) > courier._max_payload_size() ORDER BY ord LIMIT 1;
        RAISE EXCEPTION '[courier] batch element % exceeds max_payload_size (% bytes)',
                v_null_at, courier._max_payload_size()
            USING ERRCODE = '54000', HINT = 'Send a reference to the data instead, or raise max_payload_size';
    END IF;

    LOOP
        SELECT e.id INTO v_endpoint_id FROM courier.endpoints e, courier.send_limits l
        WHERE e.name = p_endpoint_name AND e.enabled AND coalesce(v_largest, 0) <= l.max_payload_size
          AND (l.max_queue_size = 0 OR l.max_queue_size >= v_count + (
               SELECT coalesce(sum(d.messages), 0) FROM courier.queue_depth d
               WHERE d.status IN ('pending', 'processing')))
          AND (coalesce((e.config ->> 'max_depth')::bigint, l.default_max_depth) = 0
               OR coalesce((e.config ->> 'max_depth')::bigint, l.default_max_depth) >= v_count + (
               SELECT coalesce(sum(d.messages), 0) FROM courier.queue_depth d
               WHERE d.endpoint_id = e.id AND d.status IN ('pending', 'processing')));
        EXIT WHEN v_endpoint_id IS NOT NULL;
        PERFORM courier._send_refusal(p_endpoint_name, v_count, v_largest);
    END LOOP;
    IF v_count = 0 THEN
        RETURN '{}';
    END IF;

    WITH inserted AS (
        INSERT INTO courier.queue (endpoint_id, payload, priority, expires_at, visible_at)
        SELECT v_endpoint_id, payload, p_priority, courier._ttl_expires_at(e.config, now()),
               courier._pull_visible_at(e.protocol, NULL)
        FROM unnest(p_payloads) WITH ORDINALITY AS u(payload, ord), courier.endpoints e
        WHERE e.id = v_endpoint_id
        ORDER BY ord
        RETURNING id
    )
    SELECT array_agg(id ORDER BY id) INTO v_ids FROM inserted;

    PERFORM pg_notify('courier_new_msg', v_endpoint_id::text);  -- one per batch, whatever notify_on_send says
    RETURN v_ids;
END
$$;

CREATE OR REPLACE FUNCTION courier.send_batch_with_priority(p_endpoint_name text, p_payloads jsonb[], p_priority integer)
RETURNS bigint[]
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
BEGIN
    RETURN courier._send_batch(p_endpoint_name, p_payloads, p_priority);
END
$$;

CREATE OR REPLACE FUNCTION courier.send_batch(p_endpoint_name text, p_payloads jsonb[]) RETURNS bigint[]
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
BEGIN
    RETURN courier._send_batch(p_endpoint_name, p_payloads, 0);
END
$$;

-- Trades up to ~600 ms of committed-but-unflushed WAL on a server crash for faster commits,
-- for the rest of the caller's transaction only.
CREATE OR REPLACE FUNCTION courier.enable_fast_mode() RETURNS void
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$ SELECT set_config('synchronous_commit', 'off', true); $$;

-- Replay ----------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION courier._require_room(p_incoming bigint) RETURNS void
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF NOT courier._has_room(p_incoming) THEN
        RAISE EXCEPTION '[courier] Queue backpressure: % more message(s) would exceed max_queue_size %',
                p_incoming, courier._setting_int('max_queue_size')
            USING ERRCODE = '53400',
                  HINT = 'Wait for workers to drain the queue, then run the replay again to resume';
    END IF;
END
$$;
