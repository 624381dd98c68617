-- Release by token, and removal of the token's queue entry (a cancelled waiter).
-- KEYS: H, and in a cluster Q, E and S (elsewhere the script names them
-- H:q, H:e and H:s itself: one hash tag; each key of a call cost the server
-- about 0.25 us; see hot_path_keys in keys.rs).
-- ARGV: token, fence_keep_ms, lock channel, client channel prefix.
-- Returns 1 if the token held the lock (or a shared lease or reservation of
-- it), 2 if the token is the lock's last releaser (this is a repeat: the
-- client counts it as released only if the call itself re-sent its request,
-- whose first copy may have been that release), else 0.
-- When fair waiters are queued, the lock goes straight to the live head waiter
-- (hand_to_head) and only that waiter's client is told; otherwise the lock channel is told, once, if
-- a non-fair waiter marked the lock (see mark_waiter).
local h, token = KEYS[1], ARGV[1]
local v = redis.call('HMGET', h, 'o', 'x', 'q', 'w')
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local w = tonumber(v[4] or '0') or 0
-- Whether the token holds the exclusive lease (holder() on the fields read).
local holds = v[1] == token and (tonumber(v[2] or '0') or 0) > now
if holds and v[3] ~= '1' then
  -- The hot path (a holder's release, no fair waiter queued), like acquire's:
  -- the fields it uses, straight-line. H already lives until keep_ms past
  -- the lease's end, which is later than now.
  redis.call('HSET', h, 'x', '0', 'r', token)
  if w > now then redis.call('PUBLISH', ARGV[3], '') end
  return 1
end
local q, e, sk = KEYS[2] or h .. ':q', KEYS[3] or h .. ':e', KEYS[4] or h .. ':s'
local keep, chan, cprefix = tonumber(ARGV[2]), ARGV[3], ARGV[4]
if not holds then
  -- Not the exclusive holder: a shared lease or a reservation, gone, and
  -- the lock's channel told (a release, or a writer that stopped waiting,
  -- may admit waiters). Read off the fields the first HMGET took, its own
  -- entry and H's expiry, not the whole lock: a share's release is every
  -- permit's and read lease's (the whole read and its parse cost the server
  -- about 4 us of a read lease's cycle, measured on 2026-12-02).
  local sv = redis.call('HGET', sk, token)
  if sv then
    redis.call('HDEL', sk, token)
    local held, x = string.match(sv, '^(%d) %d %d+ %d+ %d+ (%d+) ')
    if held == '1' and (tonumber(redis.call('HGET', h, 'e') or '0') or 0) ~= 0 then
      local latest = latest_share(sk, now)
      redis.call('HSET', h, 'sx', int(latest), 'r', token)
    end
    wake_waiters(w, now, chan)
    if held == '1' and tonumber(x) > now then return 1 end
    return 0
  end
end
local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local s = read_lock(h)
local o = holder(s, now)
if o ~= token then
  -- Not the holder: maybe a cancelled fair waiter (the owner is never queued).
  if redis.call('HDEL', e, token) == 1 then
    redis.call('LREM', q, 1, token)
    if not o then
      -- The lock is free (its holder expired) and this waiter may have been the
      -- head: let the new head know.
      local head = purge(q, e, now)
      if head then
        local _, _, client = parse_entry(redis.call('HGET', e, head))
        redis.call('PUBLISH', cprefix .. client, head)
      end
    end
  end
  if s.r == token then return 2 end
  return 0
end
-- The holder's release with fair waiters maybe queued (q).
local head = purge(q, e, now)
if head then
  hand_to_head(h, q, e, s, head, now, us, keep, cprefix, 'r', token)
  return 1
end
-- The queue was found empty: later calls need not read it.
redis.call('HSET', h, 'x', '0', 'r', token, 'q', '0')
wake_waiters(s.w, now, chan)
return 1
