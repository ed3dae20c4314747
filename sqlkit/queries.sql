-- Named queries used by sqlkit's typed API. Each block starts with `-- name: <name>`.

-- name: schema_version
SELECT coalesce(max(version), 0) FROM courier.schema_migrations;

-- name: create_endpoint
SELECT courier.create_endpoint(%(name)s, %(protocol)s, %(config)s, %(retry_policy)s, %(description)s);

-- name: alter_endpoint
SELECT courier.alter_endpoint(%(name)s, %(config)s, %(retry_policy)s, %(description)s);

-- name: drop_endpoint
SELECT courier.drop_endpoint(%(name)s, %(force)s);

-- name: enable_endpoint
SELECT courier.enable_endpoint(%(name)s);

-- name: disable_endpoint
SELECT courier.disable_endpoint(%(name)s);

-- name: pause_endpoint
SELECT courier.pause_endpoint(%(name)s);

-- name: resume_endpoint
SELECT courier.resume_endpoint(%(name)s);

-- name: validate_endpoint_config
SELECT courier.validate_endpoint_config(%(protocol)s, %(config)s);

-- name: list_endpoints
SELECT e.id, e.name, e.protocol, courier._redact(e.config) AS config, e.retry_policy, e.description,
       e.enabled, e.circuit_state, e.circuit_failure_count, e.last_success_at, e.last_failure_at,
       courier._redact_text(e.last_error) AS last_error, e.created_at, e.updated_at,
       coalesce(d.pending, 0)::bigint AS pending_messages,
       coalesce(d.processing, 0)::bigint AS processing_messages,
       CASE WHEN e.protocol = 'pull' AND coalesce(d.processing, 0) > 0
            THEN courier._next_lease_deadline(e.id) END AS next_lease_deadline,
       e.paused_at
FROM courier.endpoints e
LEFT JOIN courier._leased_by_endpoint() l ON l.endpoint_id = e.id  -- one pass for every endpoint
LEFT JOIN LATERAL (  -- leased pull messages are counted as pending (courier._counted_status)
    SELECT coalesce(sum(messages) FILTER (WHERE status = 'pending'), 0) - coalesce(l.leased, 0) AS pending,
           coalesce(sum(messages) FILTER (WHERE status = 'processing'), 0) + coalesce(l.leased, 0) AS processing
    FROM courier.queue_depth WHERE endpoint_id = e.id
) d ON true
WHERE %(name)s::text IS NULL OR e.name = %(name)s::text
ORDER BY e.name;

-- name: send_with_options
SELECT courier.send_with_options(
    p_endpoint_name := %(endpoint)s, p_payload := %(payload)s, p_priority := %(priority)s,
    p_scheduled_at := %(scheduled_at)s, p_idempotency_key := %(idempotency_key)s,
    p_correlation_id := %(correlation_id)s, p_expires_at := %(expires_at)s,
    p_ordering_key := %(ordering_key)s, p_headers := %(headers)s, p_metadata := %(metadata)s,
    p_max_retries := %(max_retries)s, p_unique_by_payload := %(unique_by_payload)s,
    p_unique_period_seconds := %(unique_period_seconds)s);

-- name: send_batch_with_priority
SELECT courier.send_batch_with_priority(%(endpoint)s, %(payloads)s::jsonb[], %(priority)s);

-- name: create_event_type
SELECT courier.create_event_type(%(name)s, %(description)s);

-- name: drop_event_type
SELECT courier.drop_event_type(%(name)s, %(force)s);

-- name: list_event_types
SELECT t.id, t.name, t.description, t.created_at,
       coalesce(jsonb_agg(jsonb_build_object('endpoint', e.name, 'filter', s.filter) ORDER BY e.name)
                FILTER (WHERE s.id IS NOT NULL), '[]') AS subscriptions
FROM courier.event_types t
LEFT JOIN courier.subscriptions s ON s.event_type_id = t.id
LEFT JOIN courier.endpoints e ON e.id = s.endpoint_id
GROUP BY t.id
ORDER BY t.name;

-- name: subscribe
SELECT courier.subscribe(%(event_type)s, %(endpoint)s, %(filter)s);

-- name: unsubscribe
SELECT courier.unsubscribe(%(event_type)s, %(endpoint)s);

-- name: publish
SELECT courier.publish(%(event_type)s, %(payload)s, p_idempotency_key := %(idempotency_key)s,
                       p_correlation_id := %(correlation_id)s);

-- name: publish_batch
SELECT courier.publish_batch(%(event_type)s, %(payloads)s::jsonb[]);

-- name: consumer_dequeue
SELECT id, lease, payload, payload_binary, body, metadata, key, retry_count, max_retries, created_at, visible_until
FROM courier.dequeue(%(topic)s, %(count)s, %(visibility_timeout)s);

-- name: consumer_topic_id
-- The id the topic's notifications carry (NULL: no such pull topic, yet).
SELECT courier.topic_id(%(topic)s);

-- name: topic_sends_committing
-- After a wake-up found nothing: whether producers of the topic are still committing (sqlkit/linger.py).
SELECT courier.topic_sends_committing(%(topic)s) AS committing;

-- name: consumer_ack
-- Only what was not acked: the caller takes every other id as acked.
SELECT id, result FROM courier.ack(%(ids)s::bigint[], %(leases)s::integer[]) WHERE result <> 'acked';

