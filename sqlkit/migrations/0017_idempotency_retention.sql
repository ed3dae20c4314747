-- A delivered message's idempotency key keeps protecting its endpoint for
-- idempotency_retention_seconds after delivery, also once the message has moved to the
-- archive: a duplicate sent after archiving would otherwise be delivered a second time.
INSERT INTO courier.settings (name, value, default_value, value_type, min_value, max_value, unit, description) VALUES
    ('idempotency_retention_seconds', '86400', '86400', 'integer', 0, 31536000, 'seconds',
     'How long a delivered message''s idempotency key still turns away duplicates (0: only while queued)');

-- The send path's look-up of a delivered key, per endpoint. Partial: keyless messages cost
-- this index nothing.
CREATE INDEX archive_endpoint_idempotency_idx ON courier.archive (endpoint_id, idempotency_key, completed_at)
    WHERE idempotency_key IS NOT NULL AND status = 'completed';
