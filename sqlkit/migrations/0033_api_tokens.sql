-- Issue 25: bearer tokens for `courier serve`, the HTTP API. A token is a random secret shown
-- once when it is made; only its SHA-256 is kept, so a copy of the database cannot be used to
-- call the API. Each token is scoped to topics and push endpoints ('*': every one) and to
-- actions; the server runs each request as the database role of its action (enqueue, consume
-- and publish as courier_application, admin as courier_admin), so the HTTP layer can never do
-- more than the SQL API lets that role.
CREATE TABLE courier.api_tokens (
    id           integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name         text NOT NULL UNIQUE
                 CONSTRAINT api_tokens_name_format CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$'),
    secret_hash  bytea NOT NULL UNIQUE CHECK (length(secret_hash) = 32),
    topics       text[] NOT NULL DEFAULT '{}',
    endpoints    text[] NOT NULL DEFAULT '{}',
    actions      text[] NOT NULL
                 CONSTRAINT api_tokens_actions_known CHECK (actions <@ ARRAY['enqueue', 'consume', 'publish', 'admin']
                                                            AND cardinality(actions) > 0),
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_used_at timestamptz,
    revoked_at   timestamptz
);
