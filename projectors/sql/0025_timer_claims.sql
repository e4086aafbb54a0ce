-- A worker claims the due timers it fires for a while (a lease) instead of holding
-- their rows locked while it sends their wake-ups: a send that waited out a
-- broker's failover kept a transaction open past the session's idle limit, and the
-- server ended the worker's session. A claim not marked fired by its end is due
-- again.
ALTER TABLE timers ADD COLUMN IF NOT EXISTS claimed_until timestamptz;
