-- Shared helpers, prepended to every holdfast script.
-- Lock layout (all keys share the hash tag {PREFIX:KEY}, one Cluster slot):
--   H = {PREFIX:KEY}    hash: o = owner token, f = last fence, l = holder label; PEXPIRE = the lease
--   Q = {PREFIX:KEY}:q  list of queued fair waiters' tokens, in request order
--   E = {PREFIX:KEY}:e  hash: token -> "expiry_ms ttl_ms client_id label" of each queued waiter
-- Time comes only from the server (TIME, PEXPIRE), never from a client.

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- The next fence of a lock: the server clock in microseconds, or one above the
-- last fence kept in H if that is higher. Strictly increasing per lock while H
-- exists; after H expired, increasing as long as the server clock has not
-- stepped back past the last fence.
local function next_fence(h, us)
  local last = tonumber(redis.call('HGET', h, 'f') or '0') or 0
  if last >= us then return last + 1 end
  return us
end

local function grant(h, token, ttl_ms, label, us)
  local f = next_fence(h, us)
  redis.call('HSET', h, 'o', token, 'f', string.format('%d', f), 'l', label)
  redis.call('PEXPIRE', h, ttl_ms)
  return f
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
