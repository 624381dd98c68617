-- Non-fair acquire. KEYS: H, Q, E. ARGV: token, ttl_ms, label.
-- Returns {1, fence} when granted, {0, pttl_ms} when busy (-1: wait on the fair queue).
local h, q, e = KEYS[1], KEYS[2], KEYS[3]
local token = ARGV[1]
local o = redis.call('HGET', h, 'o')
if o then
  if o == token then
    -- A retry of an attempt that already succeeded: the same grant.
    return {1, tonumber(redis.call('HGET', h, 'f'))}
  end
  return {0, redis.call('PTTL', h)}
end
local us = now_us()
if redis.call('LLEN', q) > 0 and purge(q, e, math.floor(us / 1000)) then
  -- Fair waiters are queued: they go first.
  return {0, -1}
end
return {1, grant(h, token, ARGV[2], ARGV[3], us)}
