CREATE TABLE IF NOT EXISTS orders (
	id          TEXT PRIMARY KEY,
	customer_id TEXT NOT NULL,
	amount      BIGINT NOT NULL CHECK (amount > 0),
	currency    TEXT NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
	status      TEXT NOT NULL CHECK (status IN ('placed', 'paid', 'cancelled')),
	version     INTEGER NOT NULL CHECK (version >= 1),
	-- settled: settlement booked the paid order (SettlementRecorded).
	settled     BOOLEAN NOT NULL DEFAULT false CHECK (NOT settled OR status = 'paid'),
	created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
	updated_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS order_idempotency_keys (
	key          TEXT PRIMARY KEY,
	request_hash TEXT NOT NULL,
	order_id     TEXT NOT NULL REFERENCES orders (id),
	created_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);
