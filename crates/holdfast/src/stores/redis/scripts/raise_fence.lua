-- Raises a lock's fence floor. KEYS: H, S. ARGV: token, floor, fence_keep_ms.
-- Returns 1 if the token held a live lease of the lock (the exclusive grant
-- or a held share), else 0, and then changes nothing: only a holder raises.
-- The lock's last fence f becomes max(f, floor), so the next fence (see
-- next_fence) is above floor; it is never lowered. H is then kept as a last
-- fence always is: at least fence_keep_ms past the later of now and the end
-- of the lock's last lease. A raise that changes nothing writes nothing.
-- floor is at most 2^52 (checked by the client): Lua numbers are doubles,
-- exact to 2^53, so f + 1 stays exact.
local h, sk = KEYS[1], KEYS[2]
local token, floor, keep = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local s = read_lock(h)
local now = math.floor(now_us() / 1000)
local held = holds(s, sk, token, now, false)
if held and floor > s.f then
  -- A raise by the holder is its grant's fence from now on (RedLock writes
  -- the fence it chose back to its members, and reads it in status): the
  -- holder's kept fence, if any, gives way to f.
  if s.hf then redis.call('HDEL', h, 'hf') end
  write(h, s, now, keep, 'f', int(floor))
end
return held and 1 or 0
