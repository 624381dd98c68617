-- Hand-over: a holder's release and the grant of a waiting task of the same
-- client, in one call (issue 33; the design is model-checked in
-- holdfast-models' handover). KEYS: H.
-- ARGV: from (the releasing token), to (the waiter's own token), the
-- waiter's ttl_ms and label, fence_keep_ms, bound (hand-overs in a row
-- allowed), lock channel.
-- Returns {1, fence}: to holds the lock with a new fence and a lease of
-- ttl_ms from now, from holds nothing (r = from, as after a release).
-- {0, 1}: not handed, but released as release.lua's hot path releases (the
-- bound was reached: the lock goes to whoever comes first, woken on the
-- lock's channel). {0, 0}: nothing changed (from holds no live lease, or
-- fair waiters are queued): the client releases by release.lua.
local h, from, to = KEYS[1], ARGV[1], ARGV[2]
local v = redis.call('HMGET', h, 'o', 'f', 'x', 'e', 'q', 'hn', 'r', 'w')
local t = redis.call('TIME')
local sec, usec = tonumber(t[1]), tonumber(t[2])
local now = sec * 1000 + math.floor(usec / 1000)
local o, x = v[1], tonumber(v[3] or '0') or 0
if o == to and x > now and v[7] == from then
  -- A call sent again after a lost connection, whose first copy handed the
  -- lock: the same grant.
  return {1, holder_fence(read_lock(h))}
end
-- Only an unexpired lease is handed on: a released one keeps o, and a late
-- copy of this call must not bring it back.
if o ~= from or x <= now or v[5] == '1' then return {0, 0} end
local n = 0
if v[6] then
  local ht, hc = string.match(v[6], '^(%S+) (%d+)$')
  if ht == from then n = tonumber(hc) end
end
if n >= tonumber(ARGV[6]) then
  -- Enough hand-overs in a row: release, and let other clients' waiters in.
  redis.call('HSET', h, 'x', '0', 'r', from)
  wake_waiters(tonumber(v[8] or '0') or 0, now, ARGV[7])
  return {0, 1}
end
local s = { f = tonumber(v[2] or '0') or 0, e = tonumber(v[4] or '0') or 0 }
local f = next_fence(s, sec * 1000000 + usec)
local lease_end = now + tonumber(ARGV[3])
write(h, s, lease_end, tonumber(ARGV[5]), 'o', to, 'f', int(f), 'l', ARGV[4], 'x', int(lease_end), 'r', from,
      'hn', to .. ' ' .. int(n + 1))
return {1, f}
