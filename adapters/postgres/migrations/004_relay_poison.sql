-- Outbox rows a relay set aside because they cannot be forwarded, and the
-- later rows of their aggregates held behind them.
--   kind invalid: not a forwarder envelope (no aggregate is known);
--   kind poison:  a valid envelope the broker can never take (headers larger
--                 than its frame size, a body larger than its message size,
--                 or a row the broker closed the connection on every time);
--   kind held:    a later row of a poison row's aggregate, kept back (not
--                 published) so that the aggregate's events stay in order.
-- An operator asks for a poison row to be replayed or discarded by setting
-- action; the active relay carries it out: it publishes the row (replay) and
-- the rows held behind it, in order, before any later row of the aggregate.
ALTER TABLE outbox_set_aside
	ADD COLUMN IF NOT EXISTS kind TEXT NOT NULL DEFAULT 'invalid' CHECK (kind IN ('invalid', 'poison', 'held')),
	ADD COLUMN IF NOT EXISTS event_id TEXT,
	ADD COLUMN IF NOT EXISTS aggregate_type TEXT,
	ADD COLUMN IF NOT EXISTS aggregate_id TEXT,
	ADD COLUMN IF NOT EXISTS attempts INTEGER NOT NULL DEFAULT 0,
	ADD COLUMN IF NOT EXISTS action TEXT CHECK (action IN ('replay', 'discard')),
	ADD COLUMN IF NOT EXISTS action_requested_at TIMESTAMPTZ,
	ADD COLUMN IF NOT EXISTS action_requested_by TEXT;
CREATE INDEX IF NOT EXISTS outbox_set_aside_aggregate ON outbox_set_aside (outbox, aggregate_type, aggregate_id, id)
	WHERE aggregate_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS outbox_set_aside_action ON outbox_set_aside (outbox) WHERE action IS NOT NULL;
