-- Renews a batch of leases in one call. KEYS: H and S of each lease, in pairs.
-- ARGV: fence_keep_ms, token_1, ttl_ms_1, token_2, ttl_ms_2, ...
-- Returns one 1 (still held, extended to its TTL from now) or 0 (gone) per lease.
local keep = tonumber(ARGV[1])
local now = math.floor(now_us() / 1000)
local out = {}
for i = 1, #KEYS / 2 do
  local h, sk = KEYS[2 * i - 1], KEYS[2 * i]
  local token = ARGV[2 * i]
  local lease_end = now + tonumber(ARGV[2 * i + 1])
  local s = read_lock(h)
  out[i] = 0
  if holder(s, now) == token then
    write(h, s, lease_end, keep, 'x', int(lease_end))
    out[i] = 1
  else
    local v = redis.call('HGET', sk, token)
    local r = v and parse_share(token, v)
    if r and r.held and r.x > now then
      r.x = lease_end
      redis.call('HSET', sk, token, share_entry(r))
      local sx = s.sx
      if lease_end > sx then sx = lease_end end
      redis.call('PEXPIREAT', sk, int(write(h, s, lease_end, keep, 'sx', int(sx))))
      out[i] = 1
    end
  end
end
return out
