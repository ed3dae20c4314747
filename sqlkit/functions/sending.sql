-- Sending: send, send_with_options, the batch sends and fast mode, with backpressure and
-- the payload size limit.

-- Waking the workers. A NOTIFY in a transaction takes a cluster-wide lock before its commit
-- record and holds it through the WAL flush, so producers that each NOTIFY commit one at a
-- time and group commit is lost: single sends topped out near 1 / fsync latency. So a send
-- does not NOTIFY itself: it sets courier.wake_at_commit to 'on' for its INSERT (when the
-- messages are due and, for a single send, notify_on_send is on), and the depth counter's
-- write, naming the column slot in its SET because it adds pending messages while that is on
-- (_wake_requested), queues a deferred event (the constraint trigger queue_depth_wake,
-- restricted to that column) that runs _wake_workers_at_commit() at commit. Of the
-- producers committing at the same moment, the one that takes the endpoint's wake lock
-- NOTIFYs; the others skip it and commit in the same WAL flush, or the next. One of them may
-- become visible only after the claim the NOTIFY set off, so every committing producer also
-- holds a shared lock until its commit is visible, and a worker that comes back empty from a
-- claim after a wake-up asks sends_committing() whether any is still held: while one is,
-- it claims again after a pause of milliseconds (its linger); once none is, one more claim
-- sees them all. The fallback poll covers anything else.
-- The setting stays 'on' for the rest of the transaction: a later write that adds pending
-- messages queues a wake-up too, which costs a worker at most one empty claim.
--
-- Pull topics are woken the same way. Their consumers (a Consumer, a long poll of `courier
-- serve`) linger as workers do, asking topic_sends_committing() by the topic's name.
-- A transaction that runs SET CONSTRAINTS ALL IMMEDIATE takes the wake lock at its send and
-- holds it until it commits: other producers' wake-ups wait for that commit (or the poll).

-- At commit: NOTIFY for the endpoint unless another producer's commit holds its wake lock
-- (that producer's NOTIFY wakes the worker, whose linger finds this transaction's messages), or
-- a worker's claim loop holds it while it claims back to back (console/workers/awake.py).
-- Both locks are held until this commit is visible to others, after its WAL flush.
-- Runs as whoever commits, so it reads no table; trigger functions carry no SET search_path.
CREATE OR REPLACE FUNCTION courier._wake_workers_at_commit() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    v_held boolean;
BEGIN
    -- A staged send (migration 0054, send_stage_wake) asks for its wake-up in a setting of its
    -- own, which no later send of the transaction turns off (a delayed one turns wake_at_commit
    -- off). Only a counter write that added pending messages while a wake-up was asked for names
    -- slot (_wake_requested); this guards against any other.
    IF TG_TABLE_NAME = 'send_stage' THEN
        IF pg_catalog.current_setting('courier.wake_staged', true) IS DISTINCT FROM 'on' THEN
            RETURN NULL;
        END IF;
    ELSIF NEW.status <> 'pending' THEN
        RETURN NULL;
    END IF;
    -- Tried, never waited for: any database user can hold an advisory key, and one holding
    -- this one exclusively must not hold up every commit of a send (issue 23). Without it a
    -- worker's linger may miss this commit; its wake-up and the poll still find the messages.
    -- An assignment, not PERFORM: an expression, with no statement of its own.
    v_held := pg_catalog.pg_try_advisory_xact_lock_shared(pg_catalog.hashtext('courier.sends_committing'),
                                                          NEW.endpoint_id);
    IF pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtext('courier.wake_workers'), NEW.endpoint_id) THEN
        -- An assignment, not PERFORM: an expression, with no statement of its own.
        v_held := pg_catalog.pg_notify('courier_new_msg', NEW.endpoint_id::text)::text IS NOT NULL;
    END IF;
    RETURN NULL;
END
$$;

-- Deferred, so it runs at commit. Restricted to the column slot, which only the writes that ask
-- for a wake-up name (_wake_requested), and with no WHEN: PostgreSQL parses a trigger's WHEN
-- again in every statement that writes the table, 32,000 instructions of every counter write,
-- a consumer's included, where a column restriction is one test of the UPDATE's target list.
-- A constraint trigger has no OR REPLACE.
DROP TRIGGER IF EXISTS queue_depth_wake ON courier.queue_depth;
CREATE CONSTRAINT TRIGGER queue_depth_wake AFTER UPDATE OF slot ON courier.queue_depth
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    EXECUTE FUNCTION courier._wake_workers_at_commit();

-- The same wake-up for a send that staged its message (courier.send_stage, migration 0054): a
-- deferred row trigger on the stage itself, since a staged send writes no counter row. It fires
-- once a send: a staged batch puts its first message here and the rest in send_stage_batch,
-- which has no trigger (migration 0055).
DROP TRIGGER IF EXISTS send_stage_wake ON courier.send_stage;
CREATE CONSTRAINT TRIGGER send_stage_wake AFTER INSERT ON courier.send_stage
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    EXECUTE FUNCTION courier._wake_workers_at_commit();

-- For the worker's linger: true while some producer that sent to the endpoint is committing
-- (between its commit-time wake-up and the moment its commit is visible). Trying the lock
-- exclusively for an instant makes a producer that asks for its shared lock meanwhile wait
-- that instant; nothing waits on the worker.
CREATE OR REPLACE FUNCTION courier.sends_committing(p_endpoint_id integer) RETURNS boolean
LANGUAGE sql
AS $$
    SELECT CASE WHEN pg_try_advisory_lock(hashtext('courier.sends_committing'), p_endpoint_id)
                THEN NOT pg_advisory_unlock(hashtext('courier.sends_committing'), p_endpoint_id)
                ELSE true END
$$;

-- The id a pull topic's notifications carry, so that its consumers can leave other endpoints'
-- alone; NULL for a name that is not a pull topic. courier_application reads no endpoints.
CREATE OR REPLACE FUNCTION courier.topic_id(p_topic text) RETURNS integer
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
    SELECT e.id FROM courier.endpoints e WHERE e.name = p_topic AND e.protocol = 'pull'
$$;

-- sends_committing for a pull topic, by name, for its consumers. False for a name that is not
-- a pull topic.
CREATE OR REPLACE FUNCTION courier.topic_sends_committing(p_topic text) RETURNS boolean
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
    SELECT coalesce((SELECT courier.sends_committing(e.id) FROM courier.endpoints e
                     WHERE e.name = p_topic AND e.protocol = 'pull'), false)
$$;

-- Keeps send_limits.room_until (migration 0051) in step with every write of the limit or the
-- estimate: 'infinity' with no limit; two seconds past the estimate while one more message
-- leaves the queue at most half full, as _room_for trusts it; else NULL, and each send asks
-- _admit_slow.
CREATE OR REPLACE FUNCTION courier._send_limits_room() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    NEW.room_until := CASE WHEN NEW.max_queue_size = 0 THEN 'infinity'::timestamptz
                           WHEN NEW.active_estimate + 1 <= NEW.max_queue_size / 2
                               THEN NEW.estimated_at + interval '2 seconds' END;
    RETURN NEW;
END
$$;

CREATE OR REPLACE TRIGGER send_limits_room BEFORE INSERT OR UPDATE ON courier.send_limits
    FOR EACH ROW EXECUTE FUNCTION courier._send_limits_room();

-- Rewrites courier.send_limits, the settings a send reads as one row, and
-- courier.consume_limits, those a dequeue and a push claim read (migration 0049), after
-- any change to courier.settings. Changes are taken one at a time, each reading the settings
-- after the previous one committed: two transactions that change different settings at once
-- must not each write back the other's old value. Upserts, so that a lost row comes back.
CREATE OR REPLACE FUNCTION courier._refresh_send_limits() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
BEGIN
    LOCK TABLE courier.send_limits IN SHARE ROW EXCLUSIVE MODE;
    INSERT INTO courier.send_limits AS l (singleton, max_payload_size, max_queue_size, default_message_ttl,
                                          default_max_depth, notify_on_send)
    SELECT true,
           max(value::bigint) FILTER (WHERE name = 'max_payload_size'),
           max(value::bigint) FILTER (WHERE name = 'max_queue_size'),
           max(value::bigint) FILTER (WHERE name = 'default_message_ttl'),
           max(value::bigint) FILTER (WHERE name = 'default_max_depth'),
           bool_or(value::boolean) FILTER (WHERE name = 'notify_on_send')
    FROM courier.settings
    ON CONFLICT (singleton) DO UPDATE
        SET max_payload_size = excluded.max_payload_size, max_queue_size = excluded.max_queue_size,
            default_message_ttl = excluded.default_message_ttl, default_max_depth = excluded.default_max_depth,
            notify_on_send = excluded.notify_on_send;
    INSERT INTO courier.consume_limits AS l (singleton, visibility_timeout, default_max_retries,
                                             default_throughput_limit, default_dlq_threshold, claim_slots)
    SELECT true,
           max(value::integer) FILTER (WHERE name = 'visibility_timeout'),
           max(value::integer) FILTER (WHERE name = 'default_max_retries'),
           max(value::numeric) FILTER (WHERE name = 'default_throughput_limit'),
           max(value::integer) FILTER (WHERE name = 'default_dlq_threshold'),
           max(value::integer) FILTER (WHERE name = 'claim_slots')
    FROM courier.settings
    ON CONFLICT (singleton) DO UPDATE
        SET visibility_timeout = excluded.visibility_timeout, default_max_retries = excluded.default_max_retries,
            default_throughput_limit = excluded.default_throughput_limit,
            default_dlq_threshold = excluded.default_dlq_threshold, claim_slots = excluded.claim_slots;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER settings_refresh_send_limits
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON courier.settings
    FOR EACH STATEMENT EXECUTE FUNCTION courier._refresh_send_limits();

