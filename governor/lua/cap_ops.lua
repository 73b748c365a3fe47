-- cap_ops.lua: what happens to a concurrency cap besides decisions (after common.lua, with no
-- rules, and cap.lua; see there for KEYS[3..6] and the extra ARGV). ARGV[2] is the operation:
--
-- release  give up `holder`'s slot: its token must match (or, with token '', its info: the
--          worker's main process releasing for a pool process that died); the oldest waiter
--          gets it. Returns {1 (released) | 0 (not held: lapsed or taken over), 0, ...}
-- renew    extend `holder`'s lease if its token matches. Returns {1 | 0, until_ms}
-- wait     queue `holder` with `message` unless a slot is free for it now. Returns {'queued'
--          | 'room' | 'mine' | 'copy' | 'done', position (0-based) or wait estimate (us), ...}
-- cancel   leave the queue (a slot handed over meanwhile is passed on). Returns {1 | 0, 0, ...}
-- sweep    remove lapsed holders and hand their slots over. Returns {the next moment a sweep
--          could matter (ms: the earliest lease, while anyone waits; 0: nobody waits), 0, ...}
-- usage    {now_ms, limit, waiting, then per holder: id, until_ms, entry} (the oldest first)
-- "..." is now_ms, then (id, message) pairs of waiters handed a slot: the caller publishes them.
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

if op == 'renew' then
  local e = entry(holder)
  if not e or e.token ~= token or not redis.call('ZSCORE', HK, holder) then return {0, 0} end
  redis.call('ZADD', HK, expires, holder)
  finish()
  return {1, now_ms + lease_ms}
end

if op == 'release' then
  local e = entry(holder)
  if not e or e.flags == 'p' or (token ~= '' and e.token ~= token)
    or (token == '' and e.info ~= info) then
    sweep(out)
    finish()
    return reply(0, 0)
  end
  drop(holder)
  if e.flags == 'c' then  -- a copy of it is waiting: it must not run once this one is done
    redis.call('ZREMRANGEBYSCORE', DK, '-inf', fmt(now_ms))
    redis.call('ZADD', DK, fmt(now_ms + 2 * lease_ms), holder)
    redis.call('PEXPIRE', DK, ttl_ms(2 * lease_ms * 1000))
  end
  sweep(out)
  finish()
  return reply(1, 0)
end

if op == 'wait' then
  sweep(out)
  local why, wait, e = verdict(false)
  if why == 'full' then
    if not redis.call('ZSCORE', WK, holder) then
      redis.call('ZADD', WK, redis.call('HINCRBY', XK, 'seq', 1), holder)
    end
    redis.call('HSET', XK, 'w' .. holder, message, 'cfg', fmt(cap_limit) .. ' ' .. fmt(lease_ms))
    why, wait = 'queued', redis.call('ZRANK', WK, holder)
  elseif why == 'copy' then
    put(holder, e.token, e.since, e.fence, 'c', e.info)
  end
  finish()
  return reply(why, wait)
end

if op == 'cancel' then
  local gone = redis.call('ZREM', WK, holder)
  redis.call('HDEL', XK, 'w' .. holder)
  local e = entry(holder)
  if gone == 0 and e and e.flags == 'p' then  -- handed a slot meanwhile: pass it on
    drop(holder)
    gone = 1
  end
  sweep(out)
  finish()
  return reply(gone, 0)
end

if op == 'sweep' then
  sweep(out)
  finish()
  local next_ms = 0
  if redis.call('ZCARD', WK) > 0 then
    next_ms = tonumber(redis.call('ZRANGE', HK, '0', '0', 'WITHSCORES')[2] or now_ms)
  end
  return reply(next_ms, 0)
end

return error('governor: unknown concurrency operation ' .. tostring(op))
