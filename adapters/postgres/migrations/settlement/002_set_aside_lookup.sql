-- Retention keeps the dedup marker of every event that is still set aside:
-- it looks set-aside messages up by handler and message id.
CREATE INDEX IF NOT EXISTS set_aside_messages_handler_message_id ON set_aside_messages (handler, message_id);
