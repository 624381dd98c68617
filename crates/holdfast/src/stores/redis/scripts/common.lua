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
--   S = {PREFIX:KEY}:s  hash: token -> "held mode weight limit order expiry_ms label" of each
--       shared lease (held 1) and each waiting request's reservation (held 0);
--       mode 0 exclusive, 1 writer, 2 shared; order = a held lease's fence or a
--       reservation's place. H's field sx = the latest expiry of a held
--       shared lease, so an exclusive acquire sees shares in the one HMGET
--       it already makes.
--       w = until when (server ms) a non-fair waiter may wait on the lock's
--           channel: a release publishes there only before then.
--       q = 1 once a fair waiter queued (Q may be non-empty); without it, and
--           with H present, Q is empty and no script reads it.
--       hf = "token fence": the fence of the exclusive grant of token, kept
--           when a waiting reservation's place moves f past it while that
--           grant is held; it counts only while o is that token (see
--           holder_fence), so no grant needs to clear it. A raised floor
--           clears it: the raise is the grant's fence from then on.
--       hn = "token count": the grant the last hand-over made (hand_over.lua)
--           and how many hand-overs in a row led to it; it counts only
--           while its token releases, so no other grant needs to clear it.
--       zf, zw = the stamp (holdfast-models' share_handover): written by a
--           share's grant that read every entry of S and left no
--           reservation, zf = f after it, zw = the weight of S's entries.
--           While f is still zf, S holds no reservation and weighs at most
--           zw: every script, of any version, that writes an entry of S
--           draws a place or a fence from f first (the admin script and
--           a share's shrink rewrite entries in place, never adding
--           weight; shrink turns a live exclusive grant into an entry, and
--           that grant, made while no share was held, moved f after any
--           stamp), and removals only lower the weight.
--           share_hand_over.lua grants by it without reading S. Nothing
--           else reads it; an older client never writes it.
-- Time comes only from the server (TIME), never from a client.
-- Numbers go to redis.call as text made by int(): Redis would write a Lua
-- number exactly too (%.17g), but measured slower (0.3 us a number).

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function int(n)
  return string.format('%d', n)
end

-- The lock's state, in one read (the hot paths in acquire.lua and release.lua
-- read only the fields they use, into locals: each field read costs the
-- server about 0.15 us, as much as a whole EXISTS).
local function read_lock(h)
  local v = redis.call('HMGET', h, 'o', 'f', 'x', 'e', 'r', 'l', 'sx', 'w', 'q', 'hf', 'zf', 'zw')
  return { o = v[1], f = tonumber(v[2] or '0') or 0, x = tonumber(v[3] or '0') or 0,
           e = tonumber(v[4] or '0') or 0, r = v[5], l = v[6], sx = tonumber(v[7] or '0') or 0,
           w = tonumber(v[8] or '0') or 0, q = v[9] == '1', hf = v[10],
           zf = tonumber(v[11] or '-1') or -1, zw = tonumber(v[12] or '0') or 0 }
end

-- The fence of the exclusive grant in H (s: the lock as read): f, unless f
-- moved past it while it was held (hf).
local function holder_fence(s)
  if s.hf and s.o then
    local t, f = string.match(s.hf, '^(%S+) (%d+)$')
    if t == s.o then return tonumber(f) end
  end
  return s.f
end

-- Keeps the fence of the exclusive grant held in H before f moves past it.
local function keep_holder_fence(h, s, now_ms)
  if s.o and s.x > now_ms and holder_fence(s) == s.f then
    s.hf = s.o .. ' ' .. int(s.f)
    redis.call('HSET', h, 'hf', s.hf)
  end
end

