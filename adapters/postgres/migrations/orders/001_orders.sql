CREATE TABLE IF NOT EXISTS orders (
	id          TEXT PRIMARY KEY,
	customer_id TEXT NOT NULL,
	amount      BIGINT NOT NULL CHECK (amount > 0),
	currency    TEXT NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
	status      TEXT NOT NULL CHECK (status IN ('placed', 'paid', 'cancelled')),
	version     INTEGER NOT NULL CHECK (version >= 1),
	created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
	updated_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS order_idempotency_keys (
	key          TEXT PRIMARY KEY,
	request_hash TEXT NOT NULL,
	order_id     TEXT NOT NULL REFERENCES orders (id),
	created_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);
