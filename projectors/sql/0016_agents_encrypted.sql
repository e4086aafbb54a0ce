-- Whether a served agent encrypts its runs' payloads: a client without the master
-- key refuses to send such an agent an input in plain text (it would stay in the
-- commands topic, which never expires, after the run is forgotten).
ALTER TABLE agents ADD COLUMN IF NOT EXISTS encrypted boolean NOT NULL DEFAULT false;
