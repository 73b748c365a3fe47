-- cap_ops.lua: what happens to a concurrency cap besides decisions (it includes common.lua, with no
-- rules, and cap.lua; see there for KEYS[3..8] and the extra ARGV). ARGV[2] is the operation:
--
-- release  give up `holder`'s slot: its token must match (or, with token '', its info: the
--          worker's main process releasing for a pool process that died); the oldest waiter
--          gets it; a copy of it that waits is dropped (it ran). Returns {1 (released) | 0
--          (not held: lapsed or taken over), 0, ...}
-- renew    extend `holder`'s lease if its token matches. Returns {1 | 0, until_ms}
-- wait     queue `holder` with `message` unless a slot is free for it now; a lapsed hand-over
--          goes back to its place; a copy of a running holder waits behind it. Returns
--          {'queued' | 'room' | 'mine' | 'done', position (0-based; 0 behind its holder), ...}
-- cancel   `holder` is gone (a process that stops waiting; a task revoked, expired or
--          unreadable): out of the line, a slot handed to it passed on, its lapsed hand-over
--          or its copy behind a running holder forgotten; a running holder's own slot is never
--          touched. Returns {where it was: 'waiting' | 'handed' | 'lapsed' | 'copy' | '', the
--          message it left ('' = none), ...}
-- sweep    remove lapsed holders and hand their slots over. Returns {the next moment a sweep
--          could matter (ms: the earliest lease, while anyone waits in line, behind a running
--          holder or for a pending hand-over; 0: nobody does), 0, ...}
-- lapsed   the oldest 100 lapsed hand-overs. Returns {now_ms, id, lapsed_ms, id, lapsed_ms...}
-- usage    {now_ms, limit, waiting, then per holder: id, until_ms, entry} (the oldest first)
-- "..." is now_ms, then (id, message) pairs of waiters handed a slot: the caller publishes them.
-- @include common
-- @include cap
local out = {}
local function reply(a, b)
  local r = {a, b, now_ms}
  for i = 1, #out do r[#r + 1] = out[i] end
  return r
end

if op == 'usage' then
  local r = {now_ms, cap_limit, redis.call('ZCARD', WK)}
  local held = redis.call('ZRANGE', HK, '0', '-1', 'WITHSCORES')
  for i = 1, #held, 2 do
    r[#r + 1] = held[i]
    r[#r + 1] = held[i + 1]
    r[#r + 1] = redis.call('HGET', XK, 'h' .. held[i]) or ''
  end
  return r
end

if op == 'lapsed' then
  local r = {now_ms}
  local lapsed = redis.call('ZRANGE', LK, '0', '99', 'WITHSCORES')
  for i = 1, #lapsed do r[#r + 1] = lapsed[i] end
  return r
end

if op == 'renew' then
  local e = entry(holder)
  if not e or e.token ~= token or not redis.call('ZSCORE', HK, holder) then return {0, 0} end
  redis.call('ZADD', HK, expires, holder)
  finish()
  return {1, now_ms + lease_ms}
end

if op == 'release' then
  local given = give_back(holder, token, info)
  sweep(out)
  finish()
  return reply(given and 1 or 0, 0)
end

if op == 'wait' then
  sweep(out)
  local why, wait, e = verdict(false)
  if why == 'full' then
    if e and e.flags == 'l' then  -- its hand-over lapsed: back to its place in line
      redis.call('ZREM', LK, holder)
      redis.call('HDEL', XK, 'h' .. holder, 'p' .. holder)
      busy('ZADD', WK, e.n, holder)
    elseif not redis.call('ZSCORE', WK, holder) then
      busy('ZADD', WK, redis.call('HINCRBY', XK, 'seq', 1), holder)
    end
    redis.call('HSET', XK, 'w' .. holder, message)
    why, wait = 'queued', redis.call('ZRANK', WK, holder)
  elseif why == 'copy' then  -- behind its running copy: handed its slot if that one dies
    put(holder, e.token, e.since, e.n, 'u', e.info)
    redis.call('HSET', XK, 'p' .. holder, message)
    busy('ZADD', KK, now_ms, holder)
    why, wait = 'queued', 0
  end
  if why == 'queued' then
    redis.call('HSET', XK, 'cfg', fmt(cap_limit) .. ' ' .. fmt(lease_ms))
  end
  finish()
  return reply(why, wait)
end

if op == 'cancel' then
  local where, left = '', nil
  if redis.call('ZREM', WK, holder) == 1 then
    where, left = 'waiting', redis.call('HGET', XK, 'w' .. holder)
  end
  redis.call('HDEL', XK, 'w' .. holder)
  local e = entry(holder)
  if e and e.flags == 'p' then  -- handed a slot it never took: pass it on
    where, left = 'handed', redis.call('HGET', XK, 'p' .. holder)
    drop(holder)
  elseif e and e.flags == 'l' then
    where, left = 'lapsed', redis.call('HGET', XK, 'p' .. holder)
    redis.call('ZREM', LK, holder)
    redis.call('HDEL', XK, 'h' .. holder, 'p' .. holder)
  elseif e and e.flags == 'u' then  -- the copy behind it is gone; the holder runs on
    where, left = 'copy', redis.call('HGET', XK, 'p' .. holder)
    redis.call('ZREM', KK, holder)
    redis.call('HDEL', XK, 'p' .. holder)
    put(holder, e.token, e.since, e.n, 'c', e.info)
  end
  sweep(out)
  finish()
  return reply(where, left or '')
end

if op == 'sweep' then
  sweep(out)
  finish()
  local next_ms = 0
  if redis.call('ZCARD', WK) > 0 or redis.call('ZCARD', KK) > 0 then
    next_ms = tonumber(redis.call('ZRANGE', HK, '0', '0', 'WITHSCORES')[2] or now_ms)
  end
  return reply(next_ms, 0)
end

return error('governor: unknown concurrency operation ' .. tostring(op))
