-- Non-fair acquire. KEYS: H, Q, E. ARGV: token, ttl_ms, label, fence_keep_ms.
-- Returns {1, fence} when granted, {0, ms_left} when busy (-1: wait on the fair queue).
local h, q, e = KEYS[1], KEYS[2], KEYS[3]
local token, ttl, label, keep = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local s = read_lock(h)
local us = now_us()
local now = math.floor(us / 1000)
local o = holder(s, now)
if o == token then return regrant(h, s, now, ttl, keep) end
if o then return {0, s.x - now} end
if s.sx > now then return {0, s.sx - now} end
if redis.call('EXISTS', q) == 1 and purge(q, e, now) then
  -- Fair waiters are queued: they go first.
  return {0, -1}
end
local f = next_fence(s, us)
write(h, s, now + ttl, keep, 'o', token, 'f', int(f), 'l', label, 'x', int(now + ttl))
return {1, f}
