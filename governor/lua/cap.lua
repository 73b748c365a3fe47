-- cap.lua: a concurrency cap over one subject: at most `limit` holders at once. Included by
-- the capped decision script (cap_decide.lua) and the cap's own operations (cap_ops.lua).
--
-- A slot is a lease held by a holder id (a Celery task: "<task id>:<retries>"), not a count:
-- a holder that stops renewing loses it when its lease lapses, and every script that runs on
-- the cap removes lapsed holders first. Waiters queue in arrival order; whatever frees a slot
-- hands it to the oldest waiter at once (it becomes a holder, pending until it starts).
--
-- A waiter's message is published once, when it is handed a slot, and never again by a sweep:
-- a hand-over whose holder does not start within one lease (its message is late, lost,
-- revoked, expired or unreadable) lapses, and the slot goes on. The lapsed waiter keeps its
-- message and its place in line here: when its message does arrive, it takes a free slot or
-- goes back to the head of the line. A copy that arrives while its holder runs waits here too
-- (not in the broker): it is dropped when the holder releases, and handed the slot if the
-- holder's lease lapses. So at most one copy of a holder's message is ever out at a time.
--
-- KEYS[3]  ZSET holders: holder id -> lease expiry (ms): running, or pending a hand-over
-- KEYS[4]  HASH: "h<id>" -> "<token> <since_ms> <n> <flags> <info>" per holder; flags: '-'
--          running, 'c' running and a copy of it asked, 'u' running and a copy of it waits
--          (its message in "p<id>"), 'p' handed over and not started (its message, if any, in
--          "p<id>"), 'l' a hand-over that lapsed (not a holder; its message in "p<id>");
--          n is the fencing token of a running holder, the place in line of the others;
--          "w<id>" -> a waiter's message ("" for a waiting process, woken by KEYS[3]'s
--          "...:cq:<id>" list); "fence" -> the last fencing token; "seq" -> the last place in
--          line; "cfg" -> "<limit> <lease_ms>" (for sweeps, which are not told them)
-- KEYS[5]  ZSET waiters: id -> place in line (oldest first)
-- KEYS[6]  ZSET done: id -> until (ms): holders that finished while a copy of them asked
-- KEYS[7]  ZSET kept: id -> since (ms): holders with a message in "p<id>" ('p', 'u'), which a
--          sweep must look at when their lease ends
-- KEYS[8]  ZSET lapsed: id -> when its hand-over lapsed (ms)
-- ARGV     the decision's (common.lua), then six more: limit ('' = from cfg), lease_us,
--          holder id, token, info (free text for operators), message ('' = none; for an
--          acquire of cap_decide.lua: "<holder id> <token>" of a slot to give back first)
-- Returns  nothing itself (the helpers of cap_decide.lua and cap_ops.lua: see their replies)
-- @include common
local cap_at = #ARGV - 5
local HK, XK, WK, DK, KK, LK = KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local holder, token, info, message =
  ARGV[cap_at + 2], ARGV[cap_at + 3], ARGV[cap_at + 4], ARGV[cap_at + 5]
local cap_limit, lease_ms = tonumber(ARGV[cap_at]), ceil(tonumber(ARGV[cap_at + 1]) / 1000)
if not cap_limit then
  local cfg = redis.call('HGET', XK, 'cfg')
  local l, m = string.match(cfg or '', '^(%d+) (%d+)$')
  cap_limit, lease_ms = tonumber(l) or 0, tonumber(m) or lease_ms
end
local now_ms = math.floor(now / 1000)
local expires = fmt(now_ms + lease_ms)
-- A holder a copy asked about while it ran is refused as done this long after it released (a
-- copy that asked waits in Redis, and a waiting process asks again within a lease).
local done_ms = 2 * lease_ms
-- Quiet: nobody waits, no copy asked, no message is kept, no hand-over lapsed (the four ZSETs
-- are absent: Redis deletes an empty one), the usual state of a cap with room. The reads that
-- only matter otherwise are skipped while it lasts; whatever writes one of them ends it (`busy`).
local quiet = redis.call('EXISTS', WK, DK, KK, LK) == 0
local function busy(cmd, key, ...)
  quiet = false
  return redis.call(cmd, key, ...)
end

-- A holder's entry: token, since, n, flags, info; or nil.
local function entry(id)
  local v = redis.call('HGET', XK, 'h' .. id)
  if not v then return nil end
  local t, s, n, fl, rest = string.match(v, '^(%S+) (%-?%d+) (%d+) (%S) (.*)$')
  if not t then return error('governor: corrupt concurrency holder at ' .. XK) end
  return {token = t, since = s, n = n, flags = fl, info = rest}
end

local function put(id, t, since, n, flags, text)
  redis.call('HSET', XK, 'h' .. id, t .. ' ' .. since .. ' ' .. n .. ' ' .. flags .. ' ' .. text)
end

-- Forget a holder (running or pending) and the message kept for it.
local function drop(id)
  redis.call('ZREM', HK, id)
  if not quiet then redis.call('ZREM', KK, id) end
  redis.call('HDEL', XK, 'h' .. id, 'p' .. id)
end

local function wake(id)
  local key = string.sub(HK, 1, -3) .. 'cq:' .. id
  redis.call('RPUSH', key, '1')
  redis.call('PEXPIRE', key, ttl_ms(lease_ms * 1000))
end

