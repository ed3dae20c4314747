-- Issue 26: each worker says which protocols its install can deliver (a broker's client is an
-- optional extra), so `courier endpoint create` and `courier doctor` can tell at once when no
-- running worker could deliver an endpoint's messages. NULL: a worker from before this column.
ALTER TABLE courier.workers ADD COLUMN protocols text[];

-- worker_heartbeat takes the protocols: the old signature is dropped so calls find one function.
DROP FUNCTION IF EXISTS courier.worker_heartbeat(text, text, integer, integer, integer, bigint, bigint, text);