-- Pending and processing messages, of one endpoint or (NULL) of all, from the depth counters.
-- A function rather than a subquery in the sends' INSERT: PostgreSQL starts a subquery's
-- executor nodes in every statement whether it runs or not, while a function is called only
-- when its limit is set (max_depth is not, by default).
CREATE OR REPLACE FUNCTION courier._active_messages(p_endpoint_id integer) RETURNS bigint
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF p_endpoint_id IS NULL THEN
        RETURN (SELECT coalesce(sum(d.messages), 0) FROM courier.queue_depth d
                WHERE d.status IN ('pending', 'processing'));
    END IF;
    RETURN (SELECT coalesce(sum(d.messages), 0) FROM courier.queue_depth d
            WHERE d.endpoint_id = p_endpoint_id AND d.status IN ('pending', 'processing'));
END
$$;

-- True when p_incoming more messages fit under max_queue_size (p_limits: the row of
-- courier.send_limits), the one rule every send path applies. The maintenance leader writes its
-- count of active messages into that row every second (estimate_active_messages()); while it is
-- under 2 s old and, with p_incoming more, at most half the limit, that count decides, and no
-- depth counter row is read. Otherwise (no leader running, or past half the limit) the counters
-- are summed, exactly. So the limit can be overshot only by what producers add, beyond half of
-- it, within the two seconds an estimate is trusted. SQL, so that it is inlined into the sends'
-- statements: the sum, a function, is called only when the estimate does not decide.
CREATE OR REPLACE FUNCTION courier._room_for(p_limits courier.send_limits, p_incoming bigint) RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT p_limits.max_queue_size = 0
        OR coalesce(p_limits.estimated_at > statement_timestamp() - interval '2 seconds'
                    AND p_limits.active_estimate + p_incoming <= p_limits.max_queue_size / 2, false)
        OR p_limits.max_queue_size >= p_incoming + courier._active_messages(NULL)
$$;

-- _admit_one's limits when send_limits.room_until does not decide: max_queue_size exactly (or by
-- an estimate under 2 s old) and the endpoint's max_depth. plpgsql, so that it is not inlined.
CREATE OR REPLACE FUNCTION courier._admit_slow(p_limits courier.send_limits, p_endpoint_id integer, p_max_depth bigint)
RETURNS boolean
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN courier._room_for(p_limits, 1)
       AND (p_max_depth = 0 OR p_max_depth >= 1 + courier._active_messages(p_endpoint_id));
END
$$;

-- Whether a single send (_send_one, enqueue) may insert its message, decided in its INSERT's
-- WHERE: the payload's size, max_queue_size and the endpoint's max_depth (p_max_depth, 0 for
-- none) allow it. When they do it also asks for the commit-time wake-up (p_due: the message is
-- due now) and flags the insert as counted by the caller (_count_sent), both set as the row is
-- made. False inserts nothing, and the caller asks _send_refusal why. SQL, so that it is
-- inlined into the INSERT: no call of its own. The usual case (a fresh estimate far from
-- max_queue_size, or none set, and no max_depth) is decided by send_limits.room_until alone;
-- the rest by _admit_slow, a function so that the statement carries one reference to it rather
-- than _room_for's operators and two to _active_messages, which PostgreSQL readies in every
-- send whether or not they run (12,000 instructions of a send).
CREATE OR REPLACE FUNCTION courier._admit_one(p_limits courier.send_limits, p_endpoint_id integer, p_size bigint,
                                              p_max_depth bigint, p_due boolean) RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT p_size <= p_limits.max_payload_size
       AND (p_limits.room_until > statement_timestamp() AND p_max_depth = 0
            OR courier._admit_slow(p_limits, p_endpoint_id, p_max_depth))
       AND set_config('courier.wake_at_commit',
                      CASE WHEN p_due AND p_limits.notify_on_send THEN 'on' ELSE 'off' END, true) IS NOT NULL
       AND set_config('courier.insert_counted', 'on', true) IS NOT NULL
$$;


-- _admit_one for a staged send: only the fast answers (the size, and room_until, the leader's
-- estimate against max_queue_size), while a mover is alive (stage_until); anything else goes
-- the queue's way, which applies every limit exactly. Asks for the commit-time wake-up in
-- courier.wake_staged (every staged message is due); sets no insert_counted, since the queue's
-- insert trigger never sees the row.
CREATE OR REPLACE FUNCTION courier._admit_staged(p_limits courier.send_limits, p_size bigint) RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT p_limits.stage_until > statement_timestamp()
       AND p_size <= p_limits.max_payload_size
       AND p_limits.room_until > statement_timestamp()
       AND set_config('courier.wake_staged', CASE WHEN p_limits.notify_on_send THEN 'on' ELSE 'off' END,
                      true) IS NOT NULL
$$;

-- _room_for with the limits read here. The active count is a sum over the trigger-maintained
-- counter rows, so this is O(1) in the size of the queue. In plpgsql: a SQL function that reads
-- a table is not inlined, and PostgreSQL 15 parses and plans its query on every call (58 us of
-- each send_batch, in pg_stat_user_functions).
CREATE OR REPLACE FUNCTION courier._has_room(p_incoming bigint) RETURNS boolean
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_limits courier.send_limits;
BEGIN
    SELECT * INTO v_limits FROM courier.send_limits;
    RETURN courier._room_for(v_limits, p_incoming);
END
$$;

CREATE OR REPLACE FUNCTION courier._max_payload_size() RETURNS bigint
LANGUAGE plpgsql STABLE
AS $$ BEGIN RETURN (SELECT max_payload_size FROM courier.send_limits); END $$;

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
    IF NOT EXISTS (SELECT FROM courier.send_limits) THEN  -- else every send would come back here
        RAISE EXCEPTION '[courier] the row of courier.send_limits is missing' USING ERRCODE = '55000',
            HINT = 'Change any setting (courier.set_setting) to write it again';
    END IF;
    SELECT enabled INTO v_enabled FROM courier.endpoints WHERE name = p_endpoint_name;
    IF v_enabled IS NULL AND p_endpoint_name LIKE '%.dlq' THEN  -- no endpoint has such a name
        RAISE EXCEPTION '[courier] endpoint names ending in ".dlq" are reserved: % holds the dead letters of %, '
                        'which only dead-lettering puts there', p_endpoint_name, left(p_endpoint_name, -4)
            USING ERRCODE = '22023',
                  HINT = 'Send to the endpoint or topic itself; consumers dequeue a topic''s dead letters from TOPIC.dlq';
    END IF;
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
        v_active := courier._active_messages(NULL);
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

