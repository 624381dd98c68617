-- Writes the record kept with a lock. KEYS: H, S, R. ARGV: token, value.
-- Returns 1 if the token held a live exclusive lease of the lock (the
-- exclusive grant in H, or a writer's held entry in S), and then sets R to
-- value; else 0, and writes nothing. R has no expiry: the record outlives
-- every lease of the lock (it is the fallback chain's mode).
local h, sk, rk = KEYS[1], KEYS[2], KEYS[3]
local token, value = ARGV[1], ARGV[2]
local s = read_lock(h)
local now = math.floor(now_us() / 1000)
local held = holds(s, sk, token, now, true)
if held then redis.call('SET', rk, value) end
return held and 1 or 0
