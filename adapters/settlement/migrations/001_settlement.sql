-- One settlement per order: opened (pending) when the order is placed,
-- settled when it is paid, voided when it is cancelled.
CREATE TABLE IF NOT EXISTS settlements (
	order_id   TEXT PRIMARY KEY,
	amount     BIGINT NOT NULL CHECK (amount > 0),
	currency   TEXT NOT NULL,
	status     TEXT NOT NULL CHECK (status IN ('pending', 'settled', 'voided')),
	version    INTEGER NOT NULL CHECK (version >= 0),
	updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

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
