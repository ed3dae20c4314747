-- Publish/subscribe: event types and the endpoints subscribed to them. publish() fans an
-- event out into courier.queue, one message per matching subscription, so push endpoints
-- and pull topics receive it the same way they receive a send.
CREATE TABLE courier.event_types (
    id          integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name        text NOT NULL UNIQUE
                CONSTRAINT event_types_name_format CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$'),
    description text,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- One subscription per (event type, endpoint): a second one would deliver every event twice.
-- Dropping an endpoint or an event type takes its subscriptions with it.
CREATE TABLE courier.subscriptions (
    id            integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_type_id integer NOT NULL REFERENCES courier.event_types (id) ON DELETE CASCADE,
    endpoint_id   integer NOT NULL REFERENCES courier.endpoints (id) ON DELETE CASCADE,
    filter        jsonb NOT NULL DEFAULT '{}'
                  CONSTRAINT subscriptions_filter_object CHECK (jsonb_typeof(filter) = 'object'),
    created_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (event_type_id, endpoint_id)
);
CREATE INDEX subscriptions_endpoint_idx ON courier.subscriptions (endpoint_id);
