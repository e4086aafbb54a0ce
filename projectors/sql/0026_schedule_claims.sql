-- Due schedules are claimed for a while, as timers are (0025): no transaction stays
-- open while a schedule's runs are started.
ALTER TABLE schedules ADD COLUMN IF NOT EXISTS claimed_until timestamptz;
