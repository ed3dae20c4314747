-- Publish/subscribe: event types, subscriptions with @> filters, and publish/publish_batch,
-- which fan an event out into courier.queue once per matching subscription. A push endpoint
-- and a pull topic are both endpoints, so each gets the event as if it had been sent to it.

CREATE OR REPLACE FUNCTION courier._event_type_by_name(p_name text) RETURNS courier.event_types
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_event_type courier.event_types;
BEGIN
    SELECT * INTO v_event_type FROM courier.event_types WHERE name = p_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION '[courier] event type "%" does not exist', p_name
            USING ERRCODE = 'P0002', HINT = 'Create it with courier.create_event_type() or `courier event-type create`';
    END IF;
    RETURN v_event_type;
END
$$;

CREATE OR REPLACE FUNCTION courier.create_event_type(p_name text, p_description text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_id integer;
BEGIN
    IF p_name IS NULL OR p_name !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$' THEN
        PERFORM courier._raise_invalid(format('invalid event type name %L', p_name),
            'Use 1-128 letters, digits, "_", ".", ":" or "-", starting with a letter or digit');
    END IF;
    IF length(p_description) > 1000 THEN
        PERFORM courier._raise_invalid('event type description is longer than 1000 characters');
    END IF;
    INSERT INTO courier.event_types (name, description) VALUES (p_name, p_description)
    ON CONFLICT (name) DO NOTHING
    RETURNING id INTO v_id;
    IF v_id IS NULL THEN
        RAISE EXCEPTION '[courier] event type "%" already exists', p_name
            USING ERRCODE = '42710', HINT = 'Drop it first, or publish to it as it is';
    END IF;
    PERFORM courier._log_event('event_type.created', NULL,
        jsonb_strip_nulls(jsonb_build_object('name', p_name, 'description', p_description)));
    RETURN v_id;
END
$$;

-- Refuses while the event type has subscriptions, unless p_force, which removes them too.
-- Messages already published stay queued.
CREATE OR REPLACE FUNCTION courier.drop_event_type(p_name text, p_force boolean DEFAULT false) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_event_type courier.event_types := courier._event_type_by_name(p_name);
    v_subscriptions bigint;
BEGIN
    PERFORM 1 FROM courier.event_types WHERE id = v_event_type.id FOR UPDATE;
    SELECT count(*) INTO v_subscriptions FROM courier.subscriptions WHERE event_type_id = v_event_type.id;
    IF v_subscriptions > 0 AND NOT coalesce(p_force, false) THEN
        RAISE EXCEPTION '[courier] event type "%" still has % subscription(s)', p_name, v_subscriptions
            USING ERRCODE = '55006',
                  HINT = 'Unsubscribe them first, or force the drop (`courier event-type drop --force`, p_force := true)';
    END IF;
    DELETE FROM courier.event_types WHERE id = v_event_type.id;  -- subscriptions cascade
    PERFORM courier._log_event('event_type.dropped', NULL,
        jsonb_build_object('name', p_name, 'subscriptions', v_subscriptions));
    RETURN true;
END
$$;

-- Subscribing again with the same filter returns the existing subscription; with another
-- filter it is refused, since one endpoint gets each event at most once.
CREATE OR REPLACE FUNCTION courier.subscribe(p_event_type text, p_endpoint_name text, p_filter jsonb DEFAULT '{}')
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_event_type courier.event_types := courier._event_type_by_name(p_event_type);
    v_endpoint courier.endpoints := courier._endpoint_by_name(p_endpoint_name);
    v_filter jsonb := coalesce(p_filter, '{}');
    v_id integer;
    v_existing jsonb;
BEGIN
    IF jsonb_typeof(v_filter) <> 'object' THEN
        PERFORM courier._raise_invalid(format('filter must be a JSON object, not %s', jsonb_typeof(v_filter)),
            'A subscription receives the events whose payload contains the filter (payload @> filter); {} matches all');
    END IF;
    INSERT INTO courier.subscriptions (event_type_id, endpoint_id, filter)
    VALUES (v_event_type.id, v_endpoint.id, v_filter)
    ON CONFLICT (event_type_id, endpoint_id) DO NOTHING
    RETURNING id INTO v_id;
    IF v_id IS NULL THEN
        SELECT id, filter INTO v_id, v_existing FROM courier.subscriptions
        WHERE event_type_id = v_event_type.id AND endpoint_id = v_endpoint.id;
        IF v_existing IS DISTINCT FROM v_filter THEN
            RAISE EXCEPTION '[courier] endpoint "%" is already subscribed to "%" with filter %',
                    p_endpoint_name, p_event_type, v_existing
                USING ERRCODE = '23505', HINT = 'Unsubscribe first to change the filter';
        END IF;
        RETURN v_id;
    END IF;
    PERFORM courier._log_event('subscription.created', v_endpoint.id,
        jsonb_build_object('event_type', p_event_type, 'endpoint', p_endpoint_name, 'filter', v_filter));
    RETURN v_id;
END
$$;

-- False when the endpoint was not subscribed.
CREATE OR REPLACE FUNCTION courier.unsubscribe(p_event_type text, p_endpoint_name text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_event_type courier.event_types := courier._event_type_by_name(p_event_type);
    v_endpoint courier.endpoints := courier._endpoint_by_name(p_endpoint_name);
BEGIN
    DELETE FROM courier.subscriptions WHERE event_type_id = v_event_type.id AND endpoint_id = v_endpoint.id;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM courier._log_event('subscription.dropped', v_endpoint.id,
        jsonb_build_object('event_type', p_event_type, 'endpoint', p_endpoint_name));
    RETURN true;
END
$$;

-- The fan-out behind publish and publish_batch: every (payload, subscription) pair whose
-- filter the payload contains becomes one message on the subscription's endpoint. Disabled
-- endpoints take no sends, so they get none of these either. The whole fan-out is checked
-- against max_queue_size and each endpoint's share against its max_depth (53401) before
-- anything is inserted, so one publish is all or nothing. Each message carries the event
-- type and subscription in its metadata and the event's correlation id, shared by every copy
-- of one event.
CREATE OR REPLACE FUNCTION courier._publish(p_event_type text, p_payloads jsonb[], p_idempotency_key text,
                                            p_correlation_id uuid, p_notify boolean)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_event_type courier.event_types := courier._event_type_by_name(p_event_type);
    v_count integer := coalesce(cardinality(p_payloads), 0);
    v_largest bigint;
    v_bad bigint;
    v_subscription_ids integer[];
    v_endpoint_ids integer[];
    v_ords bigint[];
    v_correlation_ids uuid[];
    v_projected integer;
    v_target record;
    v_hash text;
    v_inserted integer;
    v_conflict record;
    v_new_ids bigint[];
    v_new_endpoints integer[];
BEGIN
    IF p_payloads IS NULL THEN
        RAISE EXCEPTION '[courier] payloads must not be NULL' USING ERRCODE = '22004';
    END IF;
    SELECT max(octet_length(payload::text)), min(ord) FILTER (WHERE payload IS NULL)
    INTO v_largest, v_bad
    FROM unnest(p_payloads) WITH ORDINALITY AS u(payload, ord);
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION '[courier] %', CASE WHEN v_count = 1 THEN 'payload must not be NULL'
                                            ELSE format('batch element %s is NULL', v_bad) END
            USING ERRCODE = '22004';
    END IF;
    IF v_largest > courier._max_payload_size() THEN
        SELECT ord INTO v_bad FROM unnest(p_payloads) WITH ORDINALITY AS u(payload, ord)
        WHERE octet_length(payload::text) > courier._max_payload_size() ORDER BY ord LIMIT 1;
        RAISE EXCEPTION '[courier] % exceeds max_payload_size (% bytes)',
                CASE WHEN v_count = 1 THEN 'payload' ELSE format('batch element %s', v_bad) END,
                courier._max_payload_size()
            USING ERRCODE = '54000', HINT = 'Publish a reference to the data instead, or raise max_payload_size';
    END IF;
    IF length(p_idempotency_key) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION '[courier] idempotency key must be 1 to 255 characters' USING ERRCODE = '22023';
    END IF;

    SELECT coalesce(array_agg(s.id ORDER BY u.ord, s.id), '{}'),
           coalesce(array_agg(s.endpoint_id ORDER BY u.ord, s.id), '{}'),
           coalesce(array_agg(u.ord ORDER BY u.ord, s.id), '{}')
    INTO v_subscription_ids, v_endpoint_ids, v_ords
    FROM unnest(p_payloads) WITH ORDINALITY AS u(payload, ord)
    JOIN courier.subscriptions s ON s.event_type_id = v_event_type.id
                                AND (s.filter = '{}' OR u.payload @> s.filter)
    JOIN courier.endpoints e ON e.id = s.endpoint_id AND e.enabled;
    v_projected := cardinality(v_endpoint_ids);
    IF v_projected = 0 THEN
        RETURN 0;
    END IF;

    IF NOT courier._has_room(v_projected) THEN
        RAISE EXCEPTION '[courier] Queue backpressure: % pending/processing message(s) plus a fan-out of % would exceed max_queue_size %',
                (SELECT coalesce(sum(messages), 0) FROM courier.queue_depth WHERE status IN ('pending', 'processing')),
                v_projected, courier._setting_int('max_queue_size')
            USING ERRCODE = '53400',
                  HINT = 'Nothing was published; retry with client-side backoff, add workers, or raise max_queue_size';
    END IF;

    FOR v_target IN SELECT t.endpoint_id, e.name, count(*) AS adding FROM unnest(v_endpoint_ids) AS t(endpoint_id)
                    JOIN courier.endpoints e ON e.id = t.endpoint_id
                    GROUP BY t.endpoint_id, e.name ORDER BY t.endpoint_id LOOP
        -- Held until commit, as a send holds its endpoint: a drop waits for this publish.
        PERFORM courier._hold_endpoint_for_send(v_target.name);
        PERFORM courier._enforce_max_depth(v_target.endpoint_id, v_target.adding);
    END LOOP;

    IF p_correlation_id IS NOT NULL THEN
        v_correlation_ids := array_fill(p_correlation_id, ARRAY[v_count]);
    ELSE
        v_correlation_ids := ARRAY(SELECT gen_random_uuid() FROM generate_series(1, v_count));
    END IF;
    IF p_idempotency_key IS NOT NULL THEN
        v_hash := md5(p_payloads[1]::text);
    END IF;

    -- Each subscriber's workers or consumers are woken at commit, as a send's are (sending.sql):
    -- a NOTIFY here would make concurrent publishers commit one at a time. Not when every
    -- subscriber delays its messages (delay_seconds): none of them is due.
    IF p_notify AND EXISTS (SELECT FROM courier.endpoints e WHERE e.id = ANY (v_endpoint_ids)
                                AND coalesce((e.config ->> 'delay_seconds')::integer, 0) = 0) THEN
        PERFORM set_config('courier.wake_at_commit', 'on', true);
    END IF;
    -- As a send would: the endpoint's delay (delay_seconds) and TTL, and for a pull topic the time
    -- it is due (now, or after the delay).
    WITH inserted AS (
    INSERT INTO courier.queue (endpoint_id, payload, metadata, correlation_id, idempotency_key, payload_hash,
                               scheduled_at, expires_at, visible_at)
    SELECT f.endpoint_id, p_payloads[f.ord],
           jsonb_build_object('event_type', v_event_type.name, 'subscription_id', f.subscription_id),
           v_correlation_ids[f.ord], p_idempotency_key, v_hash,
           d.due, courier._ttl_expires_at(e.config, coalesce(d.due, now())), courier._pull_visible_at(e.protocol, d.due)
    FROM unnest(v_endpoint_ids, v_ords, v_subscription_ids) AS f(endpoint_id, ord, subscription_id)
    JOIN courier.endpoints e ON e.id = f.endpoint_id
    CROSS JOIN LATERAL (SELECT now() + make_interval(secs => nullif((e.config ->> 'delay_seconds')::integer, 0))
                        AS due) d
    ORDER BY f.ord, f.subscription_id
    ON CONFLICT (endpoint_id, idempotency_key)
        WHERE idempotency_key IS NOT NULL AND status IN ('pending', 'processing')
    DO NOTHING
    RETURNING id, endpoint_id)
    SELECT coalesce(array_agg(id), '{}'), coalesce(array_agg(endpoint_id), '{}')
    INTO v_new_ids, v_new_endpoints FROM inserted;
    v_inserted := cardinality(v_new_ids);

    IF v_inserted < v_projected THEN
        -- Only a publish with an idempotency key skips rows: an endpoint already holds a
        -- message with this key. The same payload means this event is already queued there.
        SELECT q.id, q.endpoint_id INTO v_conflict
        FROM courier.queue q
        WHERE q.endpoint_id = ANY (v_endpoint_ids) AND q.idempotency_key = p_idempotency_key
          AND q.status IN ('pending', 'processing') AND q.payload_hash IS DISTINCT FROM v_hash
        LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'Idempotency key ''%'' conflict: same key with different payload', p_idempotency_key
                USING ERRCODE = '23505',
                      HINT = format('Message %s on endpoint id %s holds this key while it is queued, and for idempotency_retention_seconds (%s) after it is delivered; nothing was published',
                                    v_conflict.id, v_conflict.endpoint_id, courier._setting_int('idempotency_retention_seconds'));
        END IF;
    END IF;

    IF p_idempotency_key IS NOT NULL THEN
        -- A subscriber that delivered this event within idempotency_retention_seconds (perhaps
        -- archived already) does not get it again, as a send with the key would not.
        FOR v_target IN SELECT DISTINCT e.id, e.name FROM courier.endpoints e WHERE e.id = ANY (v_new_endpoints) LOOP
            IF courier._delivered_key_holder(v_target.name, p_idempotency_key, v_hash) IS NOT NULL THEN
                DELETE FROM courier.queue WHERE id = ANY (v_new_ids) AND endpoint_id = v_target.id;
            END IF;
        END LOOP;
    END IF;

    RETURN v_projected;
END
$$;

-- Returns how many subscriptions the event is queued for (0 when none matches); with an
-- idempotency key, a retry of the same publish finds it queued already and adds nothing.
CREATE OR REPLACE FUNCTION courier.publish(p_event_type text, p_payload jsonb, p_idempotency_key text DEFAULT NULL,
                                           p_correlation_id uuid DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
BEGIN
    RETURN courier._publish(p_event_type, ARRAY[p_payload], p_idempotency_key, p_correlation_id,
                            courier._setting_bool('notify_on_send'));
END
$$;

-- One INSERT for the whole fan-out of every event, and at commit one NOTIFY per subscriber.
CREATE OR REPLACE FUNCTION courier.publish_batch(p_event_type text, p_payloads jsonb[]) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
BEGIN
    RETURN courier._publish(p_event_type, p_payloads, NULL, NULL, true);
END
$$;
