-- Fair acquire, also the waiter's periodic refresh. KEYS: H, Q, E.
-- ARGV: token, ttl_ms, label, queue_entry_ttl_ms, client_id, fence_keep_ms.
-- Returns {1, fence} when granted (directly, or handed off by a release), else
-- {0, ms_left, last} after queueing the waiter (or refreshing its entry; -1:
-- the lock is free but others are ahead), where every fence granted before
-- this call is at most last and every one granted after it is above: the
-- waiter takes a hand-off message's grant only if its fence is above last
-- (fair.rs). last is the lock's last fence or the server clock in
-- microseconds less one, whichever is higher, as next_fence picks fences (H,
-- and so its f, may have expired).
local h, q, e = KEYS[1], KEYS[2], KEYS[3]
local token, ttl, label, qttl, client = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]), ARGV[5]
local keep = tonumber(ARGV[6])
local s = read_lock(h)
local us = now_us()
local now = math.floor(us / 1000)
local o = holder(s, now)
if o == token then return regrant(h, s, now, ttl, keep) end
local head = purge(q, e, now)
if not o and s.sx > now then
  -- Shared leases hold the lock: queue like behind a holder.
  o = ''
  s.x = s.sx
end
if not o then
  if not head or head == token then
    if head then
      redis.call('LPOP', q)
      redis.call('HDEL', e, token)
    end
    local f = next_fence(s, us)
    if head then
      -- Others may still be queued (H may even be new): keep the queue mark.
      write(h, s, now + ttl, keep, 'o', token, 'f', int(f), 'l', label, 'x', int(now + ttl), 'q', '1')
    else
      write(h, s, now + ttl, keep, 'o', token, 'f', int(f), 'l', label, 'x', int(now + ttl))
    end
    return {1, f}
  end
end
local entry = int(now + qttl) .. ' ' .. int(ttl) .. ' ' .. client .. ' ' .. label
if redis.call('HSET', e, token, entry) == 1 then
  redis.call('RPUSH', q, token)
end
if not s.q and s.e ~= 0 then
  -- Non-fair calls read Q only when H says it may hold waiters. (Without H,
  -- they read Q anyway, and the head's grant writes the mark.)
  redis.call('HSET', h, 'q', '1')
end
redis.call('PEXPIRE', q, qttl * 2)
redis.call('PEXPIRE', e, qttl * 2)
local last = s.f
if us - 1 > last then last = us - 1 end
if o then return {0, s.x - now, last} end
return {0, -1, last}
