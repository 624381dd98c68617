-- Shared helpers, prepended to every holdfast script.
-- Lock layout (all keys share the hash tag {PREFIX:KEY}, one Cluster slot):
--   H = {PREFIX:KEY}    hash, the lock:
--         o = owner token of the last grant, f = its fence (the lock's last
--         fence), l = its holder's label,
--         x = end of its lease in server ms (TIME), 0 once released: o holds
--             the lock while x is later than now,
--         r = token of the last release (a re-sent release is told "released"),
--         e = when H itself expires, server ms (PEXPIREAT).
--       H outlives every lease by at least the fence keep period, so the last
--       fence survives a lease that expired as well as one that was released.
--   Q = {PREFIX:KEY}:q  list of queued fair waiters' tokens, in request order
--   E = {PREFIX:KEY}:e  hash: token -> "expiry_ms ttl_ms client_id label" of each queued waiter
-- Time comes only from the server (TIME), never from a client.

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function int(n)
  return string.format('%d', n)
end

-- The lock's state, in one read.
local function read_lock(h)
  local v = redis.call('HMGET', h, 'o', 'f', 'x', 'e', 'r', 'l')
  return { o = v[1], f = tonumber(v[2] or '0') or 0, x = tonumber(v[3] or '0') or 0,
           e = tonumber(v[4] or '0') or 0, r = v[5], l = v[6] }
end

-- The token holding the lock at server time now_ms, or nil.
local function holder(s, now_ms)
  if s.o and s.x > now_ms then return s.o end
  return nil
end

-- The next fence of a lock: the server clock in microseconds, or one above the
-- lock's last fence if that is higher. Strictly increasing while H exists,
-- whatever the clock does; after H expired, increasing as long as the server
-- clock has not stepped back past the last fence.
local function next_fence(s, us)
  if s.f >= us then return s.f + 1 end
  return us
end

-- Writes the field/value pairs into H and keeps H alive until at least keep_ms
-- past lease_end, so the lock's fence outlives the lease. The expiry moves in
-- steps of half a keep period beyond that, so most renewals need no PEXPIREAT.
local function write(h, s, lease_end, keep_ms, ...)
  local at = s.e
  local move = at < lease_end + keep_ms
  if move then at = lease_end + keep_ms + math.floor(keep_ms / 2) end
  redis.call('HSET', h, 'e', int(at), ...)
  if move then redis.call('PEXPIREAT', h, int(at)) end
end

-- A retry by the token that holds the lock (its reply was lost, or it was
-- handed the lock with a short claim window): the same grant, its lease
-- counted from now, as the client counts it from the retry.
local function regrant(h, s, now_ms, ttl_ms, keep_ms)
  write(h, s, now_ms + ttl_ms, keep_ms, 'x', int(now_ms + ttl_ms))
  return {1, s.f}
end

local function parse_entry(v)
  local exp, ttl, client, label = string.match(v, '^(%d+) (%d+) (%S+) (.*)$')
  return tonumber(exp), tonumber(ttl), client, label
end

-- Drops queued waiters at the head of Q whose entry expired (dead waiters).
local function purge(q, e, now_ms)
  while true do
    local head = redis.call('LINDEX', q, 0)
    if not head then return nil end
    local v = redis.call('HGET', e, head)
    if v then
      local exp = parse_entry(v)
      if exp and exp > now_ms then return head end
    end
    redis.call('LPOP', q)
    redis.call('HDEL', e, head)
  end
end
