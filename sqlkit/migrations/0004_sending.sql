-- The sending API: send, send_with_options, the batch paths and fast mode. Every path
-- resolves the endpoint, validates the input and checks backpressure before it inserts.

-- Raises unless the endpoint exists and is enabled; returns its id.
CREATE FUNCTION courier._sendable_endpoint_id(p_endpoint_name text) RETURNS integer
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_id integer;
    v_enabled boolean;
BEGIN
    SELECT id, enabled INTO v_id, v_enabled FROM courier.endpoints WHERE name = p_endpoint_name;
    IF v_id IS NULL THEN
        RAISE EXCEPTION '[courier] endpoint "%" does not exist', p_endpoint_name
            USING ERRCODE = 'P0002', HINT = 'Create it with courier.create_endpoint() or `courier endpoint create`';
    END IF;
    IF NOT v_enabled THEN
        RAISE EXCEPTION '[courier] endpoint "%" is disabled', p_endpoint_name
            USING ERRCODE = '55000', HINT = 'Enable it with courier.enable_endpoint() or `courier endpoint enable`';
    END IF;
    RETURN v_id;
END
$$;

-- O(1) backpressure: the depth counters are maintained by triggers, so the active count is
-- a sum over a handful of counter rows, whatever the size of the queue.
CREATE FUNCTION courier._check_backpressure(p_incoming bigint) RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_limit bigint := courier._setting_int('max_queue_size');
    v_active bigint;
BEGIN
    IF v_limit = 0 THEN
        RETURN;
    END IF;
    SELECT coalesce(sum(messages), 0) INTO v_active
    FROM courier.queue_depth WHERE status IN ('pending', 'processing');
    IF v_active + p_incoming > v_limit THEN
        RAISE EXCEPTION '[courier] Queue backpressure: % pending/processing message(s) plus % new would exceed max_queue_size %',
                v_active, p_incoming, v_limit
            USING ERRCODE = '53400',
                  HINT = 'Retry with client-side backoff, add workers, or raise max_queue_size';
    END IF;
END
$$;

CREATE FUNCTION courier._check_payload(p_payload jsonb) RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_limit bigint := courier._setting_int('max_payload_size');
    v_size integer;
BEGIN
    IF p_payload IS NULL THEN
        RAISE EXCEPTION '[courier] payload must not be NULL' USING ERRCODE = '22004';
    END IF;
    v_size := pg_column_size(p_payload);
    IF v_size > v_limit THEN
        RAISE EXCEPTION '[courier] payload of % bytes exceeds max_payload_size (% bytes)', v_size, v_limit
            USING ERRCODE = '54000', HINT = 'Send a reference to the data instead, or raise max_payload_size';
    END IF;
END
$$;

