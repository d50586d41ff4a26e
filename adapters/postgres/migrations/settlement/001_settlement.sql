-- Append-only ledger: a settled order has one platform_fee and one
-- merchant_credit entry. Rows are never updated; a double effect would show
-- as doubled totals.
CREATE TABLE IF NOT EXISTS settlement_entries (
	id          BIGSERIAL PRIMARY KEY,
	order_id    TEXT NOT NULL,
	event_id    TEXT NOT NULL,
	kind        TEXT NOT NULL CHECK (kind IN ('platform_fee', 'merchant_credit')),
	amount      BIGINT NOT NULL CHECK (amount >= 0),
	currency    TEXT NOT NULL,
	occurred_at TIMESTAMPTZ NOT NULL,
	created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS settlement_entries_order_id ON settlement_entries (order_id);

-- Dedup markers: one row per event and handler, inserted in the handler's
-- own transaction.
CREATE TABLE IF NOT EXISTS processed_events (
	event_id     TEXT NOT NULL,
	handler      TEXT NOT NULL,
	processed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
	PRIMARY KEY (event_id, handler)
);
CREATE INDEX IF NOT EXISTS processed_events_processed_at ON processed_events (processed_at);

-- Messages a handler could not process after its retries, kept with the
-- reason until an operator replays or discards them.
CREATE TABLE IF NOT EXISTS set_aside_messages (
	id          BIGSERIAL PRIMARY KEY,
	handler     TEXT NOT NULL,
	message_id  TEXT NOT NULL,
	topic       TEXT NOT NULL,
	payload     BYTEA NOT NULL,
	metadata    JSONB NOT NULL DEFAULT '{}',
	reason      TEXT NOT NULL,
	attempts    INTEGER NOT NULL,
	set_aside_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
