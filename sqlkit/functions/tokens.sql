-- API tokens for `courier serve` (table courier.api_tokens): made, listed and revoked by the
-- admin role; looked up by the server, by the SHA-256 of the secret a request presents.

-- A new token; the caller made the secret and passes only its hash. Returns the token's id.
CREATE OR REPLACE FUNCTION courier.create_api_token(p_name text, p_secret_hash bytea, p_topics text[],
                                                    p_endpoints text[], p_actions text[]) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
DECLARE
    v_id integer;
    v_unusable text[];
BEGIN
    IF p_name IS NULL OR p_name !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$' THEN
        PERFORM courier._raise_invalid(format('token name %s must be 1-128 letters, digits, _ . : or -, '
                                              'starting with a letter or digit', coalesce(quote_literal(p_name), 'NULL')));
    END IF;
    IF p_actions IS NULL OR cardinality(p_actions) = 0
       OR NOT p_actions <@ ARRAY['enqueue', 'consume', 'publish', 'monitor', 'admin'] THEN
        PERFORM courier._raise_invalid(format('actions must be some of enqueue, consume, publish, monitor, admin; got %s',
                                              coalesce(array_to_string(p_actions, ', '), 'NULL')));
    END IF;
    -- A scope names topics and endpoints exactly, or '*' for all: 'ord*' would be kept and
    -- match nothing, silently.
    IF EXISTS (SELECT 1 FROM unnest(coalesce(p_topics, '{}') || coalesce(p_endpoints, '{}')) AS s(scope)
               WHERE s.scope LIKE '%*%' AND s.scope <> '*') THEN
        PERFORM courier._raise_invalid(
            format('topics and endpoints are names or * (every one), not patterns; got %s',
                   (SELECT string_agg(quote_literal(s.scope), ', ') FROM unnest(coalesce(p_topics, '{}')
                    || coalesce(p_endpoints, '{}')) AS s(scope) WHERE s.scope LIKE '%*%' AND s.scope <> '*')),
            'List each name, comma-separated, or give * alone');
    END IF;
    -- An action with nothing in its scope could never be used: refused rather than made.
    SELECT array_agg(a ORDER BY a) INTO v_unusable FROM unnest(p_actions) a
    WHERE NOT 'admin' = ANY (p_actions) AND coalesce(cardinality(p_topics), 0) = 0
      AND (a IN ('consume', 'publish') OR (a = 'enqueue' AND coalesce(cardinality(p_endpoints), 0) = 0));
    IF v_unusable IS NOT NULL THEN
        PERFORM courier._raise_invalid(
            format('topics: a token that may %s needs topics (or, to enqueue, push endpoints) in its scope',
                   array_to_string(v_unusable, ' or ')),
            'Give --topics (and --endpoints), or * for every one');
    END IF;
    -- A revoked token's name is free again (the hint below says to revoke): its row goes, its
    -- creation and revocation stay in the event log.
    DELETE FROM courier.api_tokens WHERE name = p_name AND revoked_at IS NOT NULL;
    INSERT INTO courier.api_tokens (name, secret_hash, topics, endpoints, actions)
    VALUES (p_name, p_secret_hash, coalesce(p_topics, '{}'), coalesce(p_endpoints, '{}'), p_actions)
    RETURNING id INTO v_id;
    PERFORM courier._log_event('token.created', NULL, jsonb_build_object('token', p_name, 'actions', p_actions,
                                                                         'topics', p_topics, 'endpoints', p_endpoints));
    RETURN v_id;
EXCEPTION WHEN unique_violation THEN
    RAISE EXCEPTION '[courier] a token named "%" exists already', p_name
        USING ERRCODE = '23505', HINT = 'Revoke it (`courier token revoke`) to use its name again, or choose another name';
END
$$;

-- Revokes a token at once: the next request that presents it is refused. Returns whether it
-- was live.
CREATE OR REPLACE FUNCTION courier.revoke_api_token(p_name text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM courier.api_tokens WHERE name = p_name) THEN
        RAISE EXCEPTION '[courier] token "%" does not exist', p_name
            USING ERRCODE = 'P0002', HINT = 'List them with `courier token list`';
    END IF;
    UPDATE courier.api_tokens SET revoked_at = now() WHERE name = p_name AND revoked_at IS NULL;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM courier._log_event('token.revoked', NULL, jsonb_build_object('token', p_name));
    RETURN true;
END
$$;

-- Every token, without its hash.
CREATE OR REPLACE FUNCTION courier.api_tokens()
RETURNS TABLE (name text, topics text[], endpoints text[], actions text[], created_at timestamptz,
               last_used_at timestamptz, revoked_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
    SELECT t.name, t.topics, t.endpoints, t.actions, t.created_at, t.last_used_at, t.revoked_at
    FROM courier.api_tokens t ORDER BY t.name
$$;

-- The live token whose secret hashes to p_secret_hash, if any. last_used_at is written at most
-- once a minute, so a busy client costs no write per request.
CREATE OR REPLACE FUNCTION courier.authenticate_api_token(p_secret_hash bytea)
RETURNS TABLE (name text, topics text[], endpoints text[], actions text[])
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, courier, pg_temp
AS $$
BEGIN
    UPDATE courier.api_tokens t SET last_used_at = now()
    WHERE t.secret_hash = p_secret_hash AND t.revoked_at IS NULL
      AND (t.last_used_at IS NULL OR t.last_used_at < now() - interval '1 minute');
    RETURN QUERY SELECT t.name, t.topics, t.endpoints, t.actions FROM courier.api_tokens t
                 WHERE t.secret_hash = p_secret_hash AND t.revoked_at IS NULL;
END
$$;
