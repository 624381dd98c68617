-- Non-fair acquire. KEYS: H, Q, E. ARGV: token, ttl_ms, label.
-- Returns {1, fence} when granted, {0, pttl_ms} when busy (-1: wait on the fair queue).
local h, q, e = KEYS[1], KEYS[2], KEYS[3]
local token = ARGV[1]
local cur = redis.call('HMGET', h, 'o', 'f')
if cur[1] then
  if cur[1] == token then
    -- A retry of an attempt that already succeeded (its reply was lost): the
    -- same grant, with the lease counted from now, as the client counts it.
    redis.call('PEXPIRE', h, ARGV[2])
    return {1, tonumber(cur[2])}
  end
  return {0, redis.call('PTTL', h)}
end
local us = now_us()
if redis.call('EXISTS', q) == 1 and purge(q, e, math.floor(us / 1000)) then
  -- Fair waiters are queued: they go first.
  return {0, -1}
end
local f = us
local last = tonumber(cur[2] or '0') or 0
if last >= us then f = last + 1 end
redis.call('HSET', h, 'o', token, 'f', string.format('%d', f), 'l', ARGV[3])
redis.call('PEXPIRE', h, ARGV[2])
return {1, f}
