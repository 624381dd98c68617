-- Changes a held lease's label, or the limit of a lock's shares.
-- KEYS: H, S. ARGV: 'label', token, label | 'limit', limit.
-- Returns 1/0 (the token held a lease) | the weight of shares held.
local h, sk = KEYS[1], KEYS[2]
local now = math.floor(now_us() / 1000)
local s = read_lock(h)
local rows = read_shares(sk, now)
if ARGV[1] == 'label' then
  local token, label = ARGV[2], ARGV[3]
  if holder(s, now) == token then
    redis.call('HSET', h, 'l', label)
    return 1
  end
  for _, r in ipairs(rows) do
    if r.t == token and r.held then
      r.label = label
      redis.call('HSET', sk, token, share_entry(r))
      return 1
    end
  end
  return 0
end
local lim, held = tonumber(ARGV[2]), 0
for _, r in ipairs(rows) do
  if r.m == 2 then
    r.l = lim
    redis.call('HSET', sk, r.t, share_entry(r))
    if r.held then held = held + r.w end
  end
end
return held
