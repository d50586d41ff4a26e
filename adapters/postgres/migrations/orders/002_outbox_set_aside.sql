-- Outbox rows a relay could not forward (not a valid envelope), kept with the
-- reason so that the rows behind them keep flowing.
CREATE TABLE IF NOT EXISTS outbox_set_aside (
	id           BIGSERIAL PRIMARY KEY,
	outbox       TEXT NOT NULL,
	message_id   TEXT NOT NULL,
	payload      BYTEA NOT NULL,
	reason       TEXT NOT NULL,
	set_aside_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
