-- Outboxmill's own tables, beside every module's: the dedup markers and
-- set-aside messages of consumer handlers, the outbox rows a relay set aside,
-- and the last aggregate version each handler applied. The outbox tables
-- themselves are created per outbox by outbox.Initialize, with
-- watermill-sql's statements.

-- Dedup markers: one row per event and handler, inserted in the handler's
-- own transaction.
CREATE TABLE IF NOT EXISTS processed_events (
	event_id     TEXT NOT NULL,
	handler      TEXT NOT NULL,
	processed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
	PRIMARY KEY (event_id, handler)
);
CREATE INDEX IF NOT EXISTS processed_events_processed_at ON processed_events (processed_at);

-- Messages a handler could not process, kept with the reason until an
-- operator replays or discards them. A message held back by the version
-- guard (an aggregate version whose predecessor was not applied yet) has
-- its aggregate and version and a held_until time: until then it is applied
-- as soon as its predecessor is; after it, it stays set aside.
CREATE TABLE IF NOT EXISTS set_aside_messages (
	id                BIGSERIAL PRIMARY KEY,
	handler           TEXT NOT NULL,
	message_id        TEXT NOT NULL,
	topic             TEXT NOT NULL,
	payload           BYTEA NOT NULL,
	metadata          JSONB NOT NULL DEFAULT '{}',
	reason            TEXT NOT NULL,
	attempts          INTEGER NOT NULL,
	set_aside_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
	aggregate_type    TEXT,
	aggregate_id      TEXT,
	aggregate_version INTEGER,
	held_until        TIMESTAMPTZ
);
-- Retention keeps the dedup marker of every event that is still set aside:
-- it looks set-aside messages up by handler and message id.
CREATE INDEX IF NOT EXISTS set_aside_messages_handler_message_id ON set_aside_messages (handler, message_id);
CREATE INDEX IF NOT EXISTS set_aside_messages_held ON set_aside_messages (handler, aggregate_type, aggregate_id, aggregate_version)
	WHERE held_until IS NOT NULL;

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

-- The last aggregate version each handler applied, written in the handler's
-- transaction: an older or equal version is a duplicate, a gap is held back.
CREATE TABLE IF NOT EXISTS aggregate_versions (
	handler        TEXT NOT NULL,
	aggregate_type TEXT NOT NULL,
	aggregate_id   TEXT NOT NULL,
	version        INTEGER NOT NULL CHECK (version >= 1),
	applied_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
	PRIMARY KEY (handler, aggregate_type, aggregate_id)
);
-- Retention purges the rows not written to for longer than the dedup window.
CREATE INDEX IF NOT EXISTS aggregate_versions_applied_at ON aggregate_versions (applied_at);
