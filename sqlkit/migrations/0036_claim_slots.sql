-- Issue 27: a bound on the claims of one endpoint that run at once, however many worker
-- processes and hosts serve it. Each concurrent claim scans the head of queue_ready_idx past
-- every row the others are claiming or have just claimed (index entries read per message
-- drained: 2.8 with two pools, 15 with eight), and a claim whose snapshot predates another's
-- commit locks rows it then skips, holding up their owner's report until it commits.
-- report_and_claim holds one of its endpoint's first claim_slots slot rows (FOR UPDATE SKIP
-- LOCKED) until it commits; with none free it claims nothing and the worker tries again
-- shortly. Rows only the owner and the worker's admin role can lock, not an advisory key any
-- database user could hold. Eight per endpoint: the most claim_slots allows.
CREATE TABLE courier.claim_slots (
    endpoint_id integer NOT NULL REFERENCES courier.endpoints (id) ON DELETE CASCADE,
    slot smallint NOT NULL,
    PRIMARY KEY (endpoint_id, slot)
);
INSERT INTO courier.claim_slots (endpoint_id, slot)
SELECT e.id, s.slot FROM courier.endpoints e CROSS JOIN generate_series(0, 7) AS s(slot);

INSERT INTO courier.settings (name, value, default_value, value_type, min_value, max_value, unit, description)
VALUES ('claim_slots', '2', '2', 'integer', 0, 8, 'claims',
        'Claims of one endpoint that may scan its queue at once, across every worker process and host; 0: no limit');

-- report_and_claim says whether its claim found every slot taken.
DROP FUNCTION IF EXISTS courier.report_and_claim(text, integer, integer, bigint[], integer[], text[], text[],
                                                 integer[], jsonb[]);
