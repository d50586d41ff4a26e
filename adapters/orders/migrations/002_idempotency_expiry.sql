-- Idempotency keys expire after a window (the orders module's
-- -idempotency-key-window): retention deletes the expired ones oldest first,
-- in batches, by created_at.
CREATE INDEX IF NOT EXISTS order_idempotency_keys_created_at ON order_idempotency_keys (created_at);
