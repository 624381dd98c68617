-- Renews a batch of leases in one call. KEYS: H and S of each lease, in pairs.
-- ARGV: fence_keep_ms, token_1, ttl_ms_1, token_2, ttl_ms_2, ...
-- Returns one 1 (still held, extended to its TTL from now) or 0 (gone) per lease.
-- An exclusive lease (the common case, thousands per call) costs one HMGET of
-- the three fields it needs and one HSET; a shared lease reads the whole lock.
local keep = tonumber(ARGV[1])
local now = math.floor(now_us() / 1000)
local out = {}
-- Leases of one call mostly share a TTL: work out each lease end once.
local ends, end_text = {}, {}
for i = 1, #KEYS / 2 do
  local h, sk = KEYS[2 * i - 1], KEYS[2 * i]
  local token = ARGV[2 * i]
  local ttl = ARGV[2 * i + 1]
  local lease_end = ends[ttl]
  if not lease_end then
    lease_end = now + tonumber(ttl)
    ends[ttl], end_text[ttl] = lease_end, int(lease_end)
  end
  out[i] = 0
  local v = redis.call('HMGET', h, 'o', 'x', 'e')
  if v[1] == token and (tonumber(v[2] or '0') or 0) > now then
    local at = tonumber(v[3] or '0') or 0
    if at < lease_end + keep then
      at = lease_end + keep + math.floor(keep / 2)
      redis.call('HSET', h, 'x', end_text[ttl], 'e', int(at))
      redis.call('PEXPIREAT', h, int(at))
    else
      redis.call('HSET', h, 'x', end_text[ttl])
    end
    out[i] = 1
  else
    local r = redis.call('HGET', sk, token)
    r = r and parse_share(token, r)
    if r and r.held and r.x > now then
      local s = read_lock(h)
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
