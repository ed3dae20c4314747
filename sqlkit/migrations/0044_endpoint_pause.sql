-- Issue 42, item 6: a pause that keeps accepting (River's pause). A paused endpoint or topic
-- takes sends, batches, enqueues and publishes as ever (max_depth still applies), but no
-- worker claims its messages and no consumer dequeues or receives them until it is resumed;
-- disable, by contrast, refuses sends too. Set and cleared by courier.pause_endpoint() and
-- courier.resume_endpoint() (functions/endpoints.sql). The last column, so row types and
-- `SELECT *` readers of courier.endpoints keep every column where it was.
ALTER TABLE courier.endpoints ADD COLUMN paused_at timestamptz;
COMMENT ON COLUMN courier.endpoints.paused_at IS
    'When the endpoint was paused (pause_endpoint): sends still accepted, nothing claimed, dequeued or '
    'received until resume_endpoint; NULL while running';

-- courier.topics() reports whether each topic is paused: a new column, so it is made anew
-- (functions/pull.sql).
DROP FUNCTION IF EXISTS courier.topics();