-- Marks that a non-fair waiter waits on the lock's channel for up to
-- horizon_ms (the client's longest sleep between attempts, with a margin),
-- so that releases until then publish. Written again only once half of it
-- has passed. Only on an existing H, which always has an expiry (a refused
-- attempt always finds H: a holder, shares, or queued waiters wrote it).
-- e and w: H's fields of those names (0 when absent).
local function mark_waiter(h, e, w, now_ms, horizon_ms)
  if horizon_ms > 0 and e ~= 0 and w < now_ms + horizon_ms / 2 then
    redis.call('HSET', h, 'w', int(now_ms + horizon_ms))
  end
end

-- Tells the lock's channel that the lock may be free, if a waiter is marked
-- (w: H's field w).
local function wake_waiters(w, now_ms, chan)
  if w > now_ms then redis.call('PUBLISH', chan, '') end
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
local function fence_after(f, us)
  if f >= us then return f + 1 end
  return us
end

-- The same, for the lock as read (s).
local function next_fence(s, us)
  return fence_after(s.f, us)
end

-- Writes the field/value pairs into H and keeps H alive until at least keep_ms
-- past lease_end, so the lock's fence outlives the lease. The expiry moves in
-- steps of half a keep period beyond that, so most renewals need no PEXPIREAT.
local function write(h, s, lease_end, keep_ms, ...)
  local at = s.e
  if at < lease_end + keep_ms then
    at = lease_end + keep_ms + math.floor(keep_ms / 2)
    redis.call('HSET', h, 'e', int(at), ...)
    redis.call('PEXPIREAT', h, int(at))
  else
    redis.call('HSET', h, ...)
  end
  s.e = at
  return at
end

-- One entry of S, parsed (t = its token).
local function parse_share(t, v)
  local held, m, w, l, ord, x, label = string.match(v, '^(%d) (%d) (%d+) (%d+) (%d+) (%d+) (.*)$')
  if not held then return nil end
  return { t = t, held = held == '1', m = tonumber(m), w = tonumber(w), l = tonumber(l),
           ord = tonumber(ord), x = tonumber(x), label = label }
end

-- Whether token holds a live lease of the lock at server time now_ms: the
-- exclusive grant in H (state s), or a held entry in S (sk); with
-- exclusive_only, a writer's entry only (mode 2 is a shared lease). The one
-- holder check of the scripts that act only for a holder.
local function holds(s, sk, token, now_ms, exclusive_only)
  if holder(s, now_ms) == token then return true end
  local v = redis.call('HGET', sk, token)
  local r = v and parse_share(token, v)
  if not (r and r.held and r.x > now_ms) then return false end
  return not exclusive_only or r.m ~= 2
end

local function share_entry(r)
  return (r.held and '1' or '0') .. ' ' .. int(r.m) .. ' ' .. int(r.w) .. ' ' .. int(r.l) .. ' ' ..
         int(r.ord) .. ' ' .. int(r.x) .. ' ' .. r.label
end

-- The unexpired entries of S (expired ones are deleted), and the latest
-- expiry of a held one (0 if none).
local function read_shares(sk, now_ms)
  local rows, latest = {}, 0
  local kv = redis.call('HGETALL', sk)
  for i = 1, #kv, 2 do
    local r = parse_share(kv[i], kv[i + 1])
    if r and r.x > now_ms then
      rows[#rows + 1] = r
      if r.held and r.x > latest then latest = r.x end
    else
      redis.call('HDEL', sk, kv[i])
    end
  end
  return rows, latest
end

-- The latest expiry of a held entry of S (0 if none), deleting expired
-- entries: read_shares' second result, for a share's release, reading only
-- the two fields it needs (one pattern, no table an entry).
local function latest_share(sk, now_ms)
  local latest = 0
  local kv = redis.call('HGETALL', sk)
  for i = 1, #kv, 2 do
    local held, x = string.match(kv[i + 1], '^(%d) %d %d+ %d+ %d+ (%d+) ')
    x = tonumber(x)
    if not (x and x > now_ms) then
      redis.call('HDEL', sk, kv[i])
    elseif held == '1' and x > latest then
      latest = x
    end
  end
  return latest
end

-- The admission rule of the lease model (holdfast's backend/admission.rs,
-- the same rule) over the unexpired entries of S, read straight off S in one
-- pass for the share and writer acquire (shared_acquire.lua): no table an
-- entry and no label (a full parse cost the server 1.8 us an entry, over
-- every held share and reservation, measured for issue 33; this one about
-- 0.6). o, ofence: the exclusive holder in H and its fence, or nil (a held
-- exclusive lease, looked at after S's entries). Deletes expired entries as
-- read_shares does. Returns 'held', fence | 'grant' | 'refuse', own place or
-- nil | 'conflict', the other limit; the latest expiry of a held entry (0
-- if none); the others' reservations (place, mode, weight, flat, in no
-- order); and the weight of the others' held shares.
local function decide_shares(sk, token, m, w, lim, now_ms, o, ofence)
  local kv = redis.call('HGETALL', sk)
  local latest, own, own_held, conflict = 0, nil, nil, nil
  local blocked = o ~= nil and o ~= token -- another's lease that excludes shares
  local other_held, held_w = blocked, 0
  local res = {} -- others' reservations: place, mode, weight
  for i = 1, #kv, 2 do
    local t = kv[i]
    local held, rm, rw, rl, ord, x = string.match(kv[i + 1], '^(%d) (%d) (%d+) (%d+) (%d+) (%d+) ')
    x = tonumber(x)
    if not (x and x > now_ms) then
      redis.call('HDEL', sk, t)
    elseif t == token then
      if held == '1' then
        own_held = tonumber(ord)
        if x > latest then latest = x end
      else
        own = tonumber(ord)
      end
    else
      if rm == '2' and not conflict and tonumber(rl) ~= lim then conflict = tonumber(rl) end
      if held == '1' then
        if x > latest then latest = x end
        other_held = true
        if rm == '2' then held_w = held_w + tonumber(rw) else blocked = true end
      else
        res[#res + 1] = tonumber(ord)
        res[#res + 1] = rm
        res[#res + 1] = tonumber(rw)
      end
    end
  end
  local taken = w + held_w
  if own_held then return 'held', own_held, latest, res, held_w end
  if o ~= nil and o == token then return 'held', ofence, latest, res, held_w end
  if m ~= 2 then
    if other_held then return 'refuse', own, latest, res, held_w end
    return 'grant', nil, latest, res, held_w
  end
  if conflict then return 'conflict', conflict, latest, res, held_w end
  if blocked then return 'refuse', own, latest, res, held_w end
  for i = 1, #res, 3 do
    if own == nil or res[i] < own then
      if res[i + 1] == '2' then
        taken = taken + res[i + 2]
      elseif res[i + 1] == '1' then
        return 'refuse', own, latest, res, held_w
      end
    end
  end
  if taken <= lim then return 'grant', nil, latest, res, held_w end
  return 'refuse', own, latest, res, held_w
end

-- A retry by a share's holder (its reply was lost, or a hand-over found
-- its own grant): its entry whole, its lease counted from now (the client
-- counts it from before the call was sent). v: the entry as read.
local function regrant_share(h, sk, s, token, v, now_ms, ttl_ms, keep_ms)
  local r = parse_share(token, v)
  r.x = now_ms + ttl_ms
  redis.call('HSET', sk, token, share_entry(r))
  local sx = s.sx
  if r.x > sx then sx = r.x end
  redis.call('PEXPIREAT', sk, int(write(h, s, r.x, keep_ms, 'sx', int(sx))))
  return {1, r.ord}
end

-- A retry by the token that holds the lock (its reply was lost, or it was
-- handed the lock with a short claim window): the same grant, its lease
-- counted from now, as the client counts it from the retry.
local function regrant(h, s, now_ms, ttl_ms, keep_ms)
  write(h, s, now_ms + ttl_ms, keep_ms, 'x', int(now_ms + ttl_ms))
  return {1, holder_fence(s)}
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

-- Hands the lock to head, the live waiter at the head of Q (s: the lock as
-- read, us: the server clock in microseconds): pops it, makes it the owner
-- with a new fence and a lease of its claim window (its entry's remaining
-- life, at least 100 ms and at most its TTL; so the lease ends no earlier
-- than its entry would have), and tells its client. A client whose id ends
-- in '.f' is told the fence too, and counts itself granted from the message
-- without claiming, for as long as its last queued refresh vouches for
-- (acquire_fair in mod.rs; the design was model-checked, holdfast-models'
-- fair_handoff); other clients are told the token alone and claim with a
-- fair acquire. ...: more field/value pairs to write into H.
local function hand_to_head(h, q, e, s, head, now, us, keep, cprefix, ...)
  local exp, ttl, client, label = parse_entry(redis.call('HGET', e, head))
  redis.call('LPOP', q)
  redis.call('HDEL', e, head)
  local claim = exp - now
  if claim < 100 then claim = 100 end
  if claim > ttl then claim = ttl end
  local f = next_fence(s, us)
  write(h, s, now + claim, keep, 'o', head, 'f', int(f), 'l', label, 'x', int(now + claim), ...)
  local message = head
  if string.sub(client, -2) == '.f' then message = head .. ' ' .. int(f) end
  redis.call('PUBLISH', cprefix .. client, message)
end
