-- Shrinks a held lease in place (Backend::shrink). KEYS: H, S.
-- ARGV: token, weight, limit, fence_keep_ms, lock channel.
-- Returns 1 shrunk, 0 the token holds no live lease (nothing changes), -1
-- the weight or limit asked for is not smaller (nothing changes).
-- The exclusive grant in H becomes a held share of weight 1 under limit in
-- S, with its fence (holder_fence) and expiry, in this one script: no
-- request runs between the two, so no writer is granted in between. A share
-- takes the smaller weight and keeps its limit. Either way the lock's
-- channel is told, as by a release: waiters that now fit may be admitted.
local h, sk = KEYS[1], KEYS[2]
local token, w, lim, keep, chan = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local s = read_lock(h)
local now = math.floor(now_us() / 1000)
if holder(s, now) == token then
  if w ~= 1 or lim < 1 then return -1 end
  redis.call('HSET', sk, token, share_entry({ held = true, m = 2, w = 1, l = lim, ord = holder_fence(s), x = s.x,
                                              label = s.l or '' }))
  local sx = s.sx
  if s.x > sx then sx = s.x end
  -- H no longer names a holder (x 0); f, the lock's last fence, stays, and
  -- sx covers the share, as a share's grant writes it.
  redis.call('PEXPIREAT', sk, int(write(h, s, s.x, keep, 'x', '0', 'sx', int(sx))))
  wake_waiters(s.w, now, chan)
  return 1
end
local v = redis.call('HGET', sk, token)
local r = v and parse_share(token, v)
if not (r and r.held and r.x > now) then return 0 end
if r.m ~= 2 then
  -- A writer's held entry: exclusive, so it shrinks as H's grant does.
  if w ~= 1 or lim < 1 then return -1 end
  r.m, r.l = 2, lim
elseif w >= 1 and w < r.w then
  r.w = w
else
  return -1
end
redis.call('HSET', sk, token, share_entry(r))
wake_waiters(s.w, now, chan)
return 1
