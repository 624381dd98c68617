-- Status of a lock. KEYS: H, Q, E.
-- Returns {label or false, fence, ms_left, live queued waiters}.
local h, q, e = KEYS[1], KEYS[2], KEYS[3]
local now_ms = math.floor(now_us() / 1000)
local waiters = 0
for _, v in ipairs(redis.call('HVALS', e)) do
  local exp = parse_entry(v)
  if exp and exp > now_ms then waiters = waiters + 1 end
end
local s = read_lock(h)
if not holder(s, now_ms) then return {false, 0, 0, waiters} end
return {s.l or '', s.f, s.x - now_ms, waiters}
