-- Non-fair acquire. KEYS: H, and in a cluster Q and E (elsewhere the script
-- names them H:q and H:e itself: one hash tag; see hot_path_keys in keys.rs).
-- ARGV: token, ttl_ms, label, fence_keep_ms, waiter horizon ms (0: a try, or
-- a first attempt made before subscribing), fence floor (0: none; a grant's
-- fence is at least the floor, and f, the last fence, becomes it).
-- Returns {1, fence} when granted, {0, ms_left} when busy (-1: wait on the fair queue).
-- The hot path of every lock, written for the server's time (issue 33):
-- one HMGET of the fields it uses, TIME, one HSET (and a PEXPIREAT once per
-- half fence keep), straight-line code with no table or helper call; the
-- queue is read only when H says a fair waiter queued. One key, not three,
-- outside a cluster: each key of a call cost the server about 0.25 us. The
-- layout and every field's meaning are unchanged (holdfast-models'
-- redis_cycle checks them against the cheaper layouts weighed).
local h, token = KEYS[1], ARGV[1]
local v = redis.call('HMGET', h, 'o', 'f', 'x', 'e', 'sx', 'q', 'w')
local t = redis.call('TIME')
local sec, usec = tonumber(t[1]), tonumber(t[2])
local now = sec * 1000 + math.floor(usec / 1000)
local o, x, e = v[1], tonumber(v[3] or '0') or 0, tonumber(v[4] or '0') or 0
local left = nil
if o and x > now then
  -- A retry by the holder: the same grant (its kept fence hf is read by
  -- the whole-lock read, rare enough to cost nothing).
  if o == token then return regrant(h, read_lock(h), now, tonumber(ARGV[2]), tonumber(ARGV[4])) end
  left = x - now
else
  local sx = tonumber(v[5] or '0') or 0
  if sx > now then
    left = sx - now
  elseif (v[6] == '1' or e == 0) and purge(KEYS[2] or h .. ':q', KEYS[3] or h .. ':e', now) then
    -- Fair waiters are queued: they go first. (Without H nothing says the
    -- queue is empty, so it is read.)
    left = -1
  end
end
if left then
  mark_waiter(h, e, tonumber(v[7] or '0') or 0, now, tonumber(ARGV[5]))
  return {0, left}
end
local f = tonumber(v[2] or '0') or 0
local us = sec * 1000000 + usec
local floor = tonumber(ARGV[6]) or 0
-- With a floor (RedLock's: one above the last fence it saw) and a kept
-- fence, the next fence is the kept one plus one, not the clock, so that
-- members whose clocks differ answer the same floor: while H exists f + 1
-- is above every fence of the lock, as when the clock is behind f (the
-- branch redis_cycle explores with clock steps); the clock is what a
-- missing H needs.
if f >= us or (floor > 0 and f > 0) then f = f + 1 else f = us end
if floor > f then f = floor end
local lease_end = now + tonumber(ARGV[2])
local keep = tonumber(ARGV[4])
if e < lease_end + keep then
  -- H outlives the lease by the fence keep (see write in common.lua).
  e = int(lease_end + keep + math.floor(keep / 2))
  redis.call('HSET', h, 'o', token, 'f', int(f), 'l', ARGV[3], 'x', int(lease_end), 'e', e)
  redis.call('PEXPIREAT', h, e)
else
  redis.call('HSET', h, 'o', token, 'f', int(f), 'l', ARGV[3], 'x', int(lease_end))
end
-- The queue was found empty: later calls need not read it.
if v[6] == '1' then redis.call('HSET', h, 'q', '0') end
return {1, f}
