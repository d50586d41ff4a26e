-- Where a relay of kind cdc (logical replication) stands in its replication
-- slot, per outbox and consumer group: every transaction committed before
-- lsn is forwarded, and the position it stored in the outbox's offsets table
-- with it. Written in the transaction that moves the offsets position, on the
-- relay's lease. A relay that finds the offsets position no longer equal to
-- the one recorded here knows that another relay kind moved it, and reads
-- the outbox from that position into a new slot instead of resuming the old.
CREATE TABLE IF NOT EXISTS outbox_cdc_positions (
	outbox          TEXT NOT NULL,
	consumer_group  TEXT NOT NULL,
	slot_name       TEXT NOT NULL,
	lsn             PG_LSN NOT NULL,
	position_tx     XID8 NOT NULL,
	position_offset BIGINT NOT NULL,
	updated_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
	PRIMARY KEY (outbox, consumer_group)
);
