-- Approvers' public keys: a signed approval names its key; workers verify the
-- signature with the key registered here and take the approver's identity and roles
-- from it (es-agents keys new|list|revoke).
CREATE TABLE IF NOT EXISTS approver_keys (
    key_id      text PRIMARY KEY,
    identity    text NOT NULL,
    roles       text[] NOT NULL DEFAULT '{}',
    public_key  bytea NOT NULL CHECK (octet_length(public_key) = 32),
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);
