-- Status of a lock. KEYS: H, Q, E.
-- Returns {label or false, fence, pttl_ms, live queued waiters}.
local h, q, e = KEYS[1], KEYS[2], KEYS[3]
local now_ms = math.floor(now_us() / 1000)
local waiters = 0
for _, v in ipairs(redis.call('HVALS', e)) do
  local exp = parse_entry(v)
  if exp and exp > now_ms then waiters = waiters + 1 end
end
local o = redis.call('HGET', h, 'o')
if not o then return {false, 0, 0, waiters} end
return {redis.call('HGET', h, 'l'), tonumber(redis.call('HGET', h, 'f')), redis.call('PTTL', h), waiters}
