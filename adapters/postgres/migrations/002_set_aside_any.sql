-- set_aside_messages takes any delivery. Text columns hold only valid UTF-8
-- without NUL bytes, and an index entry at most about 2.7 kB, so a message
-- whose id or metadata text cannot hold as they are is stored with its
-- message_id made safe and bounded (a prefix, its length and a hash: see
-- middleware.SafeMessageID) and its metadata made safe, and keeps the exact
-- bytes here, for replay:
--   message_id_raw  the message id byte for byte, when message_id is not it;
--   metadata_raw    the metadata byte for byte, when metadata is not it: a
--                   JSON array of [key, value] pairs, each base64-encoded.
-- Both are NULL for every other message.
ALTER TABLE set_aside_messages
	ADD COLUMN IF NOT EXISTS message_id_raw BYTEA,
	ADD COLUMN IF NOT EXISTS metadata_raw BYTEA;
