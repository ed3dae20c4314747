-- The settings a dequeue and a push claim fall back to, as one row (as courier.send_limits is
-- for a send), rewritten by _refresh_send_limits after every change to courier.settings.
-- dequeue read them from courier.settings with four filtered aggregates, a statement of its own
-- whose aggregation cost every dequeue(1) + ack 77,000 instructions (5%); now it reads them in
-- its topic lookup. report_and_claim read claim_slots through _setting_int, a call and a
-- statement per claim. A table of their own, not columns of send_limits: a wider send_limits
-- row cost every send 2,000 instructions, and a send reads none of these.
CREATE TABLE courier.consume_limits (
    singleton                boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    visibility_timeout       integer,
    default_max_retries      integer,
    default_throughput_limit numeric,
    default_dlq_threshold    integer,
    claim_slots              integer
);
INSERT INTO courier.consume_limits (visibility_timeout, default_max_retries, default_throughput_limit,
                                    default_dlq_threshold, claim_slots)
SELECT max(value::integer) FILTER (WHERE name = 'visibility_timeout'),
       max(value::integer) FILTER (WHERE name = 'default_max_retries'),
       max(value::numeric) FILTER (WHERE name = 'default_throughput_limit'),
       max(value::integer) FILTER (WHERE name = 'default_dlq_threshold'),
       max(value::integer) FILTER (WHERE name = 'claim_slots')
FROM courier.settings;