-- name: consumer_ack_and_dequeue
-- An ack and the next prefetch in one statement: one transaction and one commit per batch
-- rather than two. The ack's rows (only those not acked, marked by ack_result) come first: an
-- Append runs its inputs in order, so a message whose lease ran out is acked, or found lost,
-- before the dequeue could take it again.
SELECT a.result AS ack_result, a.id, NULL::integer AS lease, NULL::jsonb AS payload,
       NULL::bytea AS payload_binary, NULL::text AS body, NULL::jsonb AS metadata, NULL::text AS key,
       NULL::integer AS retry_count, NULL::integer AS max_retries, NULL::timestamptz AS created_at,
       NULL::timestamptz AS visible_until
FROM courier.ack(%(ids)s::bigint[], %(leases)s::integer[]) a WHERE a.result <> 'acked'
UNION ALL
SELECT NULL, id, lease, payload, payload_binary, body, metadata, key, retry_count, max_retries, created_at,
       visible_until
FROM courier.dequeue(%(topic)s, %(count)s, %(visibility_timeout)s);

-- name: consumer_nack
SELECT id, result FROM courier.nack(%(ids)s::bigint[], %(leases)s::integer[], %(error)s, %(delay_seconds)s::integer);

-- name: consumer_snooze
SELECT id, result FROM courier.snooze(%(ids)s::bigint[], %(leases)s::integer[], %(delay_seconds)s::integer);

-- name: consumer_release
SELECT id, result FROM courier.release(%(ids)s::bigint[], %(leases)s::integer[]);

-- name: consumer_extend_lease
SELECT id, result, visible_until
FROM courier.extend_lease(%(ids)s::bigint[], %(leases)s::integer[], %(visibility_timeout)s);

-- name: consumer_receive_failed
SELECT courier.receive_failed(%(topic)s, %(id)s, %(error)s);

-- name: consumer_lock_received
SELECT courier.lock_received(%(topic)s, %(id)s);

-- name: consumer_peek
SELECT courier.peek(%(topic)s);

-- name: consumer_receive
SELECT id, payload, payload_binary, body, metadata, key, created_at FROM courier.receive(%(topic)s, %(count)s);

-- name: get_message
-- A message is in the queue while active and in the archive once finished. Producer headers
-- may carry credentials: shown redacted, as everywhere else.
SELECT q.id, e.name AS endpoint_name, q.payload, courier._redact(q.headers) AS headers, q.metadata, q.status, q.priority,
       q.retry_count, q.next_retry_at, q.scheduled_at, q.expires_at, q.idempotency_key,
       q.correlation_id, q.ordering_key, courier._redact_text(q.last_error) AS last_error,
       courier._redact(q.error_history) AS error_history, q.created_at, q.completed_at,
       q.key, CASE WHEN q.visible_at IS NOT NULL THEN q.lease END AS lease, q.visible_at
FROM courier.queue q JOIN courier.endpoints e ON e.id = q.endpoint_id
WHERE q.id = %(id)s
UNION ALL
SELECT a.id, coalesce(e.name, '#' || a.endpoint_id), a.payload, courier._redact(a.headers), a.metadata, a.status, a.priority,
       a.retry_count, NULL, a.scheduled_at, a.expires_at, a.idempotency_key,
       a.correlation_id, a.ordering_key, courier._redact_text(a.last_error), courier._redact(a.error_history), a.created_at, a.completed_at,
       a.key, NULL, NULL
FROM courier.archive a LEFT JOIN courier.endpoints e ON e.id = a.endpoint_id
WHERE a.id = %(id)s
LIMIT 1;

-- name: search_messages
-- Active messages in the order the queue works through them: in flight first (oldest claim
-- first, on queue_processing_started_idx, then pull messages under a lease, which have no
-- claim time, by id from queue_pull_leased_idx), then pending in claim order, priority DESC then
-- FIFO by id (per endpoint, the first rows of queue_ready_idx and of queue_pending_rest_idx,
-- which hold the pending push messages between them, and of a pull topic's queue_pull_due_idx,
-- in the order its consumers take them), then
-- finished rows not archived yet, newest first (queue_finished_idx). The status gates are
-- one-time filters, so a branch the status rules out is never run.
WITH wanted AS (
    SELECT e.id, e.name FROM courier.endpoints e
    WHERE %(endpoint)s::text IS NULL OR e.name = %(endpoint)s::text
)
SELECT id, endpoint_name, status, priority, retry_count, ordering_key, correlation_id, created_at,
       scheduled_at, next_retry_at, courier._redact_text(last_error) AS last_error