-- A message's own max_retries (send_with_options, enqueue): the range a retry policy takes.
CREATE OR REPLACE FUNCTION courier._check_max_retries(p_max_retries integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_max_retries NOT BETWEEN 0 AND 1000 THEN
        RAISE EXCEPTION '[courier] max_retries must be between 0 and 1000, got %', p_max_retries
            USING ERRCODE = '22023', COLUMN = 'max_retries',
                  HINT = 'Leave it NULL for the endpoint''s retry policy (a topic''s max_retries)';
    END IF;
END
$$;

-- Per-message headers are sent as HTTP headers: a flat object of string values. Framing and
-- hop-by-hop headers, Host, User-Agent and Courier's own X-Courier-* are Courier's to set (a
-- producer's Content-Length once truncated a payload that was then recorded as delivered),
-- and a value with a control character (CR, LF or any other C0 control but tab, or DEL) could
-- never be sent: the HTTP dispatcher's client refuses it, as RFC 9110 does, and every message
-- carrying it was dead-lettered. Both are refused here, at send (issue 40). p_field names the
-- map in errors, as their COLUMN ("headers.X-Foo", "config.headers.X-Foo"). Called only for a
-- non-empty map, so a send without headers pays nothing; one with pays one regex per value.
DROP FUNCTION IF EXISTS courier._check_headers(jsonb);
CREATE OR REPLACE FUNCTION courier._check_headers(p_headers jsonb, p_field text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v_name text;
    v_value jsonb;
    v_bad text;
BEGIN
    FOR v_name, v_value IN SELECT key, value FROM jsonb_each(p_headers) LOOP
        IF v_name !~ '^[!#$%&''*+.^_`|~0-9A-Za-z-]+$' OR length(v_name) > 256 THEN
            RAISE EXCEPTION '[courier] % name % is not a valid HTTP header name',
                    CASE WHEN p_field = 'headers' THEN 'header' ELSE p_field END, to_jsonb(v_name)
                USING ERRCODE = '22023', COLUMN = p_field || '.' || v_name;
        END IF;
        IF lower(v_name) IN ('content-length', 'transfer-encoding', 'host', 'user-agent', 'connection',
                             'keep-alive', 'te', 'trailer', 'upgrade', 'expect', 'proxy-connection',
                             'proxy-authorization', 'proxy-authenticate')
           OR lower(v_name) LIKE 'x-courier-%' THEN
            RAISE EXCEPTION '[courier] % is set by Courier and cannot be sent per message',
                    CASE WHEN p_field = 'headers' THEN 'header ' || v_name ELSE p_field || '.' || v_name END
                USING ERRCODE = '22023', COLUMN = p_field || '.' || v_name,
                      HINT = 'Leave out framing, hop-by-hop, Host, User-Agent and X-Courier-* headers';
        END IF;
        IF jsonb_typeof(v_value) <> 'string' THEN
            RAISE EXCEPTION '[courier] % must have a string value, not %',
                    CASE WHEN p_field = 'headers' THEN 'header ' || v_name ELSE p_field || '.' || v_name END,
                    jsonb_typeof(v_value)
                USING ERRCODE = '22023', COLUMN = p_field || '.' || v_name;
        END IF;
        IF v_value #>> '{}' ~ '[\x01-\x08\x0a-\x1f\x7f]' THEN
            v_bad := substring(v_value #>> '{}' FROM '[\x01-\x08\x0a-\x1f\x7f]');
            RAISE EXCEPTION '[courier] % has a % in its value (U+%)',
                    CASE WHEN p_field = 'headers' THEN 'header ' || v_name ELSE p_field || '.' || v_name END,
                    CASE WHEN v_bad IN (E'\r', E'\n') THEN 'line break' ELSE 'control character' END,
                    lpad(upper(to_hex(ascii(v_bad))), 4, '0')
                USING ERRCODE = '22023', COLUMN = p_field || '.' || v_name,
                      HINT = 'HTTP header values cannot hold control characters (CR, LF, other C0 controls but tab, DEL)';
        END IF;
    END LOOP;
END
$$;

-- Sends hold their endpoint (by name) in share mode until they commit and drop_endpoint takes
-- it exclusively, so a drop waits for the sends already under way and sees their messages:
-- racing past it, a send left a message with no endpoint, counted as active forever. An
-- advisory lock rather than a row lock: a row lock per send turns concurrent producers
-- into multixact churn on the endpoint row. But any database user can take any advisory key,
-- and one holding this one exclusively blocked every send to the endpoint (issue 23): when
-- the shared lock is not free at once, the send holds the endpoint row (KEY SHARE) instead,
-- which drop_endpoint also waits for (it locks the row FOR UPDATE) and which no role but
-- Courier's owner can lock.
-- Returns true (a value, so that callers may take it as an expression rather than a statement;
-- it returned void before, hence the DROP). SQL, so that it is inlined into its caller's
-- expression: the row lock, a statement, is in a function of its own, called only when the
-- advisory lock is taken (a plpgsql call here cost every send about 10,000 instructions).
CREATE OR REPLACE FUNCTION courier._hold_endpoint_row(p_endpoint_name text) RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM 1 FROM courier.endpoints e WHERE e.name OPERATOR(pg_catalog.=) p_endpoint_name FOR KEY SHARE;
    RETURN true;
END
$$;

DROP FUNCTION IF EXISTS courier._hold_endpoint_for_send(text);
CREATE OR REPLACE FUNCTION courier._hold_endpoint_for_send(p_endpoint_name text) RETURNS boolean
LANGUAGE sql
AS $$
    SELECT pg_catalog.pg_try_advisory_xact_lock_shared(pg_catalog.hashtext('courier.endpoint'),
                                                       pg_catalog.hashtext(p_endpoint_name))
           OR courier._hold_endpoint_row(p_endpoint_name)
$$;

-- The message's due time is p_scheduled_at, else now() plus the endpoint's delay_seconds (SQS
-- delay queues), read from the endpoint row the INSERT joins anyway: no statement of its own. A
-- delayed message is not due, so it asks for no wake-up. OFFSET 0 keeps the due time a subquery
-- computed once: pulled up, its expression was copied into the four places that use it, each
-- made ready by the executor in every send (21,000 instructions). p_max_retries, when given, is the
-- message's own limit of retries, over the endpoint's retry policy or the topic's max_retries.
DROP FUNCTION IF EXISTS courier._send_one(text, jsonb, integer, timestamptz, text, uuid, timestamptz, text, jsonb, jsonb);
CREATE OR REPLACE FUNCTION courier._send_one(
    p_endpoint_name text, p_payload jsonb, p_priority integer, p_scheduled_at timestamptz,
    p_idempotency_key text, p_correlation_id uuid, p_expires_at timestamptz, p_ordering_key text,
    p_headers jsonb, p_metadata jsonb, p_max_retries integer
) RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_slot integer;  -- its counter row (_count_sent_in_slot)
    -- The size as delivered (JSON text), not as stored: jsonb may be compressed many times over.
    v_size bigint := octet_length(p_payload::text);
    v_hash text;
    v_id bigint;
    v_existing_hash text;
    v_existing_id bigint;
    v_held boolean;
    v_endpoint_id integer;
BEGIN
    IF p_payload IS NULL THEN
        RAISE EXCEPTION '[courier] payload must not be NULL' USING ERRCODE = '22004';
    END IF;
    -- The options a plain send() leaves at their defaults are checked only when given: each
    -- IF is an expression evaluated on its own, together 3% of a plain send's instructions.
    IF p_priority IS DISTINCT FROM 0 OR p_scheduled_at IS NOT NULL OR p_expires_at IS NOT NULL
       OR p_headers IS NOT NULL OR p_metadata IS NOT NULL OR p_idempotency_key IS NOT NULL
       OR p_ordering_key IS NOT NULL OR p_max_retries IS NOT NULL THEN
        IF p_priority IS NULL OR p_priority NOT BETWEEN 0 AND 10 THEN
            PERFORM courier._check_priority(p_priority);
        END IF;
        -- 'infinity' is never due (or never expires) and '-infinity' sorts before every due
        -- time, where dequeue parks the messages it dead-letters: both are refused.
        IF NOT isfinite(p_scheduled_at) OR NOT isfinite(p_expires_at) THEN
            RAISE EXCEPTION '[courier] % must be a finite time, got %',
                    CASE WHEN NOT isfinite(p_scheduled_at) THEN 'scheduled_at' ELSE 'expires_at' END,
                    CASE WHEN NOT isfinite(p_scheduled_at) THEN p_scheduled_at ELSE p_expires_at END
                USING ERRCODE = '22023', HINT = 'Leave it NULL for now (scheduled_at) or for no expiry (expires_at)';
        END IF;
        IF p_expires_at <= p_scheduled_at THEN
            RAISE EXCEPTION '[courier] expires_at % is not after scheduled_at %', p_expires_at, p_scheduled_at
                USING ERRCODE = '22023', HINT = 'The message would expire before it could be delivered';
        END IF;
        IF jsonb_typeof(p_headers) <> 'object' OR jsonb_typeof(p_metadata) <> 'object' THEN
            RAISE EXCEPTION '[courier] headers and metadata must be JSON objects' USING ERRCODE = '22023';
        END IF;
        IF p_headers <> '{}' THEN
            PERFORM courier._check_headers(p_headers, 'headers');
        END IF;
        IF p_metadata <> '{}' AND jsonb_path_exists(p_metadata, 'strict $.**{32}') THEN
            RAISE EXCEPTION '[courier] metadata is nested more than 32 levels deep' USING ERRCODE = '22023',
                HINT = 'Flatten the metadata; deeper documents cannot be decoded safely by every client';
        END IF;
        IF length(p_idempotency_key) NOT BETWEEN 1 AND 255 OR length(p_ordering_key) NOT BETWEEN 1 AND 255 THEN
            RAISE EXCEPTION '[courier] idempotency and ordering keys must be 1 to 255 characters' USING ERRCODE = '22023';
        END IF;
        IF p_max_retries NOT BETWEEN 0 AND 1000 THEN
            PERFORM courier._check_max_retries(p_max_retries);
        END IF;
    END IF;
    IF p_idempotency_key IS NOT NULL THEN
        v_hash := md5(p_payload::text);
    END IF;
    -- Before the INSERT, whose snapshot is then taken after any drop it waited for. An
    -- assignment rather than PERFORM: an expression, evaluated without a statement of its own.
    v_held := courier._hold_endpoint_for_send(p_endpoint_name);

    LOOP
        IF p_idempotency_key IS NULL THEN
            INSERT INTO courier.queue (endpoint_id, payload, headers, metadata, priority, scheduled_at,
                                       correlation_id, expires_at, ordering_key, visible_at, max_retries)
            SELECT e.id, p_payload, coalesce(p_headers, '{}'), coalesce(p_metadata, '{}'), p_priority,
                   d.due, p_correlation_id,
                   coalesce(p_expires_at, coalesce(d.due, now()) + make_interval(secs => nullif(
                       coalesce(e.config_ttl_seconds, l.default_message_ttl), 0))),
                   p_ordering_key, courier._pull_visible_at(e.protocol, d.due), p_max_retries
            FROM courier.endpoints e, courier.send_limits l,
                 LATERAL (SELECT coalesce(p_scheduled_at, now() + e.config_delay) AS due,
                                 coalesce(e.config_max_depth, l.default_max_depth) AS max_depth
                          OFFSET 0) d
            -- The wake-up request is set as the row is made, before its depth counter write
            -- reads it (see the top of this file); here rather than in a statement of its own.
            WHERE e.name = p_endpoint_name AND e.enabled
              AND courier._admit_one(l, e.id, v_size, d.max_depth, d.due IS NULL OR d.due <= now())
            RETURNING id, endpoint_id, cmin::text::bigint >> 7 INTO v_id, v_endpoint_id, v_slot;
            v_held := set_config('courier.insert_counted', 'off', true) IS NOT NULL;
        ELSE
            INSERT INTO courier.queue (endpoint_id, payload, headers, metadata, priority, scheduled_at,
                                       idempotency_key, payload_hash, correlation_id, expires_at, ordering_key,
                                       visible_at, max_retries)
            SELECT e.id, p_payload, coalesce(p_headers, '{}'), coalesce(p_metadata, '{}'), p_priority,
                   d.due, p_idempotency_key, v_hash, p_correlation_id,
                   coalesce(p_expires_at, coalesce(d.due, now()) + make_interval(secs => nullif(
                       coalesce(e.config_ttl_seconds, l.default_message_ttl), 0))),
                   p_ordering_key, courier._pull_visible_at(e.protocol, d.due), p_max_retries
            FROM courier.endpoints e, courier.send_limits l,
                 LATERAL (SELECT coalesce(p_scheduled_at, now() + e.config_delay) AS due,
                                 coalesce(e.config_max_depth, l.default_max_depth) AS max_depth
                          OFFSET 0) d
            WHERE e.name = p_endpoint_name AND e.enabled
              AND courier._admit_one(l, e.id, v_size, d.max_depth, d.due IS NULL OR d.due <= now())
            ON CONFLICT (endpoint_id, idempotency_key)
                WHERE idempotency_key IS NOT NULL AND status IN ('pending', 'processing')
            DO NOTHING
            RETURNING id, endpoint_id, cmin::text::bigint >> 7 INTO v_id, v_endpoint_id, v_slot;
            v_held := set_config('courier.insert_counted', 'off', true) IS NOT NULL;

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
                                  HINT = format('Message %s holds this key while it is queued, and for idempotency_retention_seconds (%s) after it is delivered', v_id, courier._setting_int('idempotency_retention_seconds'));
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
    -- Counted here: the insert trigger skips a statement flagged courier.insert_counted.
    v_held := courier._count_sent_in_slot(v_endpoint_id, p_priority, 1, v_slot);
    -- What the trigger would mark (_note_ordering_keys), called only while the endpoint is not
    -- marked: the call and its UPDATE on every keyed send cost it 48,000 instructions (698,110 ->
    -- 745,985); this look, 30,000.
    IF p_ordering_key IS NOT NULL
       AND NOT EXISTS (SELECT FROM courier.endpoints WHERE id = v_endpoint_id AND ordering_keys) THEN
        PERFORM courier._note_ordering_keys(v_endpoint_id);
    END IF;
    IF p_idempotency_key IS NOT NULL THEN
        -- Checked after the insert, in a new snapshot, so that a holder delivered and archived
        -- while this insert waited on it is seen too.
        v_existing_id := courier._delivered_key_holder(p_endpoint_name, p_idempotency_key, v_hash);
        IF v_existing_id IS NOT NULL THEN
            DELETE FROM courier.queue WHERE id = v_id;
            RETURN v_existing_id;
        END IF;
    END IF;

    RETURN v_id;
END
$$;

-- Unique jobs (River's UniqueOpts, issue 42): the idempotency key a send asks for by its payload
-- and, with p_period_seconds, by the period of now() it falls in (a period alone is refused: two
-- different payloads under one key are the 23505 conflict an idempotency key means). JSONB's text is canonical (key
-- order and spacing are the value's, not the producer's), so the same JSON gives the same key.
-- The key is an idempotency key like any: per endpoint, held while the message is queued and
-- for idempotency_retention_seconds after its delivery, a duplicate answered with the first id.
CREATE OR REPLACE FUNCTION courier._unique_key(p_idempotency_key text, p_payload jsonb, p_by_payload boolean,
                                               p_period_seconds integer) RETURNS text
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF p_idempotency_key IS NOT NULL THEN
        RAISE EXCEPTION '[courier] unique_by_payload and unique_period_seconds derive the idempotency key: give them or idempotency_key, not both'
            USING ERRCODE = '22023', COLUMN = 'idempotency_key';
    END IF;
    IF p_by_payload IS NULL AND p_period_seconds IS NULL THEN
        RAISE EXCEPTION '[courier] unique_by_payload must be true or false, got NULL'
            USING ERRCODE = '22023', COLUMN = 'unique_by_payload';
    ELSIF p_by_payload IS NOT true THEN
        RAISE EXCEPTION '[courier] unique_period_seconds needs unique_by_payload (uniqueness by payload, within each period), got unique_by_payload %',
                coalesce(p_by_payload::text, 'NULL')
            USING ERRCODE = '22023', COLUMN = 'unique_by_payload';
    END IF;
    IF p_period_seconds NOT BETWEEN 1 AND 31536000 THEN
        RAISE EXCEPTION '[courier] unique_period_seconds must be between 1 and 31536000, got %', p_period_seconds
            USING ERRCODE = '22023', COLUMN = 'unique_period_seconds';
    END IF;
    RETURN 'unique:' || md5(p_payload::text) || coalesce(':' || floor(extract(epoch FROM now()) / p_period_seconds)::bigint::text, '');
END
$$;

-- p_max_retries and the unique options came last (issue 42, items 9 and 11): the signatures
-- before them are dropped, or calls that leave them out would be ambiguous.
DROP FUNCTION IF EXISTS courier.send_with_options(text, jsonb, integer, timestamptz, text, uuid, timestamptz, text,
                                                  jsonb, jsonb);
DROP FUNCTION IF EXISTS courier.send_with_options(text, jsonb, integer, timestamptz, text, uuid, timestamptz, text,
                                                  jsonb, jsonb, integer);
CREATE OR REPLACE FUNCTION courier.send_with_options(
    p_endpoint_name         text,
    p_payload               jsonb,
    p_priority              integer     DEFAULT 0,
    p_scheduled_at          timestamptz DEFAULT NULL,
    p_idempotency_key       text        DEFAULT NULL,
    p_correlation_id        uuid        DEFAULT NULL,
    p_expires_at            timestamptz DEFAULT NULL,
    p_ordering_key          text        DEFAULT NULL,
    p_headers               jsonb       DEFAULT NULL,
    p_metadata              jsonb       DEFAULT NULL,
    p_max_retries           integer     DEFAULT NULL,
    p_unique_by_payload     boolean     DEFAULT false,
    p_unique_period_seconds integer     DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
BEGIN
    RETURN courier._send_one(p_endpoint_name, p_payload, p_priority, p_scheduled_at,
                             CASE WHEN p_unique_by_payload IS NOT false OR p_unique_period_seconds IS NOT NULL
                                  THEN courier._unique_key(p_idempotency_key, p_payload, p_unique_by_payload,
                                                           p_unique_period_seconds)
                                  ELSE p_idempotency_key END,
                             p_correlation_id, p_expires_at, p_ordering_key, p_headers, p_metadata, p_max_retries);
END
$$;

-- send() is _send_one's plain path written out (no options, so no key): calling _send_one, a
-- plpgsql function of eleven arguments, was 31,000 of a send's 648,000 instructions (callgrind,
-- PostgreSQL 15). The INSERT is _send_one's first one with its options at their defaults;
-- tests/test_send_paths.py checks that the two make the same row, push and pull, with a delay
-- and a TTL.
CREATE OR REPLACE FUNCTION courier.send(p_endpoint_name text, p_payload jsonb) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_size bigint := octet_length(p_payload::text);  -- as delivered (see _send_one)
    v_id bigint;
    v_endpoint_id integer;
    v_held boolean;
    v_slot integer;  -- its counter row (_count_sent_in_slot)
    v_never_staged boolean;
    -- courier.never_staged: the session's last endpoint whose send went to the queue because it
    -- never stages (a delay). Its next sends skip the stage's INSERT, which would find no row for
    -- them (77,000 instructions of a send to a delayed endpoint). One name, not a set:
    -- a name per setting costs every send the name's making (18,000).
    v_try_stage boolean := current_setting('courier.never_staged', true) IS DISTINCT FROM p_endpoint_name;
BEGIN
    IF p_payload IS NULL THEN
        RAISE EXCEPTION '[courier] payload must not be NULL' USING ERRCODE = '22004';
    END IF;
    v_held := courier._hold_endpoint_for_send(p_endpoint_name);
    -- Staged (migration 0054) while a mover is alive, for an endpoint or pull topic that is not
    -- paused (nothing comes to take it) with no delay and no max_depth of its own or by default (a
    -- staged message is counted when it is moved, and max_depth is exact), and while the leader's
    -- estimate leaves room (room_until): the message waits in courier.send_stage, taken by the
    -- next claim, dequeue or receive, or moved into the queue by the leader.
    IF v_try_stage THEN
        INSERT INTO courier.send_stage (endpoint_id, payload)
        SELECT e.id, p_payload
        FROM courier.endpoints e, courier.send_limits l
        WHERE e.name = p_endpoint_name AND e.enabled AND e.paused_at IS NULL
          AND e.config_delay IS NULL AND e.config_max_depth IS NULL AND l.default_max_depth = 0
          AND courier._admit_staged(l, v_size)
        RETURNING id INTO v_id;
        IF v_id IS NOT NULL THEN
            RETURN v_id;
        END IF;
    END IF;
    LOOP
        -- The endpoint's delay, TTL and max_depth as config's typed columns (migration 0051).
        INSERT INTO courier.queue (endpoint_id, payload, scheduled_at, expires_at, visible_at)
        SELECT e.id, p_payload, now() + e.config_delay,
               coalesce(now() + e.config_delay, now()) + make_interval(secs => nullif(
                   coalesce(e.config_ttl_seconds, l.default_message_ttl), 0)),
               courier._pull_visible_at(e.protocol, now() + e.config_delay)
        FROM courier.endpoints e, courier.send_limits l
        WHERE e.name = p_endpoint_name AND e.enabled
          AND courier._admit_one(l, e.id, v_size, coalesce(e.config_max_depth, l.default_max_depth),
                                 e.config_delay IS NULL)
        RETURNING id, endpoint_id, cmin::text::bigint >> 7, scheduled_at IS NOT NULL
            INTO v_id, v_endpoint_id, v_slot, v_never_staged;
        v_held := set_config('courier.insert_counted', 'off', true) IS NOT NULL;
        EXIT WHEN v_id IS NOT NULL;
        PERFORM courier._send_refusal(p_endpoint_name, 1, v_size);
    END LOOP;
    v_held := courier._count_sent_in_slot(v_endpoint_id, 0, 1, v_slot);
    IF v_never_staged AND v_try_stage THEN
        v_held := set_config('courier.never_staged', p_endpoint_name, false) IS NOT NULL;
    END IF;
    RETURN v_id;
END
$$;

-- Moves staged rows (courier.send_stage, migration 0054; p_batched of courier.send_stage_batch,
-- migration 0055: a ctid names a row of one table) into courier.queue in one statement, with the
-- id, created_at and expiry the send would have given them (a staged message has no delay,
-- priority or option): pending, or one leased where it waited (migration 0057) in processing
-- under its lease until its visible_until, as a dequeue would have put it there, or one claimed
-- there (migration 0058) in processing under its worker and lease, as a claim would have. The queue's
-- insert trigger counts them (a leased pull message counts as pending: _counted_status). A
-- message whose endpoint was deleted meanwhile is dropped with it. The caller has locked the
-- rows. Returns how many it moved.
CREATE OR REPLACE FUNCTION courier._move_stage_rows(p_rows tid[], p_batched tid[]) RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    v_moved integer;
BEGIN
    WITH staged_one AS (
        DELETE FROM ONLY courier.send_stage s WHERE s.ctid = ANY (p_rows)
        RETURNING s.id, s.endpoint_id, s.created_at, s.payload, s.lease, s.visible_until, s.worker_id
    ),
    staged_batch AS (
        DELETE FROM courier.send_stage_batch s WHERE s.ctid = ANY (p_batched)
        RETURNING s.id, s.endpoint_id, s.created_at, s.payload, s.lease, s.visible_until, s.worker_id
    ),
    staged AS (SELECT * FROM staged_one UNION ALL SELECT * FROM staged_batch)
    INSERT INTO courier.queue (id, endpoint_id, payload, created_at, updated_at, expires_at, visible_at,
                               status, lease, worker_id, processing_started_at)
    OVERRIDING SYSTEM VALUE
    SELECT s.id, s.endpoint_id, s.payload, s.created_at,
           CASE WHEN s.lease IS NULL THEN s.created_at ELSE now() END,
           s.created_at + make_interval(secs => nullif(coalesce(e.config_ttl_seconds, l.default_message_ttl), 0)),
           coalesce(s.visible_until, courier._pull_visible_at(e.protocol, s.created_at)),
           CASE WHEN s.lease IS NULL THEN 'pending' ELSE 'processing' END,
           coalesce(s.lease, 0), s.worker_id,
           CASE WHEN s.worker_id IS NOT NULL THEN now() END  -- a claim's start, at most a second late
    FROM staged s JOIN courier.endpoints e ON e.id = s.endpoint_id, courier.send_limits l;
    GET DIAGNOSTICS v_moved = ROW_COUNT;
    RETURN v_moved;
END
$$;

-- Moves up to p_limit staged messages, oldest first, leased or not, into courier.queue
-- (_move_stage_rows). Movers skip each other's rows. The rows are picked first by the primary
-- key from the left, which steps over the entries of rows moved since the last VACUUM once each
-- (they are marked dead as they are seen): an empty stage costs that look and no more, where a
-- test for any row read every dead row of the heap.
-- Called by functions that set search_path themselves (claim_batch, _unstage's callers).
-- No JIT: with sequential scans off, the scan of the one-row send_limits is costed at 1e10, and
-- the move was JIT-compiled on every run (458 ms, each second of the leader's, on PostgreSQL 15).
CREATE OR REPLACE FUNCTION courier._move_staged(p_limit integer) RETURNS integer
LANGUAGE plpgsql
SET enable_seqscan = off  -- a stage just vacuumed looks empty to the planner; its heap holds dead rows
SET jit = off
AS $$
DECLARE
    v_rows tid[];
    v_batched tid[];
BEGIN
    SELECT array_agg(s.ctid) FILTER (WHERE s.tableoid = 'courier.send_stage'::regclass),
           array_agg(s.ctid) FILTER (WHERE s.tableoid <> 'courier.send_stage'::regclass)
    INTO v_rows, v_batched
    FROM (SELECT c.tableoid, c.ctid FROM courier.send_stage c ORDER BY c.id LIMIT p_limit FOR UPDATE SKIP LOCKED) s;
    IF v_rows IS NULL AND v_batched IS NULL THEN
        RETURN 0;
    END IF;
    RETURN courier._move_stage_rows(v_rows, v_batched);
END
$$;

-- The messages p_ids that are still in the stage moved into the queue (_move_stage_rows), for
-- a verb that then finds them there by id: nack, extend_lease, release and snooze of a message
-- leased in the stage, and an ack's explanation of a lease it did not find. It waits for a
-- mover that holds one of them, and then finds it gone: in the queue, for the verb's next
-- statement to see.
CREATE OR REPLACE FUNCTION courier._unstage_ids(p_ids bigint[]) RETURNS integer
LANGUAGE plpgsql
SET enable_seqscan = off  -- as _move_staged
SET jit = off
AS $$
DECLARE
    v_rows tid[];
    v_batched tid[];
BEGIN
    SELECT array_agg(s.ctid) FILTER (WHERE s.tableoid = 'courier.send_stage'::regclass),
           array_agg(s.ctid) FILTER (WHERE s.tableoid <> 'courier.send_stage'::regclass)
    INTO v_rows, v_batched
    FROM (SELECT c.tableoid, c.ctid FROM courier.send_stage c WHERE c.id = ANY (p_ids) FOR UPDATE) s;
    IF v_rows IS NULL AND v_batched IS NULL THEN
        RETURN 0;
    END IF;
    RETURN courier._move_stage_rows(v_rows, v_batched);
END
$$;

-- A taker's share of the stage (migration 0054), after what the queue holds for its endpoint:
-- a push claim (claim_batch, with p_worker_id), a pull lease (dequeue, with p_timeout) or a
-- receive (neither). The oldest staged messages of p_endpoint_id's and those staged 50 ms ago
-- or more (up to max(p_count, 1000)), not taken there already, are locked in one scan, and the
-- first p_count of p_endpoint_id's that have not expired are taken:
-- - leased (migration 0057) and claimed (migration 0058) ones stay where they are, the lease, or
--   the worker and lease, written into their row: a HOT update of a row with one index, where
--   writing them into the queue taken cost a wide row and its index entries (about 410 bytes of
--   WAL a message). An ack, or a report of a delivery, deletes the row there; the leader moves
--   it into the queue, lease and all, within a second (_move_staged), where every other verb
--   and every listing finds it.
-- - received ones are never written anywhere, and are counted delivered as receive counts its
--   own.
-- The rest (another endpoint's, one past the batch, an expired one, a lapsed lease) go into the
-- queue as they are (_move_stage_rows), for their own takers: another endpoint's fresh messages
-- are left for their own taker, which takes them written once, where a move wrote each twice
-- (the stage, then the queue pending) before its claim or lease wrote it a third time. A staged
-- message has no priority (0, the lowest), no ordering key and no delay, so nothing in the queue
-- should have gone before it that the taker's own look did not already take; and level 0 is in
-- every endpoint's priorities, so there is nothing to note. A message taken in the stage is
-- counted (depth) once it is moved, as a staged one is. Called by functions that set
-- search_path and no JIT.
DROP FUNCTION IF EXISTS courier._claim_staged(text, integer, integer);
DROP FUNCTION IF EXISTS courier._take_staged(integer, integer, integer);  -- its first form, before claims shared it
CREATE OR REPLACE FUNCTION courier._take_staged(p_endpoint_id integer, p_count integer, p_worker_id text,
                                                p_timeout integer)
RETURNS TABLE (id bigint, lease integer, payload jsonb, created_at timestamptz, expires_at timestamptz,
               visible_until timestamptz)
LANGUAGE plpgsql
SET enable_seqscan = off  -- as _move_staged
-- One plan for the life of the connection, as dequeue and receive already had it: under a
-- claim's default the scan was planned again in every claim (about 500,000 instructions).
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_taken tid[];
    v_taken_batched tid[];  -- as _move_staged
    v_rows tid[];
    v_batched tid[];
    v_ttl interval;
    v_lapsed boolean;
    v_set text;
BEGIN
    -- One scan of the stage's head: two, one for each kind, cost a push claim(10) about 200,000
    -- instructions more. The endpoint's time to live is read only when there is a row.
    SELECT array_agg(s.ctid) FILTER (WHERE s.taken AND s.tableoid = 'courier.send_stage'::regclass),
           array_agg(s.ctid) FILTER (WHERE s.taken AND s.tableoid <> 'courier.send_stage'::regclass),
           array_agg(s.ctid) FILTER (WHERE NOT s.taken AND s.tableoid = 'courier.send_stage'::regclass),
           array_agg(s.ctid) FILTER (WHERE NOT s.taken AND s.tableoid <> 'courier.send_stage'::regclass),
           coalesce(bool_or(s.lapsed), false), min(s.ttl)
    INTO v_taken, v_taken_batched, v_rows, v_batched, v_lapsed, v_ttl
    FROM (SELECT t.tableoid, t.ctid, t.ttl, t.endpoint_id = p_endpoint_id AND t.lease IS NOT NULL AS lapsed,
                 t.takeable AND row_number() OVER (PARTITION BY t.takeable ORDER BY t.id) <= p_count AS taken
          FROM (SELECT c.*, c.endpoint_id = p_endpoint_id AND c.lease IS NULL
                            AND coalesce(c.created_at + c.ttl > now(), true) AS takeable
                FROM (SELECT c.tableoid, c.ctid, c.id, c.endpoint_id, c.created_at, c.lease,
                             (SELECT make_interval(secs => nullif(coalesce(e.config_ttl_seconds, l.default_message_ttl), 0))
                              FROM courier.endpoints e, courier.send_limits l WHERE e.id = p_endpoint_id) AS ttl
                      FROM courier.send_stage c
                      WHERE (c.endpoint_id = p_endpoint_id OR c.created_at < statement_timestamp() - interval '50 milliseconds')
                        AND (c.lease IS NULL OR c.visible_until <= now())  -- a lapsed lease is moved; a claim never lapses here
                      ORDER BY c.id LIMIT greatest(p_count, 1000) FOR UPDATE SKIP LOCKED) c) t) s;
    IF v_rows IS NOT NULL OR v_batched IS NOT NULL THEN
        PERFORM courier._move_stage_rows(v_rows, v_batched);
        IF v_lapsed THEN  -- a lapsed lease of p_endpoint_id's, in the queue now for its taker to take again
            v_set := set_config('courier.stage_lapsed', 'on', true);
        END IF;
    END IF;
    IF v_taken IS NULL AND v_taken_batched IS NULL THEN
        RETURN;
    END IF;
    -- Each statement below comes in two forms: one for the stage alone, and one for both of its
    -- tables. Single sends stage in send_stage only, and the second table's empty half cost a
    -- claim or lease about 34,000 instructions more (readying its UPDATE or DELETE, and the
    -- UNION's sort): BENCHMARKS.md, "A worker's cycle in fewer statements".
    IF p_worker_id IS NULL AND p_timeout IS NULL AND v_taken_batched IS NULL THEN  -- received: gone, counted delivered
        RETURN QUERY
        WITH received AS (
            DELETE FROM ONLY courier.send_stage s WHERE s.ctid = ANY (v_taken)
            RETURNING s.id, s.payload, s.created_at
        ),
        delivered AS (
            INSERT INTO courier.delivery_totals AS d (endpoint_id, outcome, backend_pid, total)
            SELECT p_endpoint_id, 'delivered', pg_backend_pid(), count(*) FROM received r HAVING count(*) > 0
            ON CONFLICT (endpoint_id, outcome, backend_pid) DO UPDATE SET total = d.total + excluded.total
        )
        SELECT r.id, NULL::integer, r.payload, r.created_at, r.created_at + v_ttl, NULL::timestamptz
        FROM received r ORDER BY r.id;
        RETURN;
    ELSIF p_worker_id IS NULL AND p_timeout IS NULL THEN
        RETURN QUERY
        WITH received_one AS (
            DELETE FROM ONLY courier.send_stage s WHERE s.ctid = ANY (v_taken)
            RETURNING s.id, s.payload, s.created_at
        ),
        received_batch AS (
            DELETE FROM courier.send_stage_batch s WHERE s.ctid = ANY (v_taken_batched)
            RETURNING s.id, s.payload, s.created_at
        ),
        received AS (SELECT * FROM received_one UNION ALL SELECT * FROM received_batch),
        delivered AS (
            INSERT INTO courier.delivery_totals AS d (endpoint_id, outcome, backend_pid, total)
            SELECT p_endpoint_id, 'delivered', pg_backend_pid(), count(*) FROM received r HAVING count(*) > 0
            ON CONFLICT (endpoint_id, outcome, backend_pid) DO UPDATE SET total = d.total + excluded.total
        )
        SELECT r.id, NULL::integer, r.payload, r.created_at, r.created_at + v_ttl, NULL::timestamptz
        FROM received r ORDER BY r.id;
        RETURN;
    END IF;
    -- Leased (p_timeout) or claimed (p_worker_id) where it waits.
    IF v_taken_batched IS NULL THEN
        RETURN QUERY
        WITH taken AS (
            UPDATE ONLY courier.send_stage s
            SET lease = courier._stage_lease(), worker_id = p_worker_id,
                visible_until = now() + make_interval(secs => p_timeout)  -- a claim's: NULL
            WHERE s.ctid = ANY (v_taken)
            RETURNING s.id, s.lease, s.payload, s.created_at, s.visible_until
        )
        SELECT t.id, t.lease, t.payload, t.created_at, t.created_at + v_ttl, t.visible_until FROM taken t ORDER BY t.id;
        RETURN;
    END IF;
    RETURN QUERY
    WITH taken_one AS (
        UPDATE ONLY courier.send_stage s
        SET lease = courier._stage_lease(), worker_id = p_worker_id,
            visible_until = now() + make_interval(secs => p_timeout)  -- a claim's: NULL
        WHERE s.ctid = ANY (v_taken)
        RETURNING s.id, s.lease, s.payload, s.created_at, s.visible_until
    ),
    taken_batch AS (
        UPDATE courier.send_stage_batch s
        SET lease = courier._stage_lease(), worker_id = p_worker_id,
            visible_until = now() + make_interval(secs => p_timeout)
        WHERE s.ctid = ANY (v_taken_batched)
        RETURNING s.id, s.lease, s.payload, s.created_at, s.visible_until
    )
    SELECT t.id, t.lease, t.payload, t.created_at, t.created_at + v_ttl, t.visible_until
    FROM (SELECT * FROM taken_one UNION ALL SELECT * FROM taken_batch) t
    ORDER BY t.id;
END
$$;

-- Every staged message into the queue, for whatever must see them all there: the leader each
-- second, and purge, drop and cancel before they look. Returns how many it moved.
CREATE OR REPLACE FUNCTION courier._unstage() RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_moved bigint := 0;
    v_batch integer;
BEGIN
    LOOP
        v_batch := courier._move_staged(5000);
        v_moved := v_moved + v_batch;
        EXIT WHEN v_batch < 5000;
    END LOOP;
    RETURN v_moved;
END
$$;

-- The maintenance leader's job every second: moves whatever the claims left in the stage, then
-- says for the next few seconds that a mover is alive, so that single sends stage meanwhile. A
-- leader that stops leaves at most those seconds of staged messages, which the next claim or
-- leader moves; until then sends go to the queue.
-- p_move false says only that a mover is alive, for a harness that measures what the sends
-- write and moves nothing meanwhile (`courier bench cost`).
CREATE OR REPLACE FUNCTION courier.keep_send_stage(p_move boolean DEFAULT true) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
BEGIN
    IF p_move THEN
        PERFORM courier._unstage();
    END IF;
    -- Every other second: each write of the row leaves a version that every send reads past
    -- until it is pruned (6,000 instructions of an enqueue with this and the estimate each second).
    UPDATE courier.send_limits SET stage_until = clock_timestamp() + interval '5 seconds'
    WHERE stage_until IS NULL OR stage_until < clock_timestamp() + interval '3500 milliseconds';
    RETURN 0;  -- a maintenance job's count of work done: quiet, every second
END
$$;

-- One INSERT for the whole batch and one NOTIFY; the whole batch is rejected if any part of
-- it is invalid or if it would push the queue past max_queue_size.
-- The enabled endpoint with room for p_count more messages of at most p_largest bytes each
-- (max_payload_size, max_queue_size and its own max_depth), held against a concurrent drop
-- until commit; raises send()'s error when it has none. The batch send paths start here.
CREATE OR REPLACE FUNCTION courier._endpoint_with_room(p_endpoint_name text, p_count bigint, p_largest bigint)
RETURNS courier.endpoints
LANGUAGE plpgsql
AS $$
DECLARE
    v_endpoint courier.endpoints;
BEGIN
    PERFORM courier._hold_endpoint_for_send(p_endpoint_name);
    LOOP
        SELECT e.* INTO v_endpoint
        FROM courier.endpoints e, courier.send_limits l
        WHERE e.name = p_endpoint_name AND e.enabled AND coalesce(p_largest, 0) <= l.max_payload_size
          AND courier._room_for(l, p_count)
          AND (coalesce((e.config ->> 'max_depth')::bigint, l.default_max_depth) = 0
               OR coalesce((e.config ->> 'max_depth')::bigint, l.default_max_depth)
                  >= p_count + courier._active_messages(e.id));
        IF FOUND THEN
            RETURN v_endpoint;
        END IF;
        -- Raises the reason; returns only when the refusal went away meanwhile: look again.
        PERFORM courier._send_refusal(p_endpoint_name, p_count, p_largest);
    END LOOP;
END
$$;

-- Whether claims are taking what is staged, for a batch deciding whether to stage (migration
-- 0055): the stage is empty, or its oldest message was staged less than 100 ms ago. The stage's
-- primary keys, from the left, whatever the planner thinks of a stage it saw empty (as
-- _move_staged, and so no JIT).
CREATE OR REPLACE FUNCTION courier._stage_flowing() RETURNS boolean
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    RETURN coalesce((SELECT s.created_at FROM courier.send_stage s WHERE s.lease IS NULL  -- not taken there
                     ORDER BY s.id LIMIT 1), 'infinity')
           > statement_timestamp() - interval '100 milliseconds';
END
$$;

-- A batch of plain messages (priority 0, no options) staged as a single send stages (send), or
-- NULL when it goes to the queue instead (migration 0055): an endpoint or pull topic (only a pull
-- topic with p_pull_only, for enqueue_batch) that is not paused, no delay or max_depth, a mover
-- alive, claims and dequeues taking what is staged (its oldest message staged less than 100 ms
-- ago: see migration 0055), every payload within max_payload_size (p_largest), and room for the
-- whole batch by the leader's estimate, which counts the stage (an exact count of the queue's
-- counters would not). The first message goes to courier.send_stage, whose trigger wakes the
-- endpoint at commit (asked for whatever notify_on_send says, as for a batch sent to the queue),
-- the rest to courier.send_stage_batch, which has no trigger to fire for each row.
CREATE OR REPLACE FUNCTION courier._stage_batch(p_endpoint_name text, p_payloads jsonb[], p_largest bigint,
                                                p_pull_only boolean) RETURNS bigint[]
LANGUAGE plpgsql
AS $$
DECLARE
    v_count integer := cardinality(p_payloads);
    v_endpoint_id integer;
    v_first bigint;
    v_ids bigint[];
BEGIN
    PERFORM courier._hold_endpoint_for_send(p_endpoint_name);
    SELECT e.id INTO v_endpoint_id
    FROM courier.endpoints e, courier.send_limits l
    WHERE e.name = p_endpoint_name AND e.enabled AND e.paused_at IS NULL AND (e.protocol = 'pull' OR NOT p_pull_only)
      AND e.config_delay IS NULL AND e.config_max_depth IS NULL AND l.default_max_depth = 0
      AND l.stage_until > statement_timestamp()
      AND coalesce(p_largest, 0) <= l.max_payload_size
      AND courier._stage_flowing()
      AND (l.max_queue_size = 0 OR l.estimated_at > statement_timestamp() - interval '2 seconds'
                                   AND l.active_estimate + v_count <= l.max_queue_size / 2);
    IF v_endpoint_id IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM set_config('courier.wake_staged', 'on', true);
    INSERT INTO courier.send_stage (endpoint_id, payload)
    SELECT v_endpoint_id, u.payload FROM unnest(p_payloads) WITH ORDINALITY AS u(payload, ord) WHERE u.ord = 1
    RETURNING id INTO v_first;
    WITH staged AS (
        INSERT INTO courier.send_stage_batch (endpoint_id, payload)
        SELECT v_endpoint_id, u.payload
        FROM unnest(p_payloads) WITH ORDINALITY AS u(payload, ord)
        WHERE u.ord > 1
        ORDER BY u.ord
        RETURNING id
    )
    SELECT v_first || coalesce(array_agg(id ORDER BY id), '{}') INTO v_ids FROM staged;
    RETURN v_ids;
END
$$;

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
    v_endpoint courier.endpoints;
    v_expires_at timestamptz;
    v_visible_at timestamptz;
    v_scheduled_at timestamptz;
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

    IF p_priority = 0 AND v_count > 0 THEN
        v_ids := courier._stage_batch(p_endpoint_name, p_payloads, v_largest, false);
        IF v_ids IS NOT NULL THEN
            RETURN v_ids;
        END IF;
    END IF;
    v_endpoint := courier._endpoint_with_room(p_endpoint_name, v_count, v_largest);
    v_endpoint_id := v_endpoint.id;
    -- The endpoint's delay_seconds, if it has one, makes the whole batch due that much later.
    v_scheduled_at := now() + make_interval(secs => nullif((v_endpoint.config ->> 'delay_seconds')::integer, 0));
    v_expires_at := coalesce(v_scheduled_at, now()) + make_interval(secs => courier._message_ttl(v_endpoint.config));
    v_visible_at := courier._pull_visible_at(v_endpoint.protocol, v_scheduled_at);
    IF v_count = 0 THEN
        RETURN '{}';
    END IF;

    -- One wake-up per batch, whatever notify_on_send says (see the top of this file); none for
    -- a delayed batch, which is not due.
    PERFORM set_config('courier.wake_at_commit', CASE WHEN v_scheduled_at IS NULL THEN 'on' ELSE 'off' END, true);
    -- The TTL and due time are the batch's, computed once above: per row they halved the rate.
    -- Counted below (_count_sent), not by the insert trigger, which would aggregate the batch's
    -- transition table again to learn what is known here: 3,500 instructions a message.
    PERFORM set_config('courier.insert_counted', 'on', true);
    WITH inserted AS (
        INSERT INTO courier.queue (endpoint_id, payload, priority, scheduled_at, expires_at, visible_at)
        SELECT v_endpoint_id, payload, p_priority, v_scheduled_at, v_expires_at, v_visible_at
        FROM unnest(p_payloads) WITH ORDINALITY AS u(payload, ord)
        ORDER BY ord
        RETURNING id
    )
    SELECT array_agg(id ORDER BY id) INTO v_ids FROM inserted;
    PERFORM set_config('courier.insert_counted', 'off', true);
    PERFORM courier._count_sent(v_endpoint_id, p_priority, v_count);

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

-- A batch of messages each with its own options: the batch path for replay and ingest, which
-- must keep every per-message field. Each array holds one element per payload, or is NULL for
-- the default (priority 0, no key, empty headers and metadata...). Every element is checked as
-- send_with_options checks one message, and an error names the element; the whole batch is
-- refused if any element is invalid or if it would push the queue past max_queue_size. An
-- idempotency key already held for this endpoint by a pending or processing message (or by an
-- earlier element of the same batch) yields that message's id, or a conflict if the payload
-- differs. Returns the ids in element order.
DROP FUNCTION IF EXISTS courier._message_batch(jsonb[], integer[], timestamptz[], text[], uuid[], timestamptz[], text[],
                                               jsonb[], jsonb[]);
CREATE OR REPLACE FUNCTION courier._message_batch(
    p_payloads jsonb[], p_priorities integer[], p_scheduled_at timestamptz[], p_idempotency_keys text[],
    p_correlation_ids uuid[], p_expires_at timestamptz[], p_ordering_keys text[], p_headers jsonb[],
    p_metadata jsonb[], p_max_retries integer[]
) RETURNS TABLE (ord integer, payload jsonb, priority integer, scheduled_at timestamptz, idempotency_key text,
                 correlation_id uuid, expires_at timestamptz, ordering_key text, headers jsonb, metadata jsonb,
                 max_retries integer)
LANGUAGE sql IMMUTABLE
AS $$
    SELECT u.ord::integer, u.payload, CASE WHEN p_priorities IS NULL THEN 0 ELSE u.priority END, u.scheduled_at,
           u.idempotency_key, u.correlation_id, u.expires_at, u.ordering_key, coalesce(u.headers, '{}'),
           coalesce(u.metadata, '{}'), u.max_retries
    FROM unnest(p_payloads, p_priorities, p_scheduled_at, p_idempotency_keys, p_correlation_ids, p_expires_at,
                p_ordering_keys, p_headers, p_metadata, p_max_retries)
         WITH ORDINALITY AS u(payload, priority, scheduled_at, idempotency_key, correlation_id, expires_at,
                              ordering_key, headers, metadata, max_retries, ord)
$$;

-- A message that gives no scheduled_at is due after the endpoint's delay_seconds, as in _send_one.
DROP FUNCTION IF EXISTS courier._send_messages(text, jsonb[], integer[], timestamptz[], text[], uuid[], timestamptz[],
                                               text[], jsonb[], jsonb[]);
CREATE OR REPLACE FUNCTION courier._send_messages(
    p_endpoint_name text, p_payloads jsonb[], p_priorities integer[], p_scheduled_at timestamptz[],
    p_idempotency_keys text[], p_correlation_ids uuid[], p_expires_at timestamptz[], p_ordering_keys text[],
    p_headers jsonb[], p_metadata jsonb[], p_max_retries integer[]
) RETURNS bigint[]
LANGUAGE plpgsql
AS $$
DECLARE
    v_count integer := coalesce(cardinality(p_payloads), 0);
    v_limit bigint := courier._max_payload_size();
    v_bad record;
    v_largest bigint;
    v_endpoint_id integer;
    v_ids bigint[] := array_fill(NULL::bigint, ARRAY[coalesce(cardinality(p_payloads), 0)]);
    v_left integer[];       -- elements not yet inserted or matched to a held key
    v_new bigint[];
    v_done integer[];
    v_done_ids bigint[];
    v_held record;
    v_kept record;
    v_delivered bigint;
    v_inserted bigint[] := '{}';   -- rows this call inserted (a held key's row is not ours)
    v_endpoint courier.endpoints;
    v_protocol text;
    v_config jsonb;
    v_ttl double precision;
    v_delay interval;       -- the endpoint's delay_seconds; NULL for none
    v_text text;
    v_hint text;
    v_column text;
BEGIN
    IF EXISTS (SELECT FROM unnest(ARRAY[cardinality(p_priorities), cardinality(p_scheduled_at),
                                        cardinality(p_idempotency_keys), cardinality(p_correlation_ids),
                                        cardinality(p_expires_at), cardinality(p_ordering_keys),
                                        cardinality(p_headers), cardinality(p_metadata),
                                        cardinality(p_max_retries)]) n
               WHERE n <> v_count) THEN
        RAISE EXCEPTION '[courier] each per-message array must have one element per payload (% payloads)', v_count
            USING ERRCODE = '22023', HINT = 'Pass NULL instead of an array for a field no message sets';
    END IF;

    -- The first invalid element, with send_with_options' reason and code.
    SELECT m.ord, x.code, x.reason, CASE WHEN x.rank = 10 THEN 'max_retries' END AS field INTO v_bad
    FROM courier._message_batch(p_payloads, p_priorities, p_scheduled_at, p_idempotency_keys, p_correlation_ids,
                                p_expires_at, p_ordering_keys, p_headers, p_metadata, p_max_retries) m
    CROSS JOIN LATERAL (SELECT * FROM (VALUES
        (1, '22004', 'payload must not be NULL', m.payload IS NULL),
        (2, '22023', format('priority must be between 0 and 10, got %s', coalesce(m.priority::text, 'NULL')),
            m.priority IS NULL OR m.priority NOT BETWEEN 0 AND 10),
        (3, '22023', format('scheduled_at must be a finite time, got %s', m.scheduled_at),
            NOT isfinite(m.scheduled_at)),
        (4, '22023', format('expires_at must be a finite time, got %s', m.expires_at), NOT isfinite(m.expires_at)),
        (5, '22023', format('expires_at %s is not after scheduled_at %s', m.expires_at, m.scheduled_at),
            m.expires_at <= m.scheduled_at),
        (6, '22023', 'headers and metadata must be JSON objects',
            jsonb_typeof(m.headers) <> 'object' OR jsonb_typeof(m.metadata) <> 'object'),
        (7, '22023', 'metadata is nested more than 32 levels deep',
            jsonb_typeof(m.metadata) = 'object' AND m.metadata <> '{}'
            AND jsonb_path_exists(m.metadata, 'strict $.**{32}')),
        (8, '22023', 'idempotency and ordering keys must be 1 to 255 characters',
            length(m.idempotency_key) NOT BETWEEN 1 AND 255 OR length(m.ordering_key) NOT BETWEEN 1 AND 255),
        (9, '54000', format('exceeds max_payload_size (%s bytes)', v_limit), octet_length(m.payload::text) > v_limit),
        (10, '22023', format('max_retries must be between 0 and 1000, got %s', m.max_retries),
            m.max_retries NOT BETWEEN 0 AND 1000)
    ) AS c(rank, code, reason, failed) WHERE c.failed ORDER BY c.rank LIMIT 1) x
    ORDER BY m.ord LIMIT 1;
    IF FOUND AND v_bad.field IS NOT NULL THEN
        RAISE EXCEPTION '[courier] batch element %: %', v_bad.ord, v_bad.reason
            USING ERRCODE = v_bad.code, COLUMN = v_bad.field;
    ELSIF FOUND THEN
        RAISE EXCEPTION '[courier] batch element %: %', v_bad.ord, v_bad.reason USING ERRCODE = v_bad.code;
    END IF;
    -- Header rules live in _check_headers; only a failing batch looks for the element to blame.
    BEGIN
        PERFORM courier._check_headers(h, 'headers') FROM unnest(p_headers) h WHERE h IS NOT NULL AND h <> '{}';
    EXCEPTION WHEN invalid_parameter_value THEN
        FOR v_bad IN SELECT o::integer AS ord, h FROM unnest(p_headers) WITH ORDINALITY AS u(h, o)
                     WHERE h IS NOT NULL AND h <> '{}' ORDER BY o LOOP
            BEGIN
                PERFORM courier._check_headers(v_bad.h, 'headers');
            EXCEPTION WHEN invalid_parameter_value THEN
                GET STACKED DIAGNOSTICS v_text = MESSAGE_TEXT, v_hint = PG_EXCEPTION_HINT,
                                        v_column = COLUMN_NAME;
                RAISE EXCEPTION '[courier] batch element %: %', v_bad.ord, replace(v_text, '[courier] ', '')
                    USING ERRCODE = '22023', HINT = v_hint, COLUMN = v_column;
            END;
        END LOOP;
    END;

    SELECT max(octet_length(u.payload::text)) INTO v_largest FROM unnest(p_payloads) u(payload);
    v_endpoint := courier._endpoint_with_room(p_endpoint_name, v_count, v_largest);
    v_endpoint_id := v_endpoint.id;
    v_protocol := v_endpoint.protocol;
    v_config := v_endpoint.config;
    v_ttl := courier._message_ttl(v_config);
    v_delay := make_interval(secs => nullif((v_config ->> 'delay_seconds')::integer, 0));
    IF v_count = 0 THEN
        RETURN '{}';
    END IF;

    -- One wake-up for the batch if any element is due now (see the top of this file). With a
    -- delay, an element without a time of its own is not.
    PERFORM set_config('courier.wake_at_commit',
                       CASE WHEN v_delay IS NULL AND (p_scheduled_at IS NULL
                                 OR EXISTS (SELECT FROM unnest(p_scheduled_at) s WHERE s IS NULL OR s <= now()))
                            THEN 'on'
                            WHEN v_delay IS NOT NULL AND p_scheduled_at IS NOT NULL
                                 AND EXISTS (SELECT FROM unnest(p_scheduled_at) s WHERE s <= now())
                            THEN 'on' ELSE 'off' END, true);
    v_left := ARRAY(SELECT generate_series(1, v_count));
    WHILE cardinality(v_left) > 0 LOOP
        -- Ids drawn in element order keep the batch's order in the queue (FIFO by id); an
        -- element skipped for a held key leaves a gap in the sequence, as any rollback does.
        v_new := ARRAY(SELECT nextval(pg_get_serial_sequence('courier.queue', 'id'))
                       FROM generate_series(1, cardinality(v_left)));
        WITH chosen AS (
            SELECT m.*, v_new[l.k] AS new_id
            FROM unnest(v_left) WITH ORDINALITY AS l(ord, k)
            JOIN courier._message_batch(p_payloads, p_priorities, p_scheduled_at, p_idempotency_keys,
                                        p_correlation_ids, p_expires_at, p_ordering_keys, p_headers,
                                        p_metadata, p_max_retries) m ON m.ord = l.ord
        ), inserted AS (
            INSERT INTO courier.queue (id, endpoint_id, payload, headers, metadata, priority, scheduled_at,
                                       idempotency_key, payload_hash, correlation_id, expires_at, ordering_key,
                                       visible_at, max_retries)
            OVERRIDING SYSTEM VALUE
            SELECT c.new_id, v_endpoint_id, c.payload, c.headers, c.metadata, c.priority, d.due,
                   c.idempotency_key, CASE WHEN c.idempotency_key IS NOT NULL THEN md5(c.payload::text) END,
                   c.correlation_id,
                   coalesce(c.expires_at, coalesce(d.due, now()) + make_interval(secs => v_ttl)),
                   c.ordering_key, courier._pull_visible_at(v_protocol, d.due), c.max_retries
            FROM chosen c CROSS JOIN LATERAL (SELECT coalesce(c.scheduled_at, now() + v_delay) AS due) d
            ORDER BY c.ord
            ON CONFLICT (endpoint_id, idempotency_key)
                WHERE idempotency_key IS NOT NULL AND status IN ('pending', 'processing')
            DO NOTHING
            RETURNING id
        )
        SELECT coalesce(array_agg(c.ord ORDER BY c.ord) FILTER (WHERE i.id IS NULL), '{}'),
               array_agg(c.ord) FILTER (WHERE i.id IS NOT NULL), array_agg(c.new_id) FILTER (WHERE i.id IS NOT NULL)
        INTO v_left, v_done, v_done_ids
        FROM chosen c LEFT JOIN inserted i ON i.id = c.new_id;
        v_ids := ARRAY(SELECT coalesce(d.id, v_ids[n]) FROM generate_series(1, v_count) n
                       LEFT JOIN unnest(v_done, v_done_ids) AS d(ord, id) ON d.ord = n ORDER BY n);
        v_inserted := v_inserted || coalesce(v_done_ids, '{}');
        IF cardinality(v_left) = 0 THEN
            EXIT;
        END IF;

        -- Skipped for a key held by a pending or processing message of this endpoint (perhaps
        -- an earlier element): the same payload yields that message, another is a conflict.
        SELECT m.ord, m.idempotency_key, q.id INTO v_held
        FROM courier._message_batch(p_payloads, p_priorities, p_scheduled_at, p_idempotency_keys, p_correlation_ids,
                                    p_expires_at, p_ordering_keys, p_headers, p_metadata, p_max_retries) m
        JOIN courier.queue q ON q.endpoint_id = v_endpoint_id AND q.idempotency_key = m.idempotency_key
                            AND q.status IN ('pending', 'processing')
        WHERE m.ord = ANY (v_left) AND q.payload_hash IS DISTINCT FROM md5(m.payload::text)
        ORDER BY m.ord LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION '[courier] batch element %: idempotency key ''%'' conflict: same key with different payload',
                    v_held.ord, v_held.idempotency_key
                USING ERRCODE = '23505',
                      HINT = format('Message %s holds this key while it is queued, and for idempotency_retention_seconds (%s) after it is delivered', v_held.id, courier._setting_int('idempotency_retention_seconds'));
        END IF;
        WITH held AS (
            SELECT m.ord, q.id
            FROM courier._message_batch(p_payloads, p_priorities, p_scheduled_at, p_idempotency_keys,
                                        p_correlation_ids, p_expires_at, p_ordering_keys, p_headers, p_metadata,
                                        p_max_retries) m
            JOIN courier.queue q ON q.endpoint_id = v_endpoint_id AND q.idempotency_key = m.idempotency_key
                                AND q.status IN ('pending', 'processing')
            WHERE m.ord = ANY (v_left)
        )
        SELECT ARRAY(SELECT coalesce(h.id, v_ids[n]) FROM generate_series(1, v_count) n
                     LEFT JOIN held h ON h.ord = n ORDER BY n),
               ARRAY(SELECT l FROM unnest(v_left) l WHERE l NOT IN (SELECT ord FROM held) ORDER BY l)
        INTO v_ids, v_left;  -- what is left lost its holder meanwhile: insert it again
    END LOOP;

    -- A key delivered (and perhaps archived) within idempotency_retention_seconds still turns
    -- its duplicate away, as in _send_one: checked after the insert, in a new snapshot.
    FOR v_kept IN SELECT m.ord, m.idempotency_key, md5(m.payload::text) AS hash
                  FROM courier._message_batch(p_payloads, p_priorities, p_scheduled_at, p_idempotency_keys,
                                              p_correlation_ids, p_expires_at, p_ordering_keys, p_headers,
                                              p_metadata, p_max_retries) m
                  WHERE m.idempotency_key IS NOT NULL ORDER BY m.ord LOOP
        v_delivered := courier._delivered_key_holder(p_endpoint_name, v_kept.idempotency_key, v_kept.hash);
        IF v_delivered IS NOT NULL THEN
            DELETE FROM courier.queue WHERE id = v_ids[v_kept.ord] AND id = ANY (v_inserted);
            v_ids[v_kept.ord] := v_delivered;
        END IF;
    END LOOP;

    RETURN v_ids;
END
$$;

-- p_max_retries came last (issue 42, item 9): the signature before it is dropped.
DROP FUNCTION IF EXISTS courier.send_batch_with_options(text, jsonb[], integer[], timestamptz[], text[], uuid[],
                                                        timestamptz[], text[], jsonb[], jsonb[]);
CREATE OR REPLACE FUNCTION courier.send_batch_with_options(
    p_endpoint_name    text,
    p_payloads         jsonb[],
    p_priorities       integer[]     DEFAULT NULL,
    p_scheduled_at     timestamptz[] DEFAULT NULL,
    p_idempotency_keys text[]        DEFAULT NULL,
    p_correlation_ids  uuid[]        DEFAULT NULL,
    p_expires_at       timestamptz[] DEFAULT NULL,
    p_ordering_keys    text[]        DEFAULT NULL,
    p_headers          jsonb[]       DEFAULT NULL,
    p_metadata         jsonb[]       DEFAULT NULL,
    p_max_retries      integer[]     DEFAULT NULL
) RETURNS bigint[]
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
BEGIN
    RETURN courier._send_messages(p_endpoint_name, p_payloads, p_priorities, p_scheduled_at, p_idempotency_keys,
                                  p_correlation_ids, p_expires_at, p_ordering_keys, p_headers, p_metadata,
                                  p_max_retries);
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