-- Hand a slot to `id` (its place in line: n), pending until it starts: a message goes into
-- `out` (id, message) for the caller to publish, a waiting process ("") is woken.
local function hand(id, msg, n, out)
  redis.call('ZADD', HK, expires, id)
  put(id, '-', now_ms, n, 'p', 'handed over')
  if msg == '' then
    redis.call('ZREM', KK, id)
    redis.call('HDEL', XK, 'p' .. id)
    wake(id)
  else
    busy('ZADD', KK, now_ms, id)
    redis.call('HSET', XK, 'p' .. id, msg)
    out[#out + 1] = id
    out[#out + 1] = msg
  end
end

-- Hand free slots to the oldest waiters.
local function hand_over(out)
  local room = cap_limit - redis.call('ZCARD', HK)
  while room > 0 do
    local first = redis.call('ZRANGE', WK, '0', '0', 'WITHSCORES')
    local id = first[1]
    if not id then return end
    redis.call('ZREM', WK, id)
    local msg = redis.call('HGET', XK, 'w' .. id)
    if msg then
      redis.call('HDEL', XK, 'w' .. id)
      hand(id, msg, first[2], out)
      room = room - 1
    end
  end
end

-- A pending hand-over that will not be started now: the slot is given up. A waiter with a
-- message keeps it, and its place, until that message arrives (or it leaves); a waiting
-- process is forgotten (it asks, and queues, again).
local function lapse(id, e)
  local msg = redis.call('HGET', XK, 'p' .. id)
  redis.call('ZREM', HK, id)
  if not quiet then redis.call('ZREM', KK, id) end
  if msg then
    put(id, '-', now_ms, e.n, 'l', 'lapsed')
    busy('ZADD', LK, now_ms, id)
  else
    redis.call('HDEL', XK, 'h' .. id)
  end
end

-- Remove holders whose lease lapsed: a pending hand-over lapses, a holder that died leaves
-- its slot to the copy of it that waits (if one does); then fill free slots from the line.
local function sweep(out)
  local lapsed = redis.call('ZRANGEBYSCORE', HK, '-inf', fmt(now_ms), 'LIMIT', '0', '100')
  for _, id in ipairs(lapsed) do
    local e = entry(id)
    if e and e.flags == 'p' then
      lapse(id, e)
    elseif e and e.flags == 'u' then
      hand(id, redis.call('HGET', XK, 'p' .. id) or '', '0', out)
    else
      drop(id)
    end
  end
  if quiet then return end
  redis.call('ZREMRANGEBYSCORE', DK, '-inf', fmt(now_ms))
  if redis.call('ZCARD', WK) > 0 then hand_over(out) end
end

-- Give back `id`'s slot if `tok` is its token ('' = any, if `inf` is its info): it must be
-- running (not a pending or lapsed hand-over). A copy of it that asked or waits must not run
-- now that it ran: it is marked done (a waiting process is woken to hear it). True if given.
local function give_back(id, tok, inf)
  local e = entry(id)
  if not e or e.flags == 'p' or e.flags == 'l' or (tok ~= '' and e.token ~= tok)
    or (tok == '' and e.info ~= inf) then
    return false
  end
  local copy = e.flags == 'u' and redis.call('HGET', XK, 'p' .. id)
  drop(id)
  if e.flags ~= '-' then
    busy('ZADD', DK, fmt(now_ms + done_ms), id)
    redis.call('PEXPIRE', DK, ttl_ms(done_ms * 1000))
    if copy == '' then wake(id) end
  end
  return true
end

-- The wait until a slot could free (us): the earliest lease's end.
local function estimate()
  local first = redis.call('ZRANGE', HK, '0', '0', 'WITHSCORES')[2]
  return first and max(0, (tonumber(first) - now_ms) * 1000) or lease_ms * 1000
end

-- Whether `holder` may take a slot: 'room', 'mine' (handed over to it), 'full', 'copy' (a live
-- copy of it holds one), 'done' (it finished while a copy asked); the wait until a lease
-- lapses (us: an estimate of a slot's freeing); its entry. A lapsed hand-over comes first.
local function verdict(live_only)
  local until_ms = not quiet and tonumber(redis.call('ZSCORE', DK, holder))
  if until_ms and until_ms > now_ms then return 'done', -1 end
  local held = live_only and redis.call('ZCOUNT', HK, '(' .. fmt(now_ms), '+inf')
    or redis.call('ZCARD', HK)
  local e = entry(holder)
  if e and e.flags == 'p' then return 'mine', 0, e end
  if e and e.flags == 'l' then
    if held < cap_limit then return 'room', 0, e end
    return 'full', estimate(), e
  end
  if e then
    local exp = tonumber(redis.call('ZSCORE', HK, holder))
    if exp and exp > now_ms then return 'copy', (exp - now_ms) * 1000, e end
  end
  if held < cap_limit and (quiet or redis.call('ZCARD', WK) == 0) then return 'room', 0 end
  return 'full', estimate()
end

-- A fencing token: larger than every one given before on this subject (while its state lives,
-- and after, as long as Redis's clock does not go back).
local function next_fence()
  local f = max(now, (tonumber(redis.call('HGET', XK, 'fence')) or 0) + 1)
  redis.call('HSET', XK, 'fence', fmt(f))
  return f
end

-- Expiry: holders and their entries live as long as the last lease, unless messages are kept
-- (waiters, copies, lapsed hand-overs): those never expire.
local function finish()
  if not quiet and redis.call('EXISTS', WK, KK, LK) > 0 then
    redis.call('PERSIST', XK)
    redis.call('PERSIST', HK)
    return
  end
  local last = redis.call('ZRANGE', HK, '-1', '-1', 'WITHSCORES')[2]
  if last then
    local ttl = ttl_ms((tonumber(last) - now_ms + 1000) * 1000)
    redis.call('PEXPIRE', HK, ttl)
    redis.call('PEXPIRE', XK, ttl)
  else
    redis.call('DEL', XK)
  end
end