FROM (
    (SELECT 0 AS part, q.processing_started_at AS claimed_at, q.id, w.name AS endpoint_name, q.status, q.priority,
            q.retry_count, q.ordering_key, q.correlation_id, q.created_at, q.scheduled_at, q.next_retry_at, q.last_error
     FROM courier.queue q JOIN wanted w ON w.id = q.endpoint_id
     WHERE q.status = 'processing' AND q.visible_at IS NULL
       AND (%(status)s::text IS NULL OR %(status)s::text = 'processing')
     ORDER BY q.processing_started_at, q.id
     LIMIT %(limit)s)
    UNION ALL
    (SELECT 0, NULL, q.id, w.name, q.status, q.priority, q.retry_count, q.ordering_key, q.correlation_id,
            q.created_at, q.scheduled_at, q.next_retry_at, q.last_error
     FROM courier.queue q JOIN wanted w ON w.id = q.endpoint_id
     WHERE q.status = 'processing' AND q.visible_at IS NOT NULL AND q.processing_started_at IS NULL
       AND (%(status)s::text IS NULL OR %(status)s::text = 'processing')
     ORDER BY q.id
     LIMIT %(limit)s)
    UNION ALL
    (SELECT 1, NULL, p.id, w.name, p.status, p.priority, p.retry_count, p.ordering_key, p.correlation_id,
            p.created_at, p.scheduled_at, p.next_retry_at, p.last_error
     FROM wanted w
     CROSS JOIN LATERAL (
         (SELECT q.id, q.status, q.priority, q.retry_count, q.ordering_key, q.correlation_id, q.created_at,
                 q.scheduled_at, q.next_retry_at, q.last_error
          FROM courier.queue q
          WHERE q.endpoint_id = w.id AND q.status = 'pending'
            AND q.scheduled_at IS NULL AND q.next_retry_at IS NULL AND q.visible_at IS NULL
          ORDER BY q.priority DESC, q.id
          LIMIT %(limit)s)
         UNION ALL
         (SELECT q.id, q.status, q.priority, q.retry_count, q.ordering_key, q.correlation_id, q.created_at,
                 q.scheduled_at, q.next_retry_at, q.last_error
          FROM courier.queue q
          WHERE q.endpoint_id = w.id AND q.status = 'pending' AND q.visible_at IS NULL
            AND (q.scheduled_at IS NOT NULL OR q.next_retry_at IS NOT NULL)
          ORDER BY q.priority DESC, q.id
          LIMIT %(limit)s)
         UNION ALL
         (SELECT q.id, q.status, q.priority, q.retry_count, q.ordering_key, q.correlation_id, q.created_at,
                 q.scheduled_at, q.next_retry_at, q.last_error
          FROM courier.queue q
          WHERE q.endpoint_id = w.id AND q.visible_at IS NOT NULL AND q.status = 'pending'
          ORDER BY q.priority DESC, q.visible_at, q.id
          LIMIT %(limit)s)
         ORDER BY priority DESC, id
         LIMIT %(limit)s
     ) p
     WHERE %(status)s::text IS NULL OR %(status)s::text = 'pending'
     ORDER BY p.priority DESC, p.id
     LIMIT %(limit)s)
    UNION ALL
    (SELECT 2, NULL, q.id, w.name, q.status, q.priority, q.retry_count, q.ordering_key, q.correlation_id,
            q.created_at, q.scheduled_at, q.next_retry_at, q.last_error
     FROM courier.queue q JOIN wanted w ON w.id = q.endpoint_id
     WHERE q.status IN ('completed', 'failed', 'expired')
       AND (%(status)s::text IS NULL OR %(status)s::text IN ('completed', 'failed', 'expired'))
       AND (%(status)s::text IS NULL OR q.status = %(status)s::text)
     ORDER BY q.id DESC
     LIMIT %(limit)s)
) found
ORDER BY part, claimed_at, CASE WHEN part = 1 THEN -priority END, CASE WHEN part = 2 THEN -id ELSE id END
LIMIT %(limit)s;

-- name: search_messages_by_ordering_key
-- One ordering key's active messages in delivery order: the one in flight, then the pending
-- ones FIFO (queue_ordering_idx), then finished rows not archived yet, newest first.
SELECT id, endpoint_name, status, priority, retry_count, ordering_key, correlation_id, created_at,
       scheduled_at, next_retry_at, courier._redact_text(last_error) AS last_error
FROM (
    (SELECT 0 AS part, q.id, e.name AS endpoint_name, q.status, q.priority, q.retry_count, q.ordering_key,
            q.correlation_id, q.created_at, q.scheduled_at, q.next_retry_at, q.last_error
     FROM courier.queue q JOIN courier.endpoints e ON e.id = q.endpoint_id
     WHERE q.ordering_key = %(ordering_key)s::text AND q.status = 'processing'
       AND (%(status)s::text IS NULL OR %(status)s::text = 'processing')
       AND (%(endpoint)s::text IS NULL OR e.name = %(endpoint)s::text)
     ORDER BY q.id
     LIMIT %(limit)s)
    UNION ALL
    (SELECT 1, q.id, e.name, q.status, q.priority, q.retry_count, q.ordering_key, q.correlation_id, q.created_at,
            q.scheduled_at, q.next_retry_at, q.last_error
     FROM courier.queue q JOIN courier.endpoints e ON e.id = q.endpoint_id
     -- The key's equality is written as a range on purpose: given `=`, the planner drops the
     -- constant key from the sort order and may walk the primary key in id order instead,
     -- filtering (445 ms for a key holding 300k of 2M rows); only queue_ordering_idx
     -- yields (ordering_key, id) order.
     WHERE q.ordering_key >= %(ordering_key)s::text AND q.ordering_key <= %(ordering_key)s::text
       AND q.status = 'pending'
       AND (%(status)s::text IS NULL OR %(status)s::text = 'pending')
       AND (%(endpoint)s::text IS NULL OR e.name = %(endpoint)s::text)
     ORDER BY q.ordering_key, q.id
     LIMIT %(limit)s)
    UNION ALL
    (SELECT 2, q.id, e.name, q.status, q.priority, q.retry_count, q.ordering_key, q.correlation_id, q.created_at,
            q.scheduled_at, q.next_retry_at, q.last_error
     FROM courier.queue q JOIN courier.endpoints e ON e.id = q.endpoint_id
     WHERE q.ordering_key = %(ordering_key)s::text AND q.status IN ('completed', 'failed', 'expired')
       AND (%(status)s::text IS NULL OR %(status)s::text IN ('completed', 'failed', 'expired'))
       AND (%(status)s::text IS NULL OR q.status = %(status)s::text)
       AND (%(endpoint)s::text IS NULL OR e.name = %(endpoint)s::text)
     ORDER BY q.id DESC
     LIMIT %(limit)s)
) found
ORDER BY part, CASE WHEN part = 2 THEN -id ELSE id END
LIMIT %(limit)s;

