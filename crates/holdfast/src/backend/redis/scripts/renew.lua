-- Renews a batch of leases in one call. KEYS: H of each lease.
-- ARGV: fence_keep_ms, token_1, ttl_ms_1, token_2, ttl_ms_2, ...
-- Returns one 1 (still held, extended to its TTL from now) or 0 (gone) per lease.
local keep = tonumber(ARGV[1])
local now = math.floor(now_us() / 1000)
local out = {}
for i = 1, #KEYS do
  local h = KEYS[i]
  local s = read_lock(h)
  if holder(s, now) == ARGV[2 * i] then
    local lease_end = now + tonumber(ARGV[2 * i + 1])
    write(h, s, lease_end, keep, 'x', int(lease_end))
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
