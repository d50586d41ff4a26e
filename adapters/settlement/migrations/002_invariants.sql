-- The ledger's invariants, held by the database whatever arrives on the
-- exchange: an order is settled once, by one OrderPaid event, and only an
-- order whose settlement OrderPlaced opened can be settled.
--
-- settled_by names the OrderPaid event that settled a settlement: set with
-- the move to settled (only from pending), never changed after.
ALTER TABLE settlements ADD COLUMN IF NOT EXISTS settled_by TEXT;
ALTER TABLE settlements ADD COLUMN IF NOT EXISTS created_at TIMESTAMPTZ NOT NULL DEFAULT now();
UPDATE settlements s SET settled_by = e.event_id
FROM (SELECT order_id, min(event_id) AS event_id FROM settlement_entries GROUP BY order_id) e
WHERE s.order_id = e.order_id AND s.status = 'settled' AND s.settled_by IS NULL;
ALTER TABLE settlements ADD CONSTRAINT settlements_settled_by
	CHECK ((status = 'settled') = (settled_by IS NOT NULL));
ALTER TABLE settlements ADD CONSTRAINT settlements_order_settled_by UNIQUE (order_id, settled_by);

-- Entries only of the event that settled their order's settlement (so: of
-- an opened, settled settlement, and of one event per order), and one entry
-- of each kind per order. A ledger that already holds an order settled
-- twice makes this migration fail: reconcile lists such orders.
ALTER TABLE settlement_entries ADD CONSTRAINT settlement_entries_settled
	FOREIGN KEY (order_id, event_id) REFERENCES settlements (order_id, settled_by);
ALTER TABLE settlement_entries ADD CONSTRAINT settlement_entries_one_per_kind UNIQUE (order_id, kind);