-- name: search_messages_by_correlation_id
-- Every message of one correlation id, active or archived, in the order they were sent; both
-- sides are index probes (queue_correlation_idx, and archive_correlation_idx per partition).
SELECT m.id, coalesce(e.name, '#' || m.endpoint_id) AS endpoint_name, m.status, m.priority, m.retry_count,
       m.ordering_key, m.correlation_id, m.created_at, m.scheduled_at, m.next_retry_at,
       courier._redact_text(m.last_error) AS last_error
FROM (
    SELECT q.id, q.endpoint_id, q.status, q.priority, q.retry_count, q.ordering_key, q.correlation_id,
           q.created_at, q.scheduled_at, q.next_retry_at, q.last_error
    FROM courier.queue q WHERE q.correlation_id = %(correlation_id)s::uuid
    UNION ALL
    SELECT a.id, a.endpoint_id, a.status, a.priority, a.retry_count, a.ordering_key, a.correlation_id,
           a.created_at, a.scheduled_at, NULL, a.last_error
    FROM courier.archive a WHERE a.correlation_id = %(correlation_id)s::uuid
) m
LEFT JOIN courier.endpoints e ON e.id = m.endpoint_id
WHERE (%(status)s::text IS NULL OR m.status = %(status)s::text)
  AND (%(endpoint)s::text IS NULL OR e.name = %(endpoint)s::text)
  AND (%(ordering_key)s::text IS NULL OR m.ordering_key = %(ordering_key)s::text)
ORDER BY m.id
LIMIT %(limit)s;

-- name: list_settings
SELECT name, value, default_value, value_type, min_value, max_value, unit, description, updated_at
FROM courier.settings ORDER BY name;

-- name: get_setting
SELECT name, value, default_value, value_type, min_value, max_value, unit, description, updated_at
FROM courier.settings WHERE name = %(name)s;

-- name: set_setting
SELECT courier.set_setting(%(name)s, %(value)s);

-- name: metrics
SELECT metric_name, metric_value, labels, metric_type FROM courier.metrics();

-- name: delivery_totals
-- Cumulative outcomes per endpoint, from the counters the delivery functions maintain.
SELECT e.name AS endpoint_name,
       coalesce(sum(t.total) FILTER (WHERE t.outcome = 'delivered'), 0)::bigint AS delivered,
       coalesce(sum(t.total) FILTER (WHERE t.outcome = 'failed_attempt'), 0)::bigint AS failed_attempts,
       coalesce(sum(t.total) FILTER (WHERE t.outcome = 'dead_lettered'), 0)::bigint AS dead_lettered,
       coalesce(sum(t.total) FILTER (WHERE t.outcome = 'expired'), 0)::bigint AS expired,
       coalesce(sum(t.total) FILTER (WHERE t.outcome = 'replayed'), 0)::bigint AS replayed
FROM courier.endpoints e
LEFT JOIN courier.delivery_totals t ON t.endpoint_id = e.id
GROUP BY e.name
ORDER BY e.name;

-- name: endpoint_health
SELECT * FROM courier.get_endpoint_health(%(name)s);

-- name: dispatch_targets
-- Pull topics are consumed by their clients; no worker claims them. A paused endpoint
-- (pause_endpoint) is left out as a disabled one is: its claim loops end after the claim in
-- progress, what was claimed ahead goes back, and nothing claims or polls for it until it is
-- resumed (claim_batch claims nothing for it meanwhile, whatever a worker asks).
SELECT id, name, protocol, config, retry_policy, circuit_state
FROM courier.endpoints WHERE enabled AND paused_at IS NULL AND protocol <> 'pull' ORDER BY id;

-- name: claim_for_endpoint
-- Payloads come as JSON text: dispatchers send them as they are, with no parse and re-dump.
-- Headers and metadata come as text too, decoded one message at a time (claimed_from_row),
-- so that one message a client cannot decode fails alone instead of the whole claim.
SELECT id, endpoint_id, endpoint_name, protocol, payload::text AS payload_json, headers::text AS headers,
       metadata::text AS metadata, priority,
       retry_count, max_retries, correlation_id, ordering_key, idempotency_key, scheduled_at, expires_at, created_at,
       lease, (SELECT d.id FROM courier.database_identity d) AS database_id
FROM courier.claim_batch(%(worker_id)s, %(batch_size)s, %(endpoint_id)s);

