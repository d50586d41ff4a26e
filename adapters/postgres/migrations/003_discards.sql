-- Set-aside events an operator (or a tool) discarded: a consumer message
-- deleted from set_aside_messages (handler set) or an outbox row deleted
-- from outbox_set_aside (outbox set), recorded in the transaction of the
-- delete, so that reconcile reports the event as discarded, not missing.
-- Rows are never updated; they are kept as the record of the decision.
CREATE TABLE IF NOT EXISTS discarded_events (
	id           BIGSERIAL PRIMARY KEY,
	event_id     TEXT NOT NULL,
	handler      TEXT,
	outbox       TEXT,
	event_type   TEXT NOT NULL DEFAULT '',
	reason       TEXT NOT NULL,
	set_aside_at TIMESTAMPTZ,
	discarded_at TIMESTAMPTZ NOT NULL DEFAULT now(),
	discarded_by TEXT NOT NULL CHECK (discarded_by <> ''),
	CHECK ((handler IS NULL) <> (outbox IS NULL))
);
CREATE INDEX IF NOT EXISTS discarded_events_handler ON discarded_events (handler, event_id) WHERE handler IS NOT NULL;
CREATE INDEX IF NOT EXISTS discarded_events_outbox ON discarded_events (outbox, event_id) WHERE outbox IS NOT NULL;
