-- Acquire of a lease model mode other than the plain mutex: a writer (mode 1)
-- or a share (mode 2) under a limit. KEYS: H, S.
-- ARGV: token, ttl_ms, label, fence_keep_ms, mode, weight, limit, reserve (1:
-- a waiting attempt, which leaves a reservation when refused), waiter horizon
-- ms (see mark_waiter; 0 for a try).
-- Returns {1, fence} granted, {0, ms_left or -1} refused, {2, other limit} conflict.
local h, sk = KEYS[1], KEYS[2]
local token, ttl, label, keep = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local m, w, lim, reserve = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8] == '1'
local horizon = tonumber(ARGV[9])
local s = read_lock(h)
local us = now_us()
local now = math.floor(us / 1000)
local o = holder(s, now)
-- A retry by a share's holder first, by its own entry alone: a waiter that
-- asks beside the hand-over that made its grant finds that grant (a third
-- of the one-process semaphore's calls, measured on 2026-12-01), and
-- decide_shares would read every entry to answer 'held' (own held entry
-- before anything else).
local own = redis.call('HGET', sk, token)
if own then
  local ox = string.match(own, '^1 %d %d+ %d+ %d+ (%d+) ')
  if ox and tonumber(ox) > now then return regrant_share(h, sk, s, token, own, now, ttl, keep) end
end
local d, v, latest, res, held_w = decide_shares(sk, token, m, w, lim, now, o, o and holder_fence(s))
if d == 'held' then
  if o == token then return regrant(h, s, now, ttl, keep) end
  -- A share's holder is answered above; decide_shares says 'held' only
  -- when an unexpired held entry of the token is in S.
  return regrant_share(h, sk, s, token, own, now, ttl, keep)
end
if d == 'grant' then
  local f = next_fence(s, us)
  if m == 2 then
    redis.call('HSET', sk, token, share_entry({ held = true, m = m, w = w, l = lim, ord = f, x = now + ttl, label = label }))
    local sx = s.sx
    if now + ttl > sx then sx = now + ttl end
    if #res == 0 then
      -- Every entry read, no reservation left: the stamp (common.lua).
      redis.call('PEXPIREAT', sk, int(write(h, s, now + ttl, keep, 'f', int(f), 'sx', int(sx),
                                            'zf', int(f), 'zw', int(held_w + w))))
    else
      redis.call('PEXPIREAT', sk, int(write(h, s, now + ttl, keep, 'f', int(f), 'sx', int(sx))))
    end
  else
    redis.call('HDEL', sk, token)
    write(h, s, now + ttl, keep, 'o', token, 'f', int(f), 'l', label, 'x', int(now + ttl))
  end
  return {1, f}
end
if d == 'conflict' then return {2, v} end
if reserve then
  local place = v
  if not place then
    -- A new place, from the fence counter, so later places and fences are higher.
    place = next_fence(s, us)
    keep_holder_fence(h, s, now)
    write(h, s, now + ttl, keep, 'f', int(place))
  end
  redis.call('HSET', sk, token, share_entry({ held = false, m = m, w = w, l = lim, ord = place, x = now + ttl, label = label }))
  if redis.call('PTTL', sk) < ttl then redis.call('PEXPIRE', sk, ttl * 2) end
  mark_waiter(h, s.e, s.w, now, horizon)
end
if o then return {0, s.x - now} end
if latest > now then return {0, latest - now} end
return {0, -1}