-- name: sends_committing
-- The worker's linger: is a producer that sent to this endpoint still committing?
SELECT courier.sends_committing(%(endpoint_id)s);

-- name: hold_wake_lock
-- An awake claim loop's hold on its endpoint's wake lock (console/workers/awake.py): producers
-- committing meanwhile skip their NOTIFY, as they do while another producer holds it.
SELECT pg_try_advisory_lock(hashtext('courier.wake_workers'), %(endpoint_id)s);

-- name: release_wake_lock
SELECT pg_advisory_unlock(hashtext('courier.wake_workers'), %(endpoint_id)s);

-- name: report_and_claim
-- claim_for_endpoint with the outcomes held so far reported first, in one round trip.
SELECT id, endpoint_id, endpoint_name, protocol, payload::text AS payload_json, headers::text AS headers,
       metadata::text AS metadata, priority,
       retry_count, max_retries, correlation_id, ordering_key, idempotency_key, scheduled_at, expires_at, created_at,
       lease, (SELECT d.id FROM courier.database_identity d) AS database_id,
       delivered, retried, dead_lettered, stale, busy, committing
FROM courier.report_and_claim(%(worker_id)s, %(batch_size)s, %(endpoint_id)s, %(ids)s::bigint[],
                                 %(leases)s::integer[], %(outcomes)s::text[], %(errors)s::text[],
                                 %(retry_after)s::integer[], %(responses)s::jsonb[], %(linger)s);

-- name: report_outcomes
SELECT * FROM courier.report_outcomes(%(ids)s::bigint[], %(leases)s::integer[], %(outcomes)s::text[],
                                         %(errors)s::text[], %(retry_after)s::integer[], %(responses)s::jsonb[]);

-- name: release_batch
SELECT courier.release_batch(%(ids)s::bigint[], %(leases)s::integer[], %(delay)s);

-- name: renew_leases
SELECT courier.renew_leases(%(ids)s::bigint[], %(leases)s::integer[]);

-- name: recover_stale_messages
SELECT courier.recover_stale_messages();

-- name: recover_dead_workers_claims
SELECT courier.recover_dead_workers_claims();

-- name: register_worker_session
SELECT courier.register_worker_session(%(worker_id)s, %(incarnation)s);

-- name: worker_heartbeat
SELECT courier.worker_heartbeat(%(worker_id)s, %(hostname)s, %(pid)s, %(concurrency)s, %(in_flight)s,
                                   %(delivered)s, %(failed)s, %(state)s, %(protocols)s);

-- name: setting_values
SELECT name, value FROM courier.settings;

-- name: worker_status
SELECT * FROM courier.get_worker_status();

-- name: reset_circuit_breaker
SELECT courier.reset_circuit_breaker(%(name)s);

-- name: list_dlq_page
-- Newest first, on the primary key, from a cursor: the entries listed after %(after)s (older:
-- the list is newest first; NULL: from the newest), so the next page stays put however many
-- entries arrive meanwhile.
SELECT id, original_message_id, endpoint_name, status, retry_count, courier._redact_text(last_error) AS last_error,
       correlation_id,
       original_created_at, failed_at, redriven_at, redriven_message_id
FROM courier.dlq
WHERE (%(status)s::text IS NULL OR status = %(status)s::text)
  AND id < coalesce(%(after)s::bigint, 9223372036854775807)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: list_failed_dlq_page
-- Entries awaiting redrive, newest first, of one endpoint or all, from a cursor (see
-- list_dlq_page): at most `limit` per endpoint from dlq_failed_idx (endpoint_id, id), for just
-- the endpoints the dlq_depth counters say have any. Filtering the primary key by status
-- instead scanned the whole DLQ whenever few entries were failed, as right after a redrive of
-- everything. The bound on id is an index condition, so a deep page costs no more than the
-- first. The endpoint's equality is a range, as in list_dlq_of_endpoint_page: else the planner
-- walked the primary key and filtered (580 ms at 1.6M entries, most of them redriven).
WITH failing AS (
    SELECT d.endpoint_id FROM courier.dlq_depth d
    WHERE d.status = 'failed'
    GROUP BY d.endpoint_id
    HAVING sum(d.messages) > 0
)
SELECT x.id, x.original_message_id, x.endpoint_name, x.status, x.retry_count,
       courier._redact_text(x.last_error) AS last_error, x.correlation_id, x.original_created_at, x.failed_at, x.redriven_at, x.redriven_message_id
FROM failing f
CROSS JOIN LATERAL (
    SELECT x.id, x.original_message_id, x.endpoint_name, x.status, x.retry_count, x.last_error, x.correlation_id,
           x.original_created_at, x.failed_at, x.redriven_at, x.redriven_message_id
    FROM courier.dlq x
    WHERE x.endpoint_id >= f.endpoint_id AND x.endpoint_id <= f.endpoint_id AND x.status = 'failed'
      AND x.id < coalesce(%(after)s::bigint, 9223372036854775807)
    ORDER BY x.endpoint_id DESC, x.id DESC
    LIMIT %(limit)s
) x
WHERE %(endpoint)s::text IS NULL OR x.endpoint_name = %(endpoint)s::text
ORDER BY x.id DESC
LIMIT %(limit)s;