CREATE FUNCTION courier.send_with_options(
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
DECLARE
    v_endpoint_id integer := courier._sendable_endpoint_id(p_endpoint_name);
    v_hash text;
    v_id bigint;
    v_existing_hash text;
BEGIN
    PERFORM courier._check_payload(p_payload);
    IF p_priority IS NULL OR p_priority NOT BETWEEN 0 AND 10 THEN
        RAISE EXCEPTION '[courier] priority must be between 0 and 10, got %', coalesce(p_priority::text, 'NULL')
            USING ERRCODE = '22023', HINT = 'Higher values are delivered first; the default is 0';
    END IF;
    IF p_expires_at IS NOT NULL AND p_scheduled_at IS NOT NULL AND p_expires_at <= p_scheduled_at THEN
        RAISE EXCEPTION '[courier] expires_at % is not after scheduled_at %', p_expires_at, p_scheduled_at
            USING ERRCODE = '22023', HINT = 'The message would expire before it could be delivered';
    END IF;
    IF p_headers IS NOT NULL AND jsonb_typeof(p_headers) <> 'object' THEN
        RAISE EXCEPTION '[courier] headers must be a JSON object' USING ERRCODE = '22023';
    END IF;
    IF p_metadata IS NOT NULL AND jsonb_typeof(p_metadata) <> 'object' THEN
        RAISE EXCEPTION '[courier] metadata must be a JSON object' USING ERRCODE = '22023';
    END IF;
    IF length(p_idempotency_key) NOT BETWEEN 1 AND 255 OR length(p_ordering_key) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION '[courier] idempotency and ordering keys must be 1 to 255 characters' USING ERRCODE = '22023';
    END IF;
    PERFORM courier._check_backpressure(1);

    IF p_idempotency_key IS NULL THEN
        INSERT INTO courier.queue (endpoint_id, payload, headers, metadata, priority, scheduled_at,
                                   correlation_id, expires_at, ordering_key)
        VALUES (v_endpoint_id, p_payload, coalesce(p_headers, '{}'), coalesce(p_metadata, '{}'), p_priority,
                p_scheduled_at, p_correlation_id, p_expires_at, p_ordering_key)
        RETURNING id INTO v_id;
    ELSE
        v_hash := md5(p_payload::text);
        LOOP
            INSERT INTO courier.queue (endpoint_id, payload, headers, metadata, priority, scheduled_at,
                                       idempotency_key, payload_hash, correlation_id, expires_at, ordering_key)
            VALUES (v_endpoint_id, p_payload, coalesce(p_headers, '{}'), coalesce(p_metadata, '{}'), p_priority,
                    p_scheduled_at, p_idempotency_key, v_hash, p_correlation_id, p_expires_at, p_ordering_key)
            ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL AND status IN ('pending', 'processing')
            DO NOTHING
            RETURNING id INTO v_id;
            EXIT WHEN v_id IS NOT NULL;

            SELECT id, payload_hash INTO v_id, v_existing_hash FROM courier.queue
            WHERE idempotency_key = p_idempotency_key AND status IN ('pending', 'processing');
            IF v_id IS NOT NULL THEN
                IF v_existing_hash IS DISTINCT FROM v_hash THEN
                    RAISE EXCEPTION 'Idempotency key ''%'' conflict: same key with different payload', p_idempotency_key
                        USING ERRCODE = '23505',
                              HINT = format('Message %s holds this key until it leaves pending/processing', v_id);
                END IF;
                RETURN v_id;  -- same payload: the existing message stands; no new NOTIFY
            END IF;
            -- The holder finished between our insert and our look-up, freeing the key: try again.
        END LOOP;
    END IF;

    IF p_scheduled_at IS NULL OR p_scheduled_at <= now() THEN
        PERFORM pg_notify('courier_new_msg', v_endpoint_id::text);
    END IF;
    RETURN v_id;
END
$$;

CREATE FUNCTION courier.send(p_endpoint_name text, p_payload jsonb) RETURNS bigint
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$ SELECT courier.send_with_options(p_endpoint_name, p_payload) $$;

-- One INSERT for the whole batch and one NOTIFY; the whole batch is rejected if any part of
-- it is invalid or if it would push the queue past max_queue_size.
CREATE FUNCTION courier.send_batch_with_priority(p_endpoint_name text, p_payloads jsonb[], p_priority integer)
RETURNS bigint[]
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_endpoint_id integer := courier._sendable_endpoint_id(p_endpoint_name);
    v_count integer := coalesce(cardinality(p_payloads), 0);
    v_limit bigint := courier._setting_int('max_payload_size');
    v_ids bigint[];
    v_problem record;
BEGIN
    IF p_priority IS NULL OR p_priority NOT BETWEEN 0 AND 10 THEN
        RAISE EXCEPTION '[courier] priority must be between 0 and 10, got %', coalesce(p_priority::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF v_count = 0 THEN
        RETURN '{}';
    END IF;
    SELECT ord, payload IS NULL AS is_null, pg_column_size(payload) AS size INTO v_problem
    FROM unnest(p_payloads) WITH ORDINALITY AS u(payload, ord)
    WHERE payload IS NULL OR pg_column_size(payload) > v_limit
    ORDER BY ord LIMIT 1;
    IF FOUND THEN
        IF v_problem.is_null THEN
            RAISE EXCEPTION '[courier] batch element % is NULL', v_problem.ord USING ERRCODE = '22004';
        END IF;
        RAISE EXCEPTION '[courier] batch element % is % bytes, over max_payload_size (% bytes)',
            v_problem.ord, v_problem.size, v_limit USING ERRCODE = '54000';
    END IF;
    PERFORM courier._check_backpressure(v_count);

    WITH inserted AS (
        INSERT INTO courier.queue (endpoint_id, payload, priority)
        SELECT v_endpoint_id, payload, p_priority
        FROM unnest(p_payloads) WITH ORDINALITY AS u(payload, ord)
        ORDER BY ord
        RETURNING id
    )
    SELECT array_agg(id ORDER BY id) INTO v_ids FROM inserted;

    PERFORM pg_notify('courier_new_msg', v_endpoint_id::text);
    RETURN v_ids;
END
$$;

CREATE FUNCTION courier.send_batch(p_endpoint_name text, p_payloads jsonb[]) RETURNS bigint[]
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$ SELECT courier.send_batch_with_priority(p_endpoint_name, p_payloads, 0) $$;

-- Trades up to ~600 ms of committed-but-unflushed WAL on a server crash for faster commits,
-- for the rest of the caller's transaction only.
CREATE FUNCTION courier.enable_fast_mode() RETURNS void
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$ SELECT set_config('synchronous_commit', 'off', true); $$;
