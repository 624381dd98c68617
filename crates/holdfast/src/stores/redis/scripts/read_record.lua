-- Reads the record kept with a lock. KEYS: R. Returns its value, or nil
-- if none was ever written.
return redis.call('GET', KEYS[1])
