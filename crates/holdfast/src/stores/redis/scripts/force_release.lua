-- Forced release (an admin's): removes the lock's holder and every held
-- shared lease, whatever their tokens; reservations and queued waiters stay.
-- KEYS: H, Q, E, S. ARGV: fence_keep_ms, lock channel, client channel prefix.
-- Returns {1 and the holder's fence, or 0 and 0; the removed shares' fences}.
-- Waiters are woken as by release.lua: a queued fair waiter is handed the
-- lock (a new owner, a fence above the removed one), else the lock's channel
-- is told. H is kept (its expiry unchanged), so the next fence is above the
-- removed ones. Field r (the last release's token) is left alone: the old
-- holder's own release must hear that it no longer held the lock.
local h, q, e, sk = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local keep, chan, cprefix = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local us = now_us()
local now = math.floor(us / 1000)
local s = read_lock(h)
local had, fence = 0, 0
if holder(s, now) then
  had, fence = 1, holder_fence(s)
  local head = s.q and purge(q, e, now)
  if head then
    hand_to_head(h, q, e, s, head, now, us, keep, cprefix)
  else
    redis.call('HSET', h, 'x', '0')
  end
end
local shares = {}
local kv = redis.call('HGETALL', sk)
for i = 1, #kv, 2 do
  local r = parse_share(kv[i], kv[i + 1])
  if r and r.held then
    redis.call('HDEL', sk, kv[i])
    if r.x > now then shares[#shares + 1] = r.ord end
  end
end
if #shares > 0 and s.e ~= 0 then
  local _, latest = read_shares(sk, now)
  redis.call('HSET', h, 'sx', int(latest))
end
if had == 1 or #shares > 0 then wake_waiters(s.w, now, chan) end
return {had, fence, shares}
