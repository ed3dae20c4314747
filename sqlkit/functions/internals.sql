-- Internal machinery shared by the public API: typed settings, depth counters, the event
-- log with secret redaction, and the immutability of what a producer enqueued.
-- plpgsql, not SQL: a SQL function that reads a table cannot be inlined, and PostgreSQL 15
-- parses and plans its query on every call (issue 13: these helpers and the counters below
-- were a tenth of the worker's hot path in perf, most of it the parser and the planner); a
-- plpgsql function plans once per connection.
CREATE OR REPLACE FUNCTION courier._setting_int(p_name text) RETURNS bigint
LANGUAGE plpgsql STABLE
AS $$ BEGIN RETURN (SELECT value::bigint FROM courier.settings WHERE name = p_name); END $$;

CREATE OR REPLACE FUNCTION courier._setting_bool(p_name text) RETURNS boolean
LANGUAGE plpgsql STABLE
AS $$ BEGIN RETURN (SELECT value::boolean FROM courier.settings WHERE name = p_name); END $$;

-- Courier's one redaction rule (issue 23), defined with sqlkit/redaction.py, which holds the
-- same patterns for text that never reaches the database (worker log lines):
-- tests/test_redaction.py requires the two to agree on a corpus. In text: a URL's user-info up
-- to the last @ of its authority (keeping a username before the first colon), the value after
-- a secret-looking name and = or : (query parameters, headers, JSON), and query parameters
-- named *key* or *sig*. Greedy quantifiers only, so PostgreSQL's longest match is Python's.
-- Then the shapes secrets have wherever they stand (issue 40): the credentials after Bearer or
-- Basic, an API token's secret (courier_ and 24 or more of its characters), a whsec_ key.
CREATE OR REPLACE FUNCTION courier._redact_text(p_text text) RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT pg_catalog.regexp_replace(pg_catalog.regexp_replace(pg_catalog.regexp_replace(
        pg_catalog.regexp_replace(pg_catalog.regexp_replace(pg_catalog.regexp_replace(p_text,
        '([a-z][a-z0-9+.-]*://)([^/?#@:\s"]*:)?[^/?#\s"]*@', '\1\2***@', 'gi'),
        '([a-z0-9_-]*(secret|pass|pwd|token|auth|api[_-]?key|credential|signing|cookie)[a-z0-9_-]*["'']?\s*[:=]\s*["'']?)((bearer|basic|token|digest)\s+)?[^\s"''&,;)}\]]+',
        '\1***', 'gi'),
        '([?&;][a-z0-9_.-]*(key|sig)[a-z0-9_.-]*=)[^&#\s"'']+', '\1***', 'gi'),
        '\y(bearer|basic)(\s+)[a-z0-9._~+/-]{8,}=*', '\1\2***', 'gi'),
        '(courier_)[a-z0-9_-]{24,}', '\1***', 'gi'),
        '(whsec_)[a-z0-9+/=_-]+', '\1***', 'gi')
$$;

-- The same rule over a document: the value of every key that looks like a secret, at any
-- depth, and every string by _redact_text().
CREATE OR REPLACE FUNCTION courier._redact(p_doc jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, courier, pg_temp
AS $$
    SELECT CASE jsonb_typeof(p_doc)
        WHEN 'object' THEN (
            SELECT coalesce(jsonb_object_agg(
                key,
                CASE WHEN key ~* '(secret|pass|pwd|token|auth|api[_-]?key|credential|signing|cookie|private[_-]?key)'
                          AND jsonb_typeof(value) <> 'object'
                     THEN to_jsonb('***'::text)
                     ELSE courier._redact(value) END), '{}'::jsonb)
            FROM jsonb_each(p_doc))
        WHEN 'array' THEN (
            SELECT coalesce(jsonb_agg(courier._redact(value) ORDER BY ord), '[]'::jsonb)
            FROM jsonb_array_elements(p_doc) WITH ORDINALITY AS e(value, ord))
        WHEN 'string' THEN to_jsonb(courier._redact_text(p_doc #>> '{}'))
        ELSE p_doc
    END
$$;

CREATE OR REPLACE FUNCTION courier._log_event(p_event_type text, p_endpoint_id integer, p_details jsonb)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, courier, pg_temp
AS $$
    INSERT INTO courier.event_log (event_type, endpoint_id, details)
    VALUES (p_event_type, p_endpoint_id, courier._redact(coalesce(p_details, '{}'::jsonb)))
$$;

-- The lease a claim or a dequeue takes: random, never the one it replaces, never 0 (a message
-- never leased). A lease fences every settle, so it must not be guessable: a counter made the
-- first lease of every message 1, and a consumer that settled the wrong id with its own lease
-- settled another consumer's message (issue 40). SQL, so it inlines into the UPDATE that uses it.
-- The lower half of the positive integers (2^30 - 1 values: a guess is right once in a billion
-- tries, within one visibility timeout): a lease in the upper half is one a claim or a dequeue
-- took in the send stage (_stage_lease), so that a settle looks in the stage only for the
-- messages that may be there.
CREATE OR REPLACE FUNCTION courier._next_lease(p_old integer) RETURNS integer
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$
    SELECT (1 + (greatest(p_old, 1)::bigint - 1 + 1 + floor(random() * 1073741822)::bigint) % 1073741823)::integer
$$;

-- The lease a claim or a dequeue takes where a message waits in the send stage (migrations 0057
-- and 0058): random, in the upper half, as _next_lease's are in the lower. A message moved from
-- the stage into the queue keeps it until it is taken again there. SQL, inlined.
CREATE OR REPLACE FUNCTION courier._stage_lease() RETURNS integer
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$ SELECT (1073741824 + floor(random() * 1073741823)::bigint)::integer $$;

-- Whether any of p_leases was taken in the send stage (_stage_lease): only then does a settle
-- look there, or move its messages from there into the queue. A plain expression, which inlines
-- into the caller's IF (a subquery here was planned again in every transaction).
CREATE OR REPLACE FUNCTION courier._any_stage_lease(p_leases integer[]) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 1073741824 <= ANY (p_leases) $$;

-- Depth counters ------------------------------------------------------------------------
-- Whether a counter write that adds p_delta messages of p_status asks for the commit-time
-- wake-up (sending.sql): it adds pending messages while the transaction's sends asked for one
-- (courier.wake_at_commit). Such a write, and only such a write, names the column slot in its
-- SET: the wake trigger is restricted to that column, so every other counter write (every
-- consumer's) skips it before anything of it is evaluated. A WHEN on the setting cost every
-- statement that wrote a counter 32,000 instructions, parsed again each time. SQL, inlined.
CREATE OR REPLACE FUNCTION courier._wake_requested(p_status text, p_delta bigint) RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT p_delta > 0 AND p_status = 'pending'
           AND pg_catalog.current_setting('courier.wake_at_commit', true) = 'on'
$$;

-- The trigger functions and small helpers carry no SET search_path: they run on every send,
-- a SET clause costs a GUC save/restore per call, and they name every object in full.
-- Each write adds its changes to its backend's counter rows. The row exists after a backend's
-- first write, so an UPDATE finds it: INSERT ... ON CONFLICT DO UPDATE would lock the row first,
-- a WAL record of its own in every send (queue_depth is unlogged since migration 0038, so the
-- UPDATE writes none), and a statement that could both update and insert cost a send four
-- times the CPU of this one (a plpgsql loop of 4,000 sends in one transaction: 97 us each).
-- p_levels: the priority levels (a bit each) of inserted messages, marked on the endpoint when
-- one other than 0 is new (_note_priorities).
CREATE OR REPLACE FUNCTION courier._add_depth(p_endpoint_id integer, p_status text, p_delta bigint, p_slot integer,
                                              p_levels integer DEFAULT 1)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_wake boolean;
BEGIN
    IF p_levels <> 1 THEN
        PERFORM courier._note_priorities(p_endpoint_id, p_levels);
    END IF;
    v_wake := courier._wake_requested(p_status, p_delta);
    IF v_wake THEN  -- naming slot in the SET is what queues the commit-time wake-up (queue_depth_wake)
        UPDATE courier.queue_depth d SET messages = d.messages + p_delta, slot = d.slot
        WHERE d.endpoint_id = p_endpoint_id AND d.status = p_status AND d.backend_pid = pg_backend_pid()
          AND d.slot = p_slot;
    ELSE
        UPDATE courier.queue_depth d SET messages = d.messages + p_delta
        WHERE d.endpoint_id = p_endpoint_id AND d.status = p_status AND d.backend_pid = pg_backend_pid()
          AND d.slot = p_slot;
    END IF;
    IF NOT FOUND THEN
        INSERT INTO courier.queue_depth AS d (endpoint_id, status, backend_pid, slot, messages)
        VALUES (p_endpoint_id, p_status, pg_backend_pid(), p_slot, p_delta)
        ON CONFLICT (endpoint_id, status, backend_pid, slot) DO UPDATE SET messages = d.messages + excluded.messages;
        IF v_wake THEN  -- an insert names no column: the new row is updated naming slot
            UPDATE courier.queue_depth d SET slot = d.slot
            WHERE d.endpoint_id = p_endpoint_id AND d.status = p_status AND d.backend_pid = pg_backend_pid()
              AND d.slot = p_slot;
        END IF;
    END IF;
END
$$;

-- Counts p_messages messages a send has just inserted, pending at p_priority, for one endpoint,
-- into this backend's counter row in p_slot: the counting trigger's work for that statement,
-- which the send flagged with courier.insert_counted so that the trigger returns at once. The
-- trigger's call, its transition table, its aggregate and its UPDATE cost a single send about
-- 196,000 instructions; this call and its UPDATE, about 90,000 (callgrind, PostgreSQL 15).
--
-- The slot bounds the versions of one counter row a long transaction leaves (every update of
-- it adds one that no one can prune until the transaction ends, and the next update walks
-- them). A single send (send, _send_one, enqueue) passes its INSERT's command id shifted by 7
-- (`cmin::text::bigint >> 7` in its RETURNING): each send takes at least two command ids (its
-- INSERT and this UPDATE), so a transaction moves to a new row after 64 sends at most, as the
-- triggers' slots do from courier.depth_writes, without a setting read and written in every
-- send (19,000 instructions of 571,000). compact_queue_depth() folds the extra slots back.
CREATE OR REPLACE FUNCTION courier._count_sent_in_slot(p_endpoint_id integer, p_priority integer, p_messages bigint,
                                                       p_slot integer) RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
    -- _add_depth's UPDATEs, inline for the found row: a call to it cost a send 8,000 instructions.
    IF courier._wake_requested('pending', p_messages) THEN  -- naming slot queues the wake-up (_wake_requested)
        UPDATE courier.queue_depth d SET messages = d.messages + p_messages, slot = d.slot
        WHERE d.endpoint_id = p_endpoint_id AND d.status = 'pending' AND d.backend_pid = pg_backend_pid()
          AND d.slot = p_slot;
    ELSE
        UPDATE courier.queue_depth d SET messages = d.messages + p_messages
        WHERE d.endpoint_id = p_endpoint_id AND d.status = 'pending' AND d.backend_pid = pg_backend_pid()
          AND d.slot = p_slot;
    END IF;
    IF NOT FOUND THEN
        PERFORM courier._add_depth(p_endpoint_id, 'pending', p_messages, p_slot, 1 << p_priority);
    ELSIF p_priority <> 0 THEN
        PERFORM courier._note_priorities(p_endpoint_id, 1 << p_priority);
    END IF;
    RETURN true;
END
$$;

-- _count_sent_in_slot for a batch (send_batch, enqueue_batch), in the slot the triggers use.
DROP FUNCTION IF EXISTS courier._count_sent(integer, integer);
CREATE OR REPLACE FUNCTION courier._count_sent(p_endpoint_id integer, p_priority integer, p_messages bigint DEFAULT 1) RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    v_writes integer := coalesce(nullif(current_setting('courier.depth_writes', true), '')::integer, 0);
    v_set text := set_config('courier.depth_writes', (v_writes + 1)::text, true);
BEGIN
    RETURN courier._count_sent_in_slot(p_endpoint_id, p_priority, p_messages, v_writes >> 6);
END
$$;

-- The counter row slot of a write: the counting triggers compute it inline (below).
DROP FUNCTION IF EXISTS courier._depth_slot();

-- Marks the priority levels p_levels (a bit each) as used by the endpoint (migration 0039), for
-- the claims and dequeues that walk only those levels. Only the first message of a level writes.
CREATE OR REPLACE FUNCTION courier._note_priorities(p_endpoint_id integer, p_levels integer) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    UPDATE courier.endpoints SET priorities = priorities | p_levels
    WHERE id = p_endpoint_id AND priorities & p_levels <> p_levels;
END
$$;

-- Marks the endpoint as one whose messages have carried an ordering key (migrations 0048 and
-- 0050): dequeue takes keyed messages only on an endpoint so marked, so every write that brings
-- a keyed message marks it in its own transaction, before the message can be seen. Only the
-- first writes; the mark is never cleared.
CREATE OR REPLACE FUNCTION courier._note_ordering_keys(p_endpoint_id integer) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    UPDATE courier.endpoints SET ordering_keys = true WHERE id = p_endpoint_id AND NOT ordering_keys;
END
$$;

-- The status a message is counted under. A leased pull message (in processing, with a
-- visibility deadline) is counted as pending: a lease, and everything that ends one without
-- settling it (nack, release, snooze, a lapsed lease taken again), leaves the counters alone,
-- and ack and receive take it off the one count. The counter write was a statement of its own in
-- every dequeue, 118,000 instructions of a dequeue(1) + ack (8.5%; BENCHMARKS.md). Readers that
-- show leased messages apart count them from queue_pull_leased_idx (_leased_by_endpoint), which
-- holds only messages under a lease. SQL, inlined.
CREATE OR REPLACE FUNCTION courier._counted_status(p_status text, p_visible_at timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_status = 'processing' AND p_visible_at IS NOT NULL THEN 'pending' ELSE p_status END
$$;

-- Leased pull messages, which the counters hold as pending (_counted_status): by endpoint, and of
-- one endpoint. Both read queue_pull_leased_idx, which holds only messages under a lease, so they
-- cost what is in flight, however many messages wait (processing_started_at IS NULL is in its
-- predicate: migration 0059).
CREATE OR REPLACE FUNCTION courier._leased_by_endpoint() RETURNS TABLE (endpoint_id integer, leased bigint)
LANGUAGE sql STABLE
AS $$
    SELECT q.endpoint_id, count(*) FROM courier.queue q
    WHERE q.status = 'processing' AND q.visible_at IS NOT NULL AND q.processing_started_at IS NULL
    GROUP BY q.endpoint_id
$$;

CREATE OR REPLACE FUNCTION courier._leased_count(p_endpoint_id integer) RETURNS bigint
LANGUAGE sql STABLE
AS $$
    SELECT count(*) FROM courier.queue q
    WHERE q.status = 'processing' AND q.visible_at IS NOT NULL AND q.processing_started_at IS NULL
      AND q.endpoint_id = p_endpoint_id
$$;

-- The counting triggers. Almost every write moves messages of one endpoint from one status (or
-- none) to one other: a send inserts pending messages, a claim or dequeue moves pending ones to
-- processing, an ack deletes processing ones. For those the trigger reads its transition tables
-- once, without grouping, and updates its counter rows itself; any other write goes through
-- _add_depth per (endpoint, status). A nested plpgsql call and a GROUP BY per statement were
-- most of what counting cost a single send: 31 of its 78 us of backend CPU, against 12 us for
-- the whole rest of its insert over pgmq's (a loop of 3,000 sends, PostgreSQL 15).
CREATE OR REPLACE FUNCTION courier._count_queue_insert() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    -- The counter row slot. A transaction's versions of a row cannot be pruned before it ends,
    -- so each run of 64 writes in one transaction counts into a slot of its own: in a
    -- transaction of many sends each write walks at most 64 versions, not all the earlier ones
    -- (a transaction of 20,000 sends took 9.5 s; pgmq's, 0.1 s). The count is a setting local
    -- to the transaction; a session that sets it itself only moves its counts to another slot,
    -- which compact_queue_depth() folds back.
    v_writes integer;
    v_set text;
    v_first integer;
    v_last integer;
    v_count bigint;
    v_levels integer;
    v_status text;
    v_statuses integer;
    v_keyed boolean;
BEGIN
    IF current_setting('courier.insert_counted', true) = 'on' THEN
        RETURN NULL;
    END IF;
    v_writes := coalesce(nullif(current_setting('courier.depth_writes', true), '')::integer, 0);
    v_set := set_config('courier.depth_writes', (v_writes + 1)::text, true);
    SELECT min(endpoint_id), max(endpoint_id), count(*), bit_or(1 << priority), min(status),
           count(DISTINCT status), bool_or(ordering_key IS NOT NULL)
    INTO v_first, v_last, v_count, v_levels, v_status, v_statuses, v_keyed
    FROM inserted_rows;
    IF v_count = 0 THEN
        RETURN NULL;
    ELSIF v_keyed THEN  -- before the message can be seen (_note_ordering_keys)
        PERFORM courier._note_ordering_keys(endpoint_id)
        FROM inserted_rows WHERE ordering_key IS NOT NULL GROUP BY endpoint_id;
    END IF;
    IF v_first <> v_last OR v_statuses <> 1 OR v_status = 'processing' THEN  -- leased pull ones: _counted_status
        PERFORM courier._add_depth(endpoint_id, courier._counted_status(status, visible_at), count(*), v_writes >> 6,
                                   bit_or(1 << priority))
        FROM inserted_rows GROUP BY endpoint_id, courier._counted_status(status, visible_at);
        RETURN NULL;
    END IF;
    IF v_levels <> 1 THEN
        PERFORM courier._note_priorities(v_first, v_levels);
    END IF;
    IF courier._wake_requested(v_status, v_count) THEN
        PERFORM courier._add_depth(v_first, v_status, v_count, v_writes >> 6);
        RETURN NULL;
    END IF;
    UPDATE courier.queue_depth d SET messages = d.messages + v_count
    WHERE d.endpoint_id = v_first AND d.status = v_status AND d.backend_pid = pg_backend_pid()
      AND d.slot = v_writes >> 6;
    IF NOT FOUND THEN
        PERFORM courier._add_depth(v_first, v_status, v_count, v_writes >> 6);
    END IF;
    RETURN NULL;
END
$$;

-- The push claim (_claim_due) counts the messages it claims in its own statement, and dequeue's
-- lease changes no count (_counted_status); both flag their UPDATE with courier.update_counted,
-- as the sends flag their INSERT: reading the two transition tables is most of what this
-- trigger costs.
CREATE OR REPLACE FUNCTION courier._count_queue_update() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    v_writes integer;
    v_set text;
    v_old courier.queue_depth_change;
    v_new courier.queue_depth_change;
    v_pull boolean;  -- the rows are pull messages: processing counts as pending (_counted_status)
BEGIN
    IF current_setting('courier.update_counted', true) = 'on' THEN
        RETURN NULL;
    END IF;
    v_writes := coalesce(nullif(current_setting('courier.depth_writes', true), '')::integer, 0);
    v_set := set_config('courier.depth_writes', (v_writes + 1)::text, true);
    SELECT min(endpoint_id), max(endpoint_id), min(status), max(status), count(*)
    INTO v_old FROM old_rows;
    SELECT min(endpoint_id), max(endpoint_id), min(status), max(status), count(*)
    INTO v_new FROM new_rows;
    IF v_old.rows = 0 THEN
        RETURN NULL;
    ELSIF v_old.first_endpoint <> v_old.last_endpoint OR v_old.first_status <> v_old.last_status
          OR v_new.first_endpoint <> v_new.last_endpoint OR v_new.first_status <> v_new.last_status
          OR v_old.first_endpoint <> v_new.first_endpoint THEN
        PERFORM courier._add_depth(endpoint_id, status, sum(delta)::bigint, v_writes >> 6)
        FROM (SELECT endpoint_id, courier._counted_status(status, visible_at) AS status, 1 AS delta FROM new_rows
              UNION ALL
              SELECT endpoint_id, courier._counted_status(status, visible_at), -1 FROM old_rows) AS moved
        GROUP BY endpoint_id, status
        HAVING sum(delta) <> 0;
        RETURN NULL;
    ELSIF v_old.first_status = v_new.first_status THEN
        RETURN NULL;  -- nothing changed endpoint or status
    ELSIF 'processing' IN (v_old.first_status, v_new.first_status)
          AND v_new.first_status NOT IN ('completed', 'failed') THEN  -- a push report never asks
        -- Every row of one endpoint, and an endpoint's messages are all pull or all push (a pull
        -- message is never completed or failed in the queue: ack deletes it, a dead letter moves).
        v_pull := (SELECT o.visible_at IS NOT NULL FROM old_rows o LIMIT 1);
        IF v_pull AND v_old.first_status = 'processing' THEN
            v_old.first_status := 'pending';
        END IF;
        IF v_pull AND v_new.first_status = 'processing' THEN
            v_new.first_status := 'pending';
        END IF;
        IF v_old.first_status = v_new.first_status THEN
            RETURN NULL;  -- a lease ended without being settled, or began: counted as pending throughout
        END IF;
    END IF;
    -- Every row of one endpoint moved from one status to one other.
    UPDATE courier.queue_depth d SET messages = d.messages - v_old.rows
    WHERE d.endpoint_id = v_old.first_endpoint AND d.status = v_old.first_status
      AND d.backend_pid = pg_backend_pid() AND d.slot = v_writes >> 6;
    IF NOT FOUND THEN
        PERFORM courier._add_depth(v_old.first_endpoint, v_old.first_status, -v_old.rows, v_writes >> 6);
    END IF;
    IF courier._wake_requested(v_new.first_status, v_old.rows) THEN
        PERFORM courier._add_depth(v_new.first_endpoint, v_new.first_status, v_old.rows, v_writes >> 6);
        RETURN NULL;
    END IF;
    UPDATE courier.queue_depth d SET messages = d.messages + v_old.rows
    WHERE d.endpoint_id = v_new.first_endpoint AND d.status = v_new.first_status
      AND d.backend_pid = pg_backend_pid() AND d.slot = v_writes >> 6;
    IF NOT FOUND THEN
        PERFORM courier._add_depth(v_new.first_endpoint, v_new.first_status, v_old.rows, v_writes >> 6);
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION courier._count_queue_delete() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    v_writes integer;
    v_set text;
    v_gone courier.queue_depth_change;
BEGIN
    -- The pull ack and receive count their deletes in their own statements, as the claims count
    -- theirs (courier.update_counted): reading the transition table and writing the counter from
    -- here cost a dequeue(1) + ack about 42,000 instructions, and a receive(1) about 30,000. The
    -- push report was measured the same way and kept the trigger: its statement's upsert, against
    -- a counter row that a running worker's connection already has, cost about what the trigger did.
    IF current_setting('courier.delete_counted', true) = 'on' THEN
        RETURN NULL;
    END IF;
    v_writes := coalesce(nullif(current_setting('courier.depth_writes', true), '')::integer, 0);
    v_set := set_config('courier.depth_writes', (v_writes + 1)::text, true);
    SELECT min(endpoint_id), max(endpoint_id), min(status), max(status), count(*)
    INTO v_gone FROM deleted_rows;
    IF v_gone.rows = 0 THEN
        RETURN NULL;
    ELSIF v_gone.first_endpoint <> v_gone.last_endpoint OR v_gone.first_status <> v_gone.last_status THEN
        PERFORM courier._add_depth(endpoint_id, courier._counted_status(status, visible_at), -count(*), v_writes >> 6)
        FROM deleted_rows GROUP BY endpoint_id, courier._counted_status(status, visible_at);
        RETURN NULL;
    ELSIF v_gone.first_status = 'processing' THEN  -- the subquery in a test of its own: readied only here
        IF (SELECT d.visible_at IS NOT NULL FROM deleted_rows d LIMIT 1) THEN
            v_gone.first_status := 'pending';  -- acked pull messages, counted as pending (_counted_status)
        END IF;
    END IF;
    UPDATE courier.queue_depth d SET messages = d.messages - v_gone.rows
    WHERE d.endpoint_id = v_gone.first_endpoint AND d.status = v_gone.first_status
      AND d.backend_pid = pg_backend_pid() AND d.slot = v_writes >> 6;
    IF NOT FOUND THEN
        PERFORM courier._add_depth(v_gone.first_endpoint, v_gone.first_status, -v_gone.rows, v_writes >> 6);
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION courier._count_queue_truncate() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    DELETE FROM courier.queue_depth;
    RETURN NULL;
END
$$;

-- A single send counts its message itself (_send_one, enqueue, through _count_sent) and flags
-- its INSERT with courier.insert_counted, set for that statement only: the trigger function
-- returns at once. The test is in the function, not in a WHEN: PostgreSQL parses a trigger's WHEN
-- again in every statement that writes the table, which cost every insert more (about 30,000
-- instructions) than calling the function to return (14,000).
CREATE OR REPLACE TRIGGER queue_count_insert AFTER INSERT ON courier.queue
    REFERENCING NEW TABLE AS inserted_rows
    FOR EACH STATEMENT EXECUTE FUNCTION courier._count_queue_insert();

CREATE OR REPLACE TRIGGER queue_count_update AFTER UPDATE ON courier.queue
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION courier._count_queue_update();

CREATE OR REPLACE TRIGGER queue_count_delete AFTER DELETE ON courier.queue
    REFERENCING OLD TABLE AS deleted_rows
    FOR EACH STATEMENT EXECUTE FUNCTION courier._count_queue_delete();

CREATE OR REPLACE TRIGGER queue_count_truncate AFTER TRUNCATE ON courier.queue
    FOR EACH STATEMENT EXECUTE FUNCTION courier._count_queue_truncate();

CREATE OR REPLACE FUNCTION courier._add_delivery_totals(p_endpoint_id integer, p_outcome text, p_count bigint)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    IF p_count > 0 THEN
        INSERT INTO courier.delivery_totals AS d (endpoint_id, outcome, backend_pid, total)
        VALUES (p_endpoint_id, p_outcome, pg_backend_pid(), p_count)
        ON CONFLICT (endpoint_id, outcome, backend_pid) DO UPDATE SET total = d.total + excluded.total;
    END IF;
END
$$;

-- Immutability ---------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION courier._forbid_payload_change() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
AS $$
BEGIN
    -- Keyed upsert (pull topics, queue-ti): a pending message with a key is replaced in place.
    IF OLD.key IS NOT NULL AND OLD.visible_at IS NOT NULL AND OLD.status = 'pending' AND NEW.status = 'pending'
       AND OLD.headers IS NOT DISTINCT FROM NEW.headers THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION '[courier] message % is immutable: payload and headers cannot change once enqueued', OLD.id
        USING ERRCODE = '55000',
              HINT = 'Send a new message instead, or replay the original from the archive.';
END
$$;

-- Only updates that name one of these columns can change them, so only those are checked:
-- claims, reports, releases and renewals never name them, and skip the per-row trigger and
-- the jsonb comparison of its WHEN clause altogether (issue 13).
-- AFTER, not BEFORE: the error undoes the statement either way, and a table with any BEFORE
-- UPDATE row trigger has every UPDATE lock each row before it changes it (ExecBRUpdateTriggers,
-- whatever columns the trigger names): a lock record of 54 bytes of WAL a message in every nack,
-- release, extend_lease, snooze and retry, which pgmq's set_vt does not write.
CREATE OR REPLACE TRIGGER queue_payload_immutable AFTER UPDATE OF payload, headers, payload_binary, body
    ON courier.queue
    FOR EACH ROW
    WHEN (OLD.payload IS DISTINCT FROM NEW.payload OR OLD.headers IS DISTINCT FROM NEW.headers
          OR OLD.payload_binary IS DISTINCT FROM NEW.payload_binary OR OLD.body IS DISTINCT FROM NEW.body)
    EXECUTE FUNCTION courier._forbid_payload_change();

-- Endpoint configuration -------------------------------------------------------------
CREATE OR REPLACE FUNCTION courier._raise_invalid(p_message text, p_hint text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION '[courier] %', p_message USING ERRCODE = '22023', HINT = coalesce(p_hint, '');
END
$$;

CREATE OR REPLACE FUNCTION courier._require_keys_within(p_what text, p_doc jsonb, p_allowed text[]) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_unknown text;
BEGIN
    SELECT string_agg(k, ', ' ORDER BY k) INTO v_unknown
    FROM jsonb_object_keys(p_doc) AS k WHERE k <> ALL (p_allowed);
    IF v_unknown IS NOT NULL THEN
        PERFORM courier._raise_invalid(format('%s has unknown key(s): %s', p_what, v_unknown),
                                       format('Allowed keys: %s', array_to_string(p_allowed, ', ')));
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION courier._require_positive_number(p_what text, p_doc jsonb, p_key text,
                                                 p_min numeric, p_max numeric) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
AS $$
BEGIN
    IF NOT p_doc ? p_key THEN
        RETURN;
    END IF;
    IF jsonb_typeof(p_doc -> p_key) <> 'number'
       OR (p_doc ->> p_key)::numeric < p_min OR (p_doc ->> p_key)::numeric > p_max THEN
        PERFORM courier._raise_invalid(
            format('%s.%s must be a number from %s to %s, got %s', p_what, p_key, p_min, p_max, p_doc -> p_key));
    END IF;
END
$$;

-- A whole number: JSON 3 and not 3.0, 2.5 or 3e0, which jsonb keeps as written and which a
-- later ::integer cast refuses (a retry policy with max_retries 3.0 once wedged every claim).
CREATE OR REPLACE FUNCTION courier._require_integer(p_what text, p_doc jsonb, p_key text,
                                                 p_min bigint, p_max bigint) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
AS $$
BEGIN
    IF NOT p_doc ? p_key THEN
        RETURN;
    END IF;
    IF jsonb_typeof(p_doc -> p_key) <> 'number' OR (p_doc ->> p_key) !~ '^-?[0-9]{1,19}$'
       OR (p_doc ->> p_key)::numeric < p_min OR (p_doc ->> p_key)::numeric > p_max THEN
        PERFORM courier._raise_invalid(
            format('%s.%s must be a whole number from %s to %s, got %s', p_what, p_key, p_min, p_max, p_doc -> p_key));
    END IF;
END
$$;

-- JSON true or false; the string "false" is truthy to some readers, so it is refused.
CREATE OR REPLACE FUNCTION courier._require_boolean(p_what text, p_doc jsonb, p_key text) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
AS $$
BEGIN
    IF p_doc ? p_key AND jsonb_typeof(p_doc -> p_key) <> 'boolean' THEN
        PERFORM courier._raise_invalid(
            format('%s.%s must be true or false (a JSON boolean), got %s', p_what, p_key, p_doc -> p_key));
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION courier._require_url(p_what text, p_doc jsonb, p_key text, p_schemes text[]) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_url text;
    v_port text;
BEGIN
    IF jsonb_typeof(p_doc -> p_key) IS DISTINCT FROM 'string' THEN
        PERFORM courier._raise_invalid(format('%s needs "%s" (a string)', p_what, p_key));
    END IF;
    v_url := p_doc ->> p_key;
    -- scheme://host[:port][/path]; no spaces or control characters anywhere.
    IF v_url !~* ('^(' || array_to_string(p_schemes, '|') || ')://[^/\s?#@]+(@[^/\s?#]+)?(:[0-9]{1,5})?([/?#]\S*)?$')
       OR v_url ~ '[[:cntrl:]]' THEN
        PERFORM courier._raise_invalid(
            format('%s.%s is not a valid URL: "%s"', p_what, p_key, courier._redact_text(v_url)),
            format('Expected a URL starting with %s', array_to_string(
                ARRAY(SELECT s || '://' FROM unnest(p_schemes) AS s), ' or ')));
    END IF;
    v_port := substring(v_url from '^[A-Za-z0-9+.-]+://(?:[^/?#@]*@)?(?:\[[^]]*\]|[^/?#:@]*):([0-9]+)');
    IF v_port IS NOT NULL AND v_port::integer NOT BETWEEN 1 AND 65535 THEN
        PERFORM courier._raise_invalid(format('%s.%s has port %s, outside 1-65535: "%s"', p_what, p_key, v_port,
                                              courier._redact_text(v_url)));
    END IF;
END
$$;

-- Whether a URL's host names an internal address by itself: localhost, or an IP literal that
-- is loopback, private, link-local, unique-local, shared (CGNAT), documentation, multicast,
-- reserved or unspecified, also when wrapped in an IPv4-mapped, IPv4-compatible or NAT64
-- IPv6 address; the cloud metadata address 169.254.169.254 is link-local. A numeric host
-- not in canonical dotted form (2130706433, 0x7f.1, 127.1) counts too: resolvers read those
-- as addresses. Names are checked again at delivery, on every address they resolve to.
CREATE OR REPLACE FUNCTION courier._is_internal_host(p_host text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_host text := lower(rtrim(btrim(coalesce(p_host, ''), '[]'), '.'));
    v_ip inet;
BEGIN
    IF v_host = '' OR v_host = 'localhost' OR v_host LIKE '%.localhost' THEN
        RETURN true;
    END IF;
    IF v_host !~ ':' AND v_host !~ '^[0-9a-fx.]+$' THEN
        RETURN false;  -- a name
    END IF;
    IF v_host !~ ':' AND v_host !~ '^(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])(\.(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])){3}$' THEN
        RETURN v_host ~ '^(0x[0-9a-f]*|[0-9]+)(\.(0x[0-9a-f]*|[0-9]+))*$';  -- numeric, not canonical
    END IF;
    BEGIN
        v_ip := v_host::inet;
    EXCEPTION WHEN invalid_text_representation THEN
        RETURN v_host ~ ':';  -- an IPv6 literal inet cannot read (a zone id): refused, not trusted
    END;
    IF family(v_ip) = 6 AND (v_ip <<= '::ffff:0:0/96' OR v_ip <<= '64:ff9b::/96') THEN
        v_ip := '0.0.0.0'::inet + (v_ip - network(set_masklen(v_ip, 96)));
    END IF;
    RETURN v_ip <<= ANY (ARRAY[
        '0.0.0.0/8', '10.0.0.0/8', '100.64.0.0/10', '127.0.0.0/8', '169.254.0.0/16', '172.16.0.0/12',
        '192.0.0.0/24', '192.0.2.0/24', '192.88.99.0/24', '192.168.0.0/16', '198.18.0.0/15',
        '198.51.100.0/24', '203.0.113.0/24', '224.0.0.0/4', '240.0.0.0/4',
        '::/96', '64:ff9b:1::/48', '100::/64', '2001::/23', '2001:db8::/32', '2002::/16', 'fc00::/7',
        'fe80::/10', 'fec0::/10', 'ff00::/8']::inet[]);
END
$$;

-- The host of a URL that _require_url accepted, brackets of an IPv6 literal removed.
CREATE OR REPLACE FUNCTION courier._url_host(p_url text) RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT btrim(substring(p_url from '^[A-Za-z0-9+.-]+://(?:[^/?#@]*@)?(\[[^]]*\]|[^/?#:@]*)'), '[]')
$$;

CREATE OR REPLACE FUNCTION courier._require_string(p_what text, p_doc jsonb, p_key text, p_required boolean)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
AS $$
BEGIN
    IF p_doc ? p_key THEN
        IF jsonb_typeof(p_doc -> p_key) <> 'string' OR length(p_doc ->> p_key) = 0 THEN
            PERFORM courier._raise_invalid(format('%s.%s must be a non-empty string', p_what, p_key));
        END IF;
    ELSIF p_required THEN
        PERFORM courier._raise_invalid(format('%s needs "%s"', p_what, p_key));
    END IF;
END
$$;

-- Adds one to outcome p_outcome's counter of each endpoint, once per element of p_endpoint_ids
-- (an endpoint per message): the counters behind metrics()' *_total series.
CREATE OR REPLACE FUNCTION courier._count_outcomes(p_endpoint_ids integer[], p_outcome text) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO courier.delivery_totals AS d (endpoint_id, outcome, backend_pid, total)
    SELECT endpoint_id, p_outcome, pg_backend_pid(), count(*)
    FROM unnest(p_endpoint_ids) AS endpoint_id GROUP BY endpoint_id
    ON CONFLICT (endpoint_id, outcome, backend_pid) DO UPDATE SET total = d.total + excluded.total;
END
$$;

-- The depth counters are unlogged (migration 0038): a crash, or a promoted standby, leaves them
-- empty, and so is queue_depth_built. Then count the queue once, with writers held off so that
-- the count and the counters agree; otherwise do nothing. Run by `courier migrate` and by the
-- maintenance leader every few seconds; until then depths read low (max_queue_size and max_depth
-- admit more than they would).
CREATE OR REPLACE FUNCTION courier.rebuild_queue_depth() RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_rows integer;
BEGIN
    IF EXISTS (SELECT FROM courier.queue_depth_built) THEN
        RETURN 0;
    END IF;
    LOCK TABLE courier.queue IN SHARE MODE;                 -- writers in flight finish first
    LOCK TABLE courier.queue_depth_built IN EXCLUSIVE MODE; -- a second rebuild waits, then finds it built
    IF EXISTS (SELECT FROM courier.queue_depth_built) THEN
        RETURN 0;
    END IF;
    -- A compaction folding rows meanwhile would add a row this DELETE cannot see: wait for it.
    PERFORM 1 FROM courier.internal_locks WHERE name = 'compact_queue_depth' FOR UPDATE;
    DELETE FROM courier.queue_depth;
    INSERT INTO courier.queue_depth (endpoint_id, status, backend_pid, messages)
    SELECT endpoint_id, courier._counted_status(status, visible_at), 0, count(*) FROM courier.queue
    GROUP BY endpoint_id, courier._counted_status(status, visible_at);
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    INSERT INTO courier.queue_depth_built DEFAULT VALUES;
    PERFORM courier._log_event('queue_depth.rebuilt', NULL, jsonb_build_object('counter_rows', v_rows));
    RETURN v_rows + 1;
END
$$;

-- The active count a send compares with max_queue_size while the queue is far below it
-- (functions/sending.sql), written by the maintenance leader every second: one row read instead
-- of every counter row in every send.
CREATE OR REPLACE FUNCTION courier.estimate_active_messages() RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    -- Staged sends (migration 0054) are counted when they are moved: a few seconds' worth at most.
    v_active bigint := courier._active_messages(NULL) + (SELECT count(*) FROM courier.send_stage);
BEGIN
    UPDATE courier.send_limits SET active_estimate = v_active, estimated_at = clock_timestamp();
    RETURN 0;  -- a maintenance job's count of work done: this is never more to do
END
$$;

-- Folds the counter rows of backends that have exited into backend_pid 0, so the counter
-- tables (queue_depth, dlq_depth, delivery_totals) stay as small as the number of live
-- connections.
CREATE OR REPLACE FUNCTION courier.compact_queue_depth() RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_folded integer;
BEGIN
    -- A row only the owner can lock (courier.internal_locks), not an advisory key anyone could hold.
    PERFORM 1 FROM courier.internal_locks WHERE name = 'compact_queue_depth' FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;

    -- Rows of backends that have exited, and the extra slots of long transactions (those a
    -- transaction still writes are locked, and left for the next run).
    WITH gone AS (
        DELETE FROM courier.queue_depth
        WHERE ctid IN (SELECT d.ctid FROM courier.queue_depth d
                       WHERE d.slot <> 0
                          OR (d.backend_pid <> 0
                              AND d.backend_pid NOT IN (SELECT pid FROM pg_stat_activity WHERE pid IS NOT NULL))
                       FOR UPDATE SKIP LOCKED)
        RETURNING endpoint_id, status, messages
    )
    INSERT INTO courier.queue_depth AS d (endpoint_id, status, backend_pid, messages)
    SELECT endpoint_id, status, 0, sum(messages) FROM gone GROUP BY endpoint_id, status
    ON CONFLICT (endpoint_id, status, backend_pid, slot)
    DO UPDATE SET messages = d.messages + excluded.messages;
    GET DIAGNOSTICS v_folded = ROW_COUNT;

    WITH gone AS (
        DELETE FROM courier.dlq_depth
        WHERE backend_pid <> 0
          AND backend_pid NOT IN (SELECT pid FROM pg_stat_activity WHERE pid IS NOT NULL)
        RETURNING endpoint_id, status, messages
    )
    INSERT INTO courier.dlq_depth AS d (endpoint_id, status, backend_pid, messages)
    SELECT endpoint_id, status, 0, sum(messages) FROM gone GROUP BY endpoint_id, status
    ON CONFLICT (endpoint_id, status, backend_pid)
    DO UPDATE SET messages = d.messages + excluded.messages;

    WITH gone AS (
        DELETE FROM courier.delivery_totals
        WHERE backend_pid <> 0
          AND backend_pid NOT IN (SELECT pid FROM pg_stat_activity WHERE pid IS NOT NULL)
        RETURNING endpoint_id, outcome, total
    )
    INSERT INTO courier.delivery_totals AS d (endpoint_id, outcome, backend_pid, total)
    SELECT endpoint_id, outcome, 0, sum(total) FROM gone GROUP BY endpoint_id, outcome
    ON CONFLICT (endpoint_id, outcome, backend_pid)
    DO UPDATE SET total = d.total + excluded.total;

    DELETE FROM courier.queue_depth WHERE backend_pid = 0 AND slot = 0 AND messages = 0;
    DELETE FROM courier.dlq_depth WHERE backend_pid = 0 AND messages = 0;
    RETURN v_folded;
END
$$;