-- name: list_dlq_of_endpoint_page
-- One endpoint's entries newest first, from a cursor (see list_dlq_page), on dlq_endpoint_idx
-- (endpoint_name, id). The name's equality is written as a range on purpose: given `=`, the
-- planner drops the constant name from the sort order and may walk the primary key instead,
-- filtering (39 ms for an endpoint whose 300k entries sat behind 300k newer ones of another).
SELECT id, original_message_id, endpoint_name, status, retry_count, courier._redact_text(last_error) AS last_error,
       correlation_id,
       original_created_at, failed_at, redriven_at, redriven_message_id
FROM courier.dlq
WHERE endpoint_name >= %(endpoint)s::text AND endpoint_name <= %(endpoint)s::text
  AND id < coalesce(%(after)s::bigint, 9223372036854775807)
  AND (%(status)s::text IS NULL OR status = %(status)s::text)
ORDER BY endpoint_name DESC, id DESC
LIMIT %(limit)s;

-- name: get_dlq
-- Producer headers may carry credentials: show them redacted, as everywhere else.
SELECT id, original_message_id, endpoint_id, endpoint_name, payload, courier._redact(headers) AS headers,
       metadata, priority, ordering_key, idempotency_key, correlation_id, scheduled_at, expires_at, retry_count,
       courier._redact_text(last_error) AS last_error, courier._redact(error_history) AS error_history, status,
       original_created_at, failed_at, redriven_at, redriven_message_id, original_topic, dlq_moved_at, max_retries,
       key
FROM courier.dlq WHERE id = %(id)s;

-- name: dlq_summary
SELECT * FROM courier.dlq_summary();

-- name: dlq_failed_count
SELECT coalesce(sum(messages), 0)::bigint FROM courier.dlq_depth d
JOIN courier.endpoints e ON e.id = d.endpoint_id
WHERE d.status = 'failed' AND (%(endpoint)s::text IS NULL OR e.name = %(endpoint)s::text);

-- name: redrive_message
SELECT courier.redrive_message(%(id)s);

-- name: redrive_endpoint
SELECT courier.redrive_endpoint(%(name)s, %(batch_size)s);

-- name: redrive_all
SELECT courier.redrive_all(%(batch_size)s);

-- name: cleanup_dlq
SELECT courier.cleanup_dlq();

-- name: dlq_cleanup_due
SELECT courier.dlq_cleanup_due();

-- name: ping
SELECT 1;

-- name: try_lead_maintenance
SELECT courier.try_lead_maintenance(%(worker_id)s);

-- name: run_due_schedules
SELECT courier.run_due_schedules(%(batch_size)s);

-- name: mark_expired_messages
SELECT courier.mark_expired_messages(%(batch_size)s);

-- name: run_expiry_reaper
SELECT courier.run_expiry_reaper(%(batch_size)s);

-- name: archive_finished_messages
SELECT courier.archive_completed_messages(0, %(batch_size)s);

-- name: maintain_archive_partitions
SELECT courier.maintain_archive_partitions(%(months_ahead)s);

-- name: cleanup_old_archive_partitions
SELECT courier.cleanup_old_archive_partitions();

-- name: cleanup_event_log
SELECT courier.cleanup_event_log();

-- name: compact_queue_depth
SELECT courier.compact_queue_depth();

-- name: rebuild_queue_depth
SELECT courier.rebuild_queue_depth();

-- name: estimate_active_messages
SELECT courier.estimate_active_messages();

-- name: keep_send_stage
SELECT courier.keep_send_stage();

-- name: archive_partitions
SELECT * FROM courier.archive_partitions();

-- name: count_archive_partition
SELECT courier.count_archive_partition(%(partition)s);

-- name: endpoint_id
SELECT id FROM courier.endpoints WHERE name = %(name)s;

-- name: replay_range
SELECT courier.replay_range(%(endpoint_id)s, %(from_ts)s, %(to_ts)s, %(status)s, %(batch_size)s, %(dry_run)s,
                            %(again)s);

-- name: count_replay_range
SELECT would_enqueue, already_replayed
FROM courier.count_replay_range(%(endpoint_id)s, %(from_ts)s, %(to_ts)s, %(status)s, %(again)s);

-- name: running_replay
SELECT id, replayed, last_archive_id, started_at FROM courier.replays
WHERE endpoint_id = %(endpoint_id)s AND from_ts = %(from_ts)s AND to_ts = %(to_ts)s
  AND coalesce(status_filter, '') = coalesce(%(status)s::text, '') AND state = 'running';

-- name: replay_message
SELECT message_id, enqueued FROM courier.replay_archived_message(%(archive_id)s, %(again)s);

-- name: health_check
SELECT * FROM courier.health_check();

-- name: events_after
SELECT ev.id, ev.created_at, ev.event_type, e.name AS endpoint, ev.actor,
       courier._redact(ev.details) AS details  -- rows logged before the rule covered them too
FROM courier.event_log ev LEFT JOIN courier.endpoints e ON e.id = ev.endpoint_id
WHERE ev.id > %(after)s
  AND (%(event_type)s::text IS NULL OR ev.event_type LIKE %(event_type)s::text || '%%')
  AND (%(endpoint)s::text IS NULL OR e.name = %(endpoint)s::text)
ORDER BY ev.id
LIMIT %(limit)s;

