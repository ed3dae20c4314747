-- Issue 23 item 7: one replay rule for `courier archive replay`, `replay-message`, the console's
-- wizard and `courier pipeline replay`: an archived message is enqueued again once, unless the
-- operator asks for a fresh copy. Until now only a range's cursor (archive replay) or a
-- selection's fingerprint (pipeline replay) remembered a replay, so the same range run twice,
-- or one message replayed both ways, was enqueued twice.
CREATE TABLE courier.replayed_messages (
    archive_id  bigint PRIMARY KEY,
    message_id  bigint,                 -- the latest copy's id in the queue, when known
    copies      integer NOT NULL DEFAULT 1,
    replayed_at timestamptz NOT NULL DEFAULT now()
);

-- What earlier releases replayed, as far as it is known without scanning the archive: the
-- pipeline's replay ledgers, the ranges archive replays walked, and copies still queued.
INSERT INTO courier.replayed_messages (archive_id)
SELECT DISTINCT source_key::bigint FROM courier.pipeline_ledger
WHERE scope LIKE 'replay:%' AND source_key ~ '^[0-9]{1,18}$'
ON CONFLICT DO NOTHING;

INSERT INTO courier.replayed_messages (archive_id)
SELECT a.id FROM courier.replays r
JOIN courier.archive a ON a.endpoint_id = r.endpoint_id AND a.created_at >= r.from_ts AND a.created_at < r.to_ts
                      AND (r.status_filter IS NULL OR a.status = r.status_filter) AND a.id <= r.last_archive_id
ON CONFLICT DO NOTHING;

INSERT INTO courier.replayed_messages (archive_id, message_id)
SELECT DISTINCT ON ((q.metadata ->> 'replayed_from')::bigint) (q.metadata ->> 'replayed_from')::bigint, q.id
FROM courier.queue q
WHERE q.metadata ->> 'replayed_from' ~ '^[0-9]{1,18}$'
ORDER BY (q.metadata ->> 'replayed_from')::bigint, q.id DESC
ON CONFLICT (archive_id) DO UPDATE SET message_id = excluded.message_id;

-- The replay functions gain p_again; the old signatures would stay as overloads.
DROP FUNCTION IF EXISTS courier.replay_message(bigint);
DROP FUNCTION IF EXISTS courier.replay_range(integer, timestamptz, timestamptz, text, integer, boolean);
DROP FUNCTION IF EXISTS courier._replay(bigint[], timestamptz, timestamptz);
