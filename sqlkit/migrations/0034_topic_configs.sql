-- Issue 25, queue-ti's topic configs over HTTP and `courier topic alter`:
-- * default_dlq_threshold, the global DLQ threshold a topic's dlq_threshold overrides: after
--   how many failed attempts a pull message moves to <topic>.dlq (at the latest when its
--   retries run out); 0 turns the DLQ off, and a message past its retries ends `failed`.
-- * courier.enqueue takes a per-message ttl_seconds (queue-ti's field): the old signature is
--   dropped so calls by position or name find one function.
-- * courier.topics() reports each topic's dlq_threshold: a new column, so it is made anew.
INSERT INTO courier.settings (name, value, default_value, value_type, min_value, max_value, unit, description)
VALUES ('default_dlq_threshold', '1000', '1000', 'integer', 0, 1000, 'attempts',
        'Failed attempts after which a pull message moves to <topic>.dlq, at the latest when its retries run out '
        '(1000: only then), unless its topic sets dlq_threshold; 0: no DLQ, such a message ends failed');

DROP FUNCTION IF EXISTS courier.enqueue(text, jsonb, text, jsonb, bytea, text, timestamptz);
DROP FUNCTION IF EXISTS courier.topics();
-- It now returns the ids that ended failed (no DLQ), so nack() can say which.
DROP FUNCTION IF EXISTS courier._pull_dead_letter(bigint[]);

-- A token may be for monitoring alone: /metrics and the topics' depths, nothing else (a
-- Prometheus scraper needs no admin token).
ALTER TABLE courier.api_tokens DROP CONSTRAINT api_tokens_actions_known,
    ADD CONSTRAINT api_tokens_actions_known
        CHECK (actions <@ ARRAY['enqueue', 'consume', 'publish', 'monitor', 'admin'] AND cardinality(actions) > 0);
