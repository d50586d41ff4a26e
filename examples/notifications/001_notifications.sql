-- One notification per event consumed; seq keeps the order they were
-- recorded in (created_at ties within a transaction).
CREATE TABLE notifications (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id TEXT NOT NULL UNIQUE,
    order_id TEXT NOT NULL,
    event_type TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX notifications_order_id_seq ON notifications (order_id, seq);