-- name: latest_events
SELECT * FROM (
    SELECT ev.id, ev.created_at, ev.event_type, e.name AS endpoint, ev.actor,
       courier._redact(ev.details) AS details  -- rows logged before the rule covered them too
    FROM courier.event_log ev LEFT JOIN courier.endpoints e ON e.id = ev.endpoint_id
    WHERE (%(event_type)s::text IS NULL OR ev.event_type LIKE %(event_type)s::text || '%%')
      AND (%(endpoint)s::text IS NULL OR e.name = %(endpoint)s::text)
    ORDER BY ev.id DESC
    LIMIT %(limit)s
) newest ORDER BY id;

-- name: prune_workers
SELECT courier.prune_workers();

-- name: archive_partitions_past_retention
SELECT partition_name, state FROM courier.archive_partitions_past_retention(%(retention_months)s);

-- name: cleanup_old_archive_partitions_for
SELECT courier.cleanup_old_archive_partitions(%(retention_months)s);


-- name: may_vacuum_hot_tables
-- VACUUM skips, with only a warning, a table its caller does not own (before PostgreSQL 17's
-- MAINTAIN privilege): a leader logged in as a role outside courier_owner leaves it to autovacuum.
SELECT pg_has_role(current_user, 'courier_owner', 'USAGE')
       OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user);

-- name: hot_tables_to_vacuum
SELECT relname AS table_name
FROM pg_stat_user_tables
WHERE schemaname = 'courier' AND relname = ANY (%(tables)s::text[])
  AND n_dead_tup > %(threshold)s AND n_dead_tup > n_live_tup / 10
ORDER BY n_dead_tup DESC;

-- name: short_lock_timeout
-- A maintenance statement waits this long for a lock, then gives up until its next run.
SET lock_timeout = '100ms';

-- name: vacuum_queue
VACUUM courier.queue;

-- name: vacuum_queue_depth
VACUUM courier.queue_depth;

-- name: vacuum_delivery_totals
VACUUM courier.delivery_totals;

-- name: vacuum_send_stage
VACUUM courier.send_stage;

-- name: vacuum_send_stage_batch
-- VACUUM of an inheritance parent does not reach its children (migration 0055).
VACUUM courier.send_stage_batch;

-- name: create_api_token
SELECT courier.create_api_token(%(name)s, %(secret_hash)s, %(topics)s::text[], %(endpoints)s::text[],
                                %(actions)s::text[]);

-- name: revoke_api_token
SELECT courier.revoke_api_token(%(name)s);

-- name: list_api_tokens
SELECT * FROM courier.api_tokens();

-- name: authenticate_api_token
SELECT * FROM courier.authenticate_api_token(%(secret_hash)s);

-- name: pull_enqueue
SELECT courier.enqueue(%(topic)s, NULL, %(key)s, %(metadata)s, %(payload)s, NULL, %(scheduled_at)s,
                       %(ttl_seconds)s, %(max_retries)s);

-- name: pull_enqueue_batch
-- Single enqueues that arrived together at `courier serve` (console/serve/enqueues.py).
SELECT courier.enqueue_batch(%(topic)s, NULL, %(payloads)b::bytea[], %(metadata)s::jsonb[],
                             %(scheduled_at)s::timestamptz[], %(ttl_seconds)s::integer[], %(max_retries)s::integer[]);

-- name: pull_dequeue
-- The payload as the bytes a client gets (a JSON payload as its text), and the metadata as its
-- text: neither parsed and dumped again, so no number is rounded on the way.
SELECT id, lease, coalesce(payload_binary, convert_to(payload::text, 'UTF8')) AS payload,
       metadata::text AS metadata, key, retry_count, max_retries, created_at, visible_until
FROM courier.dequeue(%(topic)s, %(count)s, %(visibility_timeout)s);

-- name: pull_settle
-- Ack, nack or extend, only in the topics a token may consume (NULL: every topic).
SELECT id, result, visible_until
FROM courier.settle_in_topics(%(verb)s, %(ids)s::bigint[], %(leases)s::integer[], %(topics)s::text[], %(error)s,
                              %(visibility_timeout)s, %(delay_seconds)s);

-- name: topic_id
SELECT id FROM courier.endpoints WHERE name = %(topic)s AND protocol = 'pull';

-- name: http_topics
SELECT * FROM courier.topics();

-- name: requeue_dead_letter
SELECT courier.requeue(%(id)s);

-- name: topic_config
-- A pull topic's own limits (its config: a key it does not set takes the global default).
SELECT name AS topic, config FROM courier.endpoints
WHERE protocol = 'pull' AND (%(topic)s::text IS NULL OR name = %(topic)s)
ORDER BY name;

-- name: alter_topic
SELECT courier.alter_topic(%(topic)s, %(changes)s);

-- name: run_delete_reaper
SELECT courier.run_delete_reaper(%(batch_size)s);

-- name: send_to_endpoint
-- A pull topic takes sends too, in the token's topic scope only (%(topics)s, NULL: every topic).
-- The scope is checked in the statement that writes, never from a cache (issue 40: a cached
-- "not a pull topic" let a token store messages in a topic made a moment before). No row:
-- out of scope, nothing sent.
SELECT courier.send_with_options(%(endpoint)s, %(payload)s, %(priority)s, %(scheduled_at)s, %(idempotency_key)s,
                                 %(correlation_id)s, %(expires_at)s, %(ordering_key)s, %(headers)s, %(metadata)s,
                                 %(max_retries)s, %(unique_by_payload)s, %(unique_period_seconds)s)
