-- Status of a lock. KEYS: H, Q, E, S.
-- Returns {label or false, fence, ms_left, waiters, shares}, shares a list of
-- {label, fence, ms_left, weight, limit}, one per held shared lease. Waiters
-- are the live fair-queue entries and the live reservations of waiting shared
-- and writer requests; a waiting default-mode exclusive request leaves
-- nothing here to count.
local h, q, e, sk = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now_ms = math.floor(now_us() / 1000)
local waiters = 0
for _, v in ipairs(redis.call('HVALS', e)) do
  local exp = parse_entry(v)
  if exp and exp > now_ms then waiters = waiters + 1 end
end
local shares = {}
local kv = redis.call('HGETALL', sk)
for i = 1, #kv, 2 do
  local r = parse_share(kv[i], kv[i + 1])
  if r and r.held and r.x > now_ms then
    shares[#shares + 1] = { r.label, r.ord, r.x - now_ms, r.w, r.l }
  elseif r and r.x > now_ms then
    waiters = waiters + 1
  end
end
local s = read_lock(h)
if not holder(s, now_ms) then return {false, 0, 0, waiters, shares} end
return {s.l or '', holder_fence(s), s.x - now_ms, waiters, shares}
