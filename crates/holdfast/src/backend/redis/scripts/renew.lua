-- Renews a batch of leases in one call. KEYS: H of each lease.
-- ARGV: token_1, ttl_ms_1, token_2, ttl_ms_2, ...
-- Returns one 1 (still held, extended) or 0 (gone) per lease.
local out = {}
for i = 1, #KEYS do
  local h = KEYS[i]
  if redis.call('HGET', h, 'o') == ARGV[2 * i - 1] then
    redis.call('PEXPIRE', h, ARGV[2 * i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
