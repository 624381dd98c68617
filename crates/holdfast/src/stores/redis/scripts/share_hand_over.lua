-- Hand-over of a shared lease (a permit, a read lease): a holder's release
-- and the admission of a waiting share of the same client, in one call
-- (issue 33; model-checked in holdfast-models' share_handover). KEYS: H, S.
-- ARGV: from (the releasing token), to (the waiter's own token), the
-- waiter's ttl_ms, label, weight and limit, fence_keep_ms, lock channel.
-- Returns {1, fence, spare}: to holds a share with a new fence and a lease
-- of ttl_ms from now, from holds nothing; spare: the weight a new request
-- would find free now, after the reservations in line (-1 if a writer's
-- reservation waits), which tells the client whether its next waiter's own
-- attempt may be granted beside this call (a copy or a waiter's own grant:
-- {1, fence}, nothing said). {0, 1}: from released as a share's
-- release does, to not admitted (a reservation of another request comes
-- first, or its request does not fit): the lock's channel is told. {0, 0}:
-- nothing changed (from holds no live share): the client releases by
-- release.lua.
-- The admission is decide_shares, the rule of every shared acquire, run
-- right after from's release: a hand-over grants only what the waiter's own
-- attempt would be granted at that moment, so it never passes over another
-- client's reservation and needs no bound of its own. It tells the lock's
-- channel whenever another reserved request may now be admitted (a permit
-- left free beside the handed one), which a release would have told.
-- When the key's stamp holds (common.lua: f unmoved since a share's grant
-- read every entry and left no reservation), no entry is read: the
-- admission's answer is known (no reservation, at most zw of weight), and
-- spare is reckoned from zw, so it is at most what is free.
local h, sk, from, to = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local ttl, label, w, lim = tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
local keep = tonumber(ARGV[7])
local us = now_us()
local now = math.floor(us / 1000)
local fv = redis.call('HGET', sk, from)
-- By the stamp (common.lua; model 16), first, reading only the fields it
-- uses, as strings, and numbers only where it must: this path is most
-- hand-overs, and each field read costs the server about 0.1 us and each
-- number parsed about 0.2, a whole parse of an entry about 1.9 (measured
-- on redis 7.0; performance.md, 2026-12-01 (late night)). f and zf are
-- compared as text: both are written by int(), so equal text is the
-- equal number, and any other text takes the path below.
local z = redis.call('HMGET', h, 'f', 'zf', 'zw', 'o', 'x', 'e', 'sx')
if fv and z[1] and z[1] == z[2] and not (z[4] and (tonumber(z[5] or '0') or 0) > now) then
  -- from's entry: a held share (mode 2) with the waiter's limit, unexpired.
  local fw, fl, fx = string.match(fv, '^1 2 (%d+) (%d+) %d+ (%d+) ')
  local zw = fw and fl == ARGV[6] and tonumber(fx) > now and tonumber(z[3] or '')
  if zw then
    zw = zw - tonumber(fw) + w
    if zw <= lim then
      -- No reservation in S and at most zw of weight with from's share out
      -- and the waiter's in, and no one waits to be told. Only if to has no
      -- entry (HSETNX): else its own attempt was granted or reserved, and S
      -- is read below.
      local f, x = fence_after(tonumber(z[1]), us), now + ttl
      local fs = int(f)
      local entry = '1 2 ' .. int(w) .. ' ' .. fl .. ' ' .. fs .. ' ' .. int(x) .. ' ' .. label
      if redis.call('HSETNX', sk, to, entry) == 1 then
        redis.call('HDEL', sk, from)
        local sx = tonumber(z[7] or '0') or 0
        if x > sx then sx = x end
        local s = { e = tonumber(z[6] or '0') or 0 }
        redis.call('PEXPIREAT', sk, int(write(h, s, x, keep, 'f', fs, 'sx', int(sx), 'r', from,
                                              'zf', fs, 'zw', int(zw))))
        return {1, f, lim - zw}
      end
    end
  end
end
local s = read_lock(h)
local fr = fv and parse_share(from, fv)
if not (fr and fr.held and fr.x > now) then
  -- Only a live share is handed on: a late copy of this call after from's
  -- release must not admit to. A copy sent again after a lost connection,
  -- whose first copy handed the share, finds to's grant: the same grant.
  if s.r == from then
    local tv = redis.call('HGET', sk, to)
    local tr = tv and parse_share(to, tv)
    if tr and tr.held and tr.x > now then return regrant_share(h, sk, s, to, tv, now, ttl, keep) end
  end
  return {0, 0}
end
local o = holder(s, now)
redis.call('HDEL', sk, from)
local d, _, latest, res, held_w = decide_shares(sk, to, 2, w, lim, now, o, o and holder_fence(s))
if d == 'held' and o ~= to then
  -- to's own attempt was granted meanwhile: that grant, counted from now;
  -- from's share is released as by a release (recorded, so that a copy of
  -- this call finds the grant), which tells the channel.
  if s.e ~= 0 then redis.call('HSET', h, 'r', from) end
  wake_waiters(s.w, now, ARGV[8])
  return regrant_share(h, sk, s, to, redis.call('HGET', sk, to), now, ttl, keep)
end
if d == 'grant' then
  local f = next_fence(s, us)
  local x = now + ttl
  redis.call('HSET', sk, to, share_entry({ held = true, m = 2, w = w, l = lim, ord = f, x = x, label = label }))
  if x > latest then latest = x end
  if #res == 0 then
    -- Every entry read, no reservation left: the stamp (common.lua).
    redis.call('PEXPIREAT', sk, int(write(h, s, x, keep, 'f', int(f), 'sx', int(latest), 'r', from,
                                          'zf', int(f), 'zw', int(held_w + w))))
  else
    redis.call('PEXPIREAT', sk, int(write(h, s, x, keep, 'f', int(f), 'sx', int(latest), 'r', from)))
  end
  -- A release tells the channel; a hand-over only when the first
  -- reservation in line (another request's) fits beside the shares now
  -- held, as its own attempt would be admitted: requests behind it count
  -- it ahead of them, and a writer fits only when no share is held. Else a
  -- waiter woken here would only be refused.
  local head, spare = nil, lim - held_w - w
  for i = 1, #res, 3 do
    if head == nil or res[i] < res[head] then head = i end
    if res[i + 1] == '2' then spare = spare - res[i + 2] else spare = -1 - lim end
  end
  if head and res[head + 1] == '2' and held_w + w + res[head + 2] <= lim then wake_waiters(s.w, now, ARGV[8]) end
  if spare < 0 then spare = -1 end
  return {1, f, spare}
end
-- Not admitted: from's release as release.lua makes it.
if s.e ~= 0 then redis.call('HSET', h, 'sx', int(latest), 'r', from) end
wake_waiters(s.w, now, ARGV[8])
return {0, 1}
