-- Fair acquire, also the waiter's periodic refresh. KEYS: H, Q, E.
-- ARGV: token, ttl_ms, label, queue_entry_ttl_ms, client_id.
-- Returns {1, fence} when granted (directly, or handed off by a release), else
-- {0, pttl_ms} after queueing the waiter (or refreshing its entry).
local h, q, e = KEYS[1], KEYS[2], KEYS[3]
local token, ttl, label, qttl, client = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local o = redis.call('HGET', h, 'o')
if o == token then
  -- Handed off by a release (with a short claim window), or a retry: take the full lease now.
  redis.call('PEXPIRE', h, ttl)
  return {1, tonumber(redis.call('HGET', h, 'f'))}
end
local us = now_us()
local now_ms = math.floor(us / 1000)
local head = purge(q, e, now_ms)
if not o then
  if not head or head == token then
    if head then
      redis.call('LPOP', q)
      redis.call('HDEL', e, token)
    end
    return {1, grant(h, token, ttl, label, us)}
  end
end
local entry = string.format('%d', now_ms + qttl) .. ' ' .. ttl .. ' ' .. client .. ' ' .. label
if redis.call('HSET', e, token, entry) == 1 then
  redis.call('RPUSH', q, token)
end
redis.call('PEXPIRE', q, qttl * 2)
redis.call('PEXPIRE', e, qttl * 2)
if o then return {0, redis.call('PTTL', h)} end
return {0, -1}
