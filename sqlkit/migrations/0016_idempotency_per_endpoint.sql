-- Idempotency keys are scoped per endpoint, as ulak's are: the same key sent to two endpoints
-- names two messages. Before, the second send was dropped silently as a duplicate, and the
-- conflict hint named the other endpoint's message.
CREATE UNIQUE INDEX queue_endpoint_idempotency_key_idx ON courier.queue (endpoint_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL AND status IN ('pending', 'processing');
DROP INDEX courier.queue_idempotency_key_idx;