WHERE %(topics)s::text[] IS NULL OR %(endpoint)s = ANY (%(topics)s::text[]) OR courier.topic_id(%(endpoint)s) IS NULL;

-- name: send_batch_to_endpoint
-- Plain sends that arrived together at `courier serve` (console/serve/sends.py), in the same
-- scope as send_to_endpoint: NULL when the endpoint is a pull topic outside it.
SELECT courier.send_batch(%(endpoint)s, %(payloads)s::jsonb[])
WHERE %(topics)s::text[] IS NULL OR %(endpoint)s = ANY (%(topics)s::text[]) OR courier.topic_id(%(endpoint)s) IS NULL;

-- name: publish_event
SELECT courier.publish(%(event_type)s, %(payload)s, %(idempotency_key)s, %(correlation_id)s);

-- name: cancel_message
-- Issue 42's verbs (functions/verbs.sql): each records p_actor, on whose behalf, in the event log.
SELECT id, endpoint_name, was FROM courier.cancel_message(%(id)s, %(actor)s);

-- name: cancel_message_by_key
SELECT id, endpoint_name, was FROM courier.cancel_message_by_key(%(endpoint)s, %(key)s, %(actor)s);

-- name: delete_message
SELECT courier.delete_message(%(id)s, %(actor)s);

-- name: purge_queue_count
SELECT courier.purge_queue_count(%(endpoint)s, %(dlq)s);

-- name: purge_queue
SELECT courier.purge_queue(%(endpoint)s, %(dlq)s, %(archive)s, %(actor)s);

-- name: create_schedule
-- Periodic schedules (issue 42, functions/schedules.sql).
SELECT courier.create_schedule(
    p_name => %(name)s, p_cron => %(cron)s, p_endpoint_name => %(endpoint)s, p_payload => %(payload)s,
    p_time_zone => %(time_zone)s, p_headers => %(headers)s, p_metadata => %(metadata)s, p_priority => %(priority)s,
    p_ordering_key => %(ordering_key)s, p_catch_up => %(catch_up)s, p_catch_up_limit => %(catch_up_limit)s,
    p_grace_seconds => %(grace_seconds)s, p_description => %(description)s, p_replace => %(replace)s);

-- name: list_schedules
SELECT * FROM courier.list_schedules();

-- name: schedule_message
-- What a schedule's ticks send (admins only: the monitor's list_schedules() leaves it out).
SELECT payload, headers, metadata, priority, ordering_key FROM courier.schedules WHERE name = %(name)s;

-- name: drop_schedule
SELECT courier.drop_schedule(%(name)s, %(if_exists)s);

-- name: pause_schedule
SELECT courier.pause_schedule(%(name)s);

-- name: resume_schedule
SELECT courier.resume_schedule(%(name)s);

-- name: cron_next_runs
SELECT courier.cron_next_runs(%(cron)s, %(time_zone)s, %(count)s, coalesce(%(after)s::timestamptz, now())) AS at;

-- name: late_schedules
-- `courier status`: the late ones only, with how late by the database's clock.
SELECT s.*, extract(epoch FROM now() - s.next_run_at)::float8 AS late_seconds
FROM courier.list_schedules() s WHERE s.late ORDER BY s.next_run_at, s.name;

-- name: list_archive_page
-- `courier archive list`: archived messages newest first, on each partition's primary key
-- (id, created_at) merged in id order, from a cursor (as list_dlq_page: the rows listed after
-- %(after)s, older than it), so a page stays put however many messages are archived meanwhile.
-- A filter that is NULL folds away when the statement is planned with its values; --from/--to
-- prune partitions. An endpoint or status is a filter on that walk, cheap while it matches
-- often; expired rows of one endpoint come from archive_expired_idx and a correlation id from
-- archive_correlation_idx. No index leads with endpoint_id for the other statuses, so a rare
-- endpoint's page walks the partitions in range.
SELECT a.id, coalesce(e.name, '#' || a.endpoint_id) AS endpoint_name, a.status, a.retry_count,
       courier._redact_text(a.last_error) AS last_error, a.correlation_id, a.ordering_key,
       a.created_at, a.completed_at, a.archived_at
FROM courier.archive a LEFT JOIN courier.endpoints e ON e.id = a.endpoint_id
WHERE a.id < coalesce(%(after)s::bigint, 9223372036854775807)
  AND (%(endpoint_id)s::integer IS NULL OR a.endpoint_id = %(endpoint_id)s::integer)
  AND (%(status)s::text IS NULL OR a.status = %(status)s::text)
  AND (%(from_ts)s::timestamptz IS NULL OR a.created_at >= %(from_ts)s::timestamptz)
  AND (%(to_ts)s::timestamptz IS NULL OR a.created_at < %(to_ts)s::timestamptz)
  AND (%(correlation_id)s::uuid IS NULL OR a.correlation_id = %(correlation_id)s::uuid)
  AND (%(ordering_key)s::text IS NULL OR a.ordering_key = %(ordering_key)s::text)
ORDER BY a.id DESC
LIMIT %(limit)s;

-- name: metric_history
-- POST /api/metrics/history: the leader's samples of the last %(minutes)s minutes.
SELECT * FROM courier.metric_history(now() - make_interval(mins => %(minutes)s), NULL, %(per_endpoint)s);
