"""Every SQL example of the seed ulak-message-features, as written, with `ulak.` -> `courier.`.

The statements are copied verbatim from the seed page (shared/seeds/ulak-message-features.txt).
"""

from __future__ import annotations

import psycopg
import pytest

from tests.helpers import scalar

EXAMPLES = {
    "priority-high": """SELECT ulak.send_with_options('webhook', '{"urgent": true}'::jsonb,
  p_priority := 10);""",
    "priority-default": """SELECT ulak.send('webhook', '{"routine": true}'::jsonb);""",
    "worker-fetch-index": """CREATE INDEX idx_queue_worker_fetch
  ON ulak.queue(priority DESC, endpoint_id, created_at ASC)
  WHERE status = 'pending';""",
    "batch-with-priority": """SELECT ulak.send_batch_with_priority('webhook',
  ARRAY['{"id": 1}'::jsonb, '{"id": 2}'::jsonb, '{"id": 3}'::jsonb],
  5  -- priority for all messages in the batch
);""",
    "ordering-steps": """SELECT ulak.send_with_options('webhook', '{"step": 1}'::jsonb,
  p_ordering_key := 'order-123');
SELECT ulak.send_with_options('webhook', '{"step": 2}'::jsonb,
  p_ordering_key := 'order-123');
SELECT ulak.send_with_options('webhook', '{"step": 3}'::jsonb,
  p_ordering_key := 'order-123');""",
    "ordering-indexes": """CREATE INDEX idx_queue_ordering_processing ON ulak.queue(ordering_key)
  WHERE ordering_key IS NOT NULL AND status = 'processing';

CREATE INDEX idx_queue_ordering_pending ON ulak.queue(ordering_key, created_at ASC)
  WHERE ordering_key IS NOT NULL AND status = 'pending';""",
    "idempotency-first-and-repeat": """SELECT ulak.send_with_options('webhook', '{"order_id": 1}'::jsonb,
  p_idempotency_key := 'order-1-created');

-- Second call with same key and same payload: returns existing message ID (no duplicate)
SELECT ulak.send_with_options('webhook', '{"order_id": 1}'::jsonb,
  p_idempotency_key := 'order-1-created');""",
    "idempotency-unique-index": """CREATE UNIQUE INDEX idx_queue_idempotency_key ON ulak.queue(idempotency_key)
  WHERE idempotency_key IS NOT NULL AND status IN ('pending', 'processing');""",
    "scheduled": """SELECT ulak.send_with_options('webhook', '{"reminder": true}'::jsonb,
  p_scheduled_at := NOW() + INTERVAL '30 minutes');

-- Deliver at a specific time
SELECT ulak.send_with_options('webhook', '{"report": "daily"}'::jsonb,
  p_scheduled_at := '2025-04-15 09:00:00+00'::timestamptz);""",
    "ttl": """SELECT ulak.send_with_options('webhook', '{"flash_sale": true}'::jsonb,
  p_expires_at := NOW() + INTERVAL '1 hour');

-- Message expires at a specific time
SELECT ulak.send_with_options('webhook', '{"offer": "limited"}'::jsonb,
  p_expires_at := '2025-04-14 23:59:59+00'::timestamptz);""",
    "expiry-flow": """UPDATE ulak.queue SET status = 'expired' WHERE status = 'pending' AND expires_at < NOW()""",
    "correlation": """SELECT ulak.send_with_options('webhook', '{"data": 1}'::jsonb,
  p_correlation_id := '550e8400-e29b-41d4-a716-446655440000'::uuid);""",
    "batch": """SELECT ulak.send_batch('webhook', ARRAY[
  '{"id": 1}'::jsonb,
  '{"id": 2}'::jsonb,
  '{"id": 3}'::jsonb
]);""",
    "batch-with-priority-2": """SELECT ulak.send_batch_with_priority('webhook',
  ARRAY['{"id": 1}'::jsonb, '{"id": 2}'::jsonb],
  5  -- all messages get priority 5
);""",
    "fast-mode": """SELECT ulak.enable_fast_mode();
-- All subsequent sends in this transaction are faster
SELECT ulak.send('webhook', '{"data": 1}'::jsonb);
SELECT ulak.send('webhook', '{"data": 2}'::jsonb);""",
    "combined": """SELECT ulak.send_with_options(
  'payment-webhook',
  '{"order_id": 456, "amount": 99.99}'::jsonb,
  p_priority := 8,
  p_ordering_key := 'customer-789',
  p_idempotency_key := 'payment-456-v1',
  p_correlation_id := gen_random_uuid(),
  p_scheduled_at := NOW() + INTERVAL '5 minutes',
  p_expires_at := NOW() + INTERVAL '2 hours'
);""",
}


def as_courier(example: str) -> str:
    return example.replace("ulak.", "courier.")


@pytest.fixture
def seeded(conn):
    for name in ("webhook", "payment-webhook"):
        conn.execute("SELECT courier.create_endpoint(%s, 'http', '{\"url\": \"https://example.com/hook\"}')",
                     (name,))
    return conn


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_seed_example_runs_as_written(seeded, name):
    with seeded.transaction():
        seeded.execute(as_courier(EXAMPLES[name]))


def test_seed_idempotency_conflict_example_raises_the_seed_error(seeded):
    seeded.execute(as_courier(EXAMPLES["idempotency-first-and-repeat"]))
    with pytest.raises(psycopg.errors.UniqueViolation,
                       match="Idempotency key 'order-1-created' conflict: same key with different payload"):
        seeded.execute(as_courier("""SELECT ulak.send_with_options('webhook', '{"order_id": 2}'::jsonb,
  p_idempotency_key := 'order-1-created');"""))


def test_seed_send_with_options_signature(seeded):
    args = scalar(seeded, "SELECT pg_get_function_arguments('courier.send_with_options'::regproc)")
    names = [part.split()[0] for part in args.split(", ")]
    assert names[:8] == ["p_endpoint_name", "p_payload", "p_priority", "p_scheduled_at", "p_idempotency_key",
                         "p_correlation_id", "p_expires_at", "p_ordering_key"]
    assert {"p_headers", "p_metadata"} <= set(names)
    definer = scalar(seeded, "SELECT prosecdef FROM pg_proc WHERE oid = 'courier.send_with_options'::regproc")
    config = scalar(seeded, "SELECT proconfig FROM pg_proc WHERE oid = 'courier.send_with_options'::regproc")
    assert definer is True
    assert config == ["search_path=pg_catalog, courier, pg_temp"]
