-- Release by token, and removal of the token's queue entry (a cancelled waiter).
-- KEYS: H, Q, E. ARGV: token, fence_keep_ms, lock channel, client channel prefix.
-- Returns 1 if the token held the lock, else 0.
-- When fair waiters are queued, the lock goes straight to the live head waiter
-- (new owner, new fence, a claim window of its entry's remaining life) and only
-- that waiter's client is told; otherwise the lock channel is told, once.
local h, q, e = KEYS[1], KEYS[2], KEYS[3]
local token, keep, chan, cprefix = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local o = redis.call('HGET', h, 'o')
if o ~= token then
  -- Not the holder: maybe a cancelled fair waiter (the owner is never queued).
  local dequeued = false
  if redis.call('HDEL', e, token) == 1 then
    redis.call('LREM', q, 1, token)
    dequeued = true
  end
  if dequeued and not o then
    -- The lock is free (its holder expired) and this waiter may have been the
    -- head: let the new head know.
    local head = purge(q, e, math.floor(now_us() / 1000))
    if head then
      local _, _, client = parse_entry(redis.call('HGET', e, head))
      redis.call('PUBLISH', cprefix .. client, head)
    end
  end
  return 0
end
local head = nil
local us = 0
if redis.call('EXISTS', q) == 1 then
  us = now_us()
  head = purge(q, e, math.floor(us / 1000))
end
if head then
  local now_ms = math.floor(us / 1000)
  local exp, ttl, client, label = parse_entry(redis.call('HGET', e, head))
  redis.call('LPOP', q)
  redis.call('HDEL', e, head)
  local claim = exp - now_ms
  if claim < 100 then claim = 100 end
  if claim > ttl then claim = ttl end
  local f = next_fence(h, us)
  redis.call('HSET', h, 'o', head, 'f', string.format('%d', f), 'l', label)
  redis.call('PEXPIRE', h, claim)
  redis.call('PUBLISH', cprefix .. client, head)
  return 1
end
redis.call('HDEL', h, 'o', 'l')
redis.call('PEXPIRE', h, keep)
redis.call('PUBLISH', chan, '')
return 1
