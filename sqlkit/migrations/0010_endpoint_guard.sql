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
