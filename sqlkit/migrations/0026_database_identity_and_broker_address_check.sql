-- Issue 23, items 2 and 13.
--
-- The database's identity: a uuid made once, at the first migrate that reaches this version
-- (a new database and an upgraded one alike), and never changed. Every id Courier hands a
-- broker or receiver to deduplicate on carries it, so two databases publishing to one stream
-- cannot drop each other's messages as duplicates. One row; only the owner writes it
-- (roles.sql grants SELECT).
CREATE TABLE courier.database_identity (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    id         uuid NOT NULL DEFAULT gen_random_uuid(),
    created_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO courier.database_identity DEFAULT VALUES;

-- Broker URLs now get the internal-address check HTTP URLs have. A broker endpoint that
-- already points at an internal host was made on purpose before the check existed: it is
-- opted in explicitly ("allow_internal": true) rather than dead-lettering its messages at
-- the first delivery after the upgrade. The previous release's validation trigger knows no
-- allow_internal key for brokers, so it is off for this UPDATE (the function files replace
-- it once the migrations are done).
DO $$
DECLARE
    v_has_check boolean := to_regprocedure('courier._is_internal_host(text)') IS NOT NULL
                           AND to_regprocedure('courier._url_host(text)') IS NOT NULL;
    v_opted text[];
BEGIN
    IF NOT EXISTS (SELECT 1 FROM courier.endpoints
                   WHERE protocol IN ('redis', 'amqp', 'mqtt', 'nats') AND NOT config ? 'allow_internal') THEN
        RETURN;
    END IF;
    ALTER TABLE courier.endpoints DISABLE TRIGGER endpoints_validate_update;
    -- Without the check function (a release older than the HTTP check), every broker endpoint
    -- keeps the reach it had.
    EXECUTE format($sql$
        WITH opted AS (
            UPDATE courier.endpoints SET config = config || '{"allow_internal": true}', updated_at = now()
            WHERE protocol IN ('redis', 'amqp', 'mqtt', 'nats') AND NOT config ? 'allow_internal' AND %s
            RETURNING id, name)
        SELECT coalesce(array_agg(name ORDER BY id), '{}') FROM opted$sql$,
        CASE WHEN v_has_check THEN 'courier._is_internal_host(courier._url_host(config ->> ''url''))'
             ELSE 'true' END)
    INTO v_opted;
    ALTER TABLE courier.endpoints ENABLE TRIGGER endpoints_validate_update;
    IF cardinality(v_opted) > 0 THEN
        INSERT INTO courier.event_log (event_type, details)
        VALUES ('config.changed', jsonb_build_object(
            'reason', 'broker endpoints on internal addresses kept their reach by "allow_internal": true '
                      '(migration 0026 added the internal-address check to broker URLs)',
            'endpoints', to_jsonb(v_opted)));
        RAISE NOTICE '[courier] broker endpoints on internal addresses now say "allow_internal": true: %',
            array_to_string(v_opted, ', ');
    END IF;
END
$$;

UPDATE courier.settings
SET description = 'Allow endpoints of every protocol (HTTP and brokers) on loopback and private addresses'
WHERE name = 'http_allow_internal_urls';
