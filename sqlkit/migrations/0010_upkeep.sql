-- Upkeep the reliability layer was missing: endpoint rows changed outside the API are
-- validated, and heartbeat rows of long-gone workers are pruned.

-- Operators change endpoints with plain UPDATEs too (ulak's own retry-policy example does),
-- and a policy or config that the API would refuse must not get in that way: one bad
-- retry_policy would make every outcome report that touches the endpoint fail.

CREATE FUNCTION courier._validate_endpoint_row() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, courier, pg_temp
AS $$
BEGIN
    PERFORM courier.validate_endpoint_config(NEW.protocol, NEW.config);
    PERFORM courier.validate_retry_policy(NEW.retry_policy);
    RETURN NEW;
END
$$;

CREATE TRIGGER endpoints_validate_insert BEFORE INSERT ON courier.endpoints
    FOR EACH ROW EXECUTE FUNCTION courier._validate_endpoint_row();
CREATE TRIGGER endpoints_validate_update BEFORE UPDATE OF protocol, config, retry_policy ON courier.endpoints
    FOR EACH ROW
    WHEN (OLD.protocol IS DISTINCT FROM NEW.protocol OR OLD.config IS DISTINCT FROM NEW.config
          OR OLD.retry_policy IS DISTINCT FROM NEW.retry_policy)
    EXECUTE FUNCTION courier._validate_endpoint_row();

-- Heartbeat rows of workers that stopped or died more than p_after_seconds ago; every
-- `courier worker` run registers a new one, so without this the list only grows.
CREATE FUNCTION courier.prune_workers(p_after_seconds integer DEFAULT 3600) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_pruned integer;
BEGIN
    DELETE FROM courier.workers
    WHERE last_heartbeat < now() - make_interval(secs => greatest(p_after_seconds, 60));
    GET DIAGNOSTICS v_pruned = ROW_COUNT;
    RETURN v_pruned;
END
$$;
