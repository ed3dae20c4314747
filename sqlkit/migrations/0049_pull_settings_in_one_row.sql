-- The settings a dequeue and a push claim read, beside those a send reads (courier.send_limits,
-- rewritten by _refresh_send_limits after every change to courier.settings): dequeue read them
-- from courier.settings with four filtered aggregates, a statement of its own whose aggregation
-- cost every dequeue(1) + ack 77,000 instructions (5%); now it reads them in its topic lookup.
-- report_and_claim read claim_slots through _setting_int, a call and a statement per claim.
ALTER TABLE courier.send_limits
    ADD COLUMN visibility_timeout integer,
    ADD COLUMN default_max_retries integer,
    ADD COLUMN default_throughput_limit numeric,
    ADD COLUMN default_dlq_threshold integer,
    ADD COLUMN claim_slots integer;
-- Written here once; _refresh_send_limits (functions/sending.sql) keeps them from now on.
UPDATE courier.send_limits l
SET visibility_timeout = s.visibility_timeout, default_max_retries = s.default_max_retries,
    default_throughput_limit = s.default_throughput_limit, default_dlq_threshold = s.default_dlq_threshold,
    claim_slots = s.claim_slots
FROM (SELECT max(value::integer) FILTER (WHERE name = 'visibility_timeout') AS visibility_timeout,
             max(value::integer) FILTER (WHERE name = 'default_max_retries') AS default_max_retries,
             max(value::numeric) FILTER (WHERE name = 'default_throughput_limit') AS default_throughput_limit,
             max(value::integer) FILTER (WHERE name = 'default_dlq_threshold') AS default_dlq_threshold,
             max(value::integer) FILTER (WHERE name = 'claim_slots') AS claim_slots
      FROM courier.settings
      WHERE name IN ('visibility_timeout', 'default_max_retries', 'default_throughput_limit',
                     'default_dlq_threshold', 'claim_slots')) s;
