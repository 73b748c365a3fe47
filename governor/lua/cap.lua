-- cap.lua: a concurrency cap over one subject: at most `limit` holders at once. Shared by the
-- capped decision script (common.lua, cap.lua, the algorithm as `rate()`, cap_decide.lua) and
-- the cap's own operations (common.lua, cap.lua, cap_ops.lua); see governor/scripts.py.
--
-- A slot is a lease held by a holder id (a Celery task: "<task id>:<retries>"), not a count:
-- a holder that stops renewing loses it when its lease lapses, and every script that runs on
-- the cap removes lapsed holders first. Waiters queue in arrival order; whatever frees a slot
-- hands it to the oldest waiter at once (it becomes a holder, pending until it starts).
--
-- KEYS[3]  ZSET holders: holder id -> lease expiry (ms)
-- KEYS[4]  HASH: "h<id>" -> "<token> <since_ms> <fence> <flags> <info>" per holder (flags: p =
--          handed over, not started yet; c = a copy of it asked while it held; - = none);
--          "w<id>" -> a waiter's message ("" for a waiting process, woken by KEYS[3]'s
--          "...:cq:<id>" list); "p<id>" -> a handed-over waiter's message until it starts;
--          "fence" -> the last fencing token; "seq" -> the last waiter number;
--          "cfg" -> "<limit> <lease_ms>" (for sweeps, which are not told them)
-- KEYS[5]  ZSET waiters: id -> arrival number (oldest first)
-- KEYS[6]  ZSET done: id -> until (ms): holders that finished while a copy of them waited
-- ARGV     the decision's (common.lua), then six more: limit ('' = from cfg), lease_us,
--          holder id, token, info (free text for operators), message ('' = none)
local cap_at = #ARGV - 5
local HK, XK, WK, DK = KEYS[3], KEYS[4], KEYS[5], KEYS[6]
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

-- A holder's entry: token, since_ms, fence, flags, info; or nil.
local function entry(id)
  local v = redis.call('HGET', XK, 'h' .. id)
  if not v then return nil end
  local t, s, f, fl, rest = string.match(v, '^(%S+) (%-?%d+) (%d+) (%S) (.*)$')
  if not t then return error('governor: corrupt concurrency holder at ' .. XK) end
  return {token = t, since = s, fence = f, flags = fl, info = rest}
end

local function put(id, t, since, fence, flags, text)
  redis.call('HSET', XK, 'h' .. id, t .. ' ' .. since .. ' ' .. fence .. ' ' .. flags .. ' ' .. text)
end

local function drop(id)
  redis.call('ZREM', HK, id)
  redis.call('HDEL', XK, 'h' .. id, 'p' .. id)
end

-- Hand free slots to the oldest waiters. A waiter's message goes into `out` (id, message) for
-- the caller to publish; a waiting process is woken through its list.
local function hand_over(out)
  local room = cap_limit - redis.call('ZCARD', HK)
  while room > 0 do
    local id = redis.call('ZRANGE', WK, '0', '0')[1]
    if not id then return end
    redis.call('ZREM', WK, id)
    local msg = redis.call('HGET', XK, 'w' .. id)
    if msg then
      redis.call('HDEL', XK, 'w' .. id)
      redis.call('ZADD', HK, expires, id)
      put(id, '-', now_ms, 0, 'p', 'handed over')
      if msg == '' then
        local wake = string.sub(HK, 1, -3) .. 'cq:' .. id
        redis.call('RPUSH', wake, '1')
        redis.call('PEXPIRE', wake, ttl_ms(lease_ms * 1000))
      else
        redis.call('HSET', XK, 'p' .. id, msg)
        out[#out + 1] = id
        out[#out + 1] = msg
      end
      room = room - 1
    end
  end
end

-- Remove holders whose lease lapsed (a handed-over task that never came is handed again: its
-- message goes out once more), then fill free slots from the waiters.
local function sweep(out)
  local lapsed = redis.call('ZRANGEBYSCORE', HK, '-inf', fmt(now_ms), 'LIMIT', '0', '100')
  for _, id in ipairs(lapsed) do
    local msg = redis.call('HGET', XK, 'p' .. id)
    if msg then
      redis.call('ZADD', HK, expires, id)
      out[#out + 1] = id
      out[#out + 1] = msg
    else
      drop(id)
    end
  end
  if redis.call('ZCARD', WK) > 0 then hand_over(out) end
end

-- Whether `holder` may take a slot: 'room', 'mine' (handed over to it), 'full', 'copy' (a live
-- copy of it holds one), 'done' (it finished while a copy waited); and for the last three,
-- the wait until a lease lapses (us), the estimate of a slot's freeing.
local function verdict(live_only)
  local until_ms = tonumber(redis.call('ZSCORE', DK, holder))
  if until_ms and until_ms > now_ms then return 'done', -1 end
  local e = entry(holder)
  if e then
    local exp = tonumber(redis.call('ZSCORE', HK, holder))
    if e.flags == 'p' then return 'mine', 0 end
    if exp and exp > now_ms then return 'copy', (exp - now_ms) * 1000, e end
  end
  local held = live_only and redis.call('ZCOUNT', HK, '(' .. fmt(now_ms), '+inf')
    or redis.call('ZCARD', HK)
  if held < cap_limit and redis.call('ZCARD', WK) == 0 then return 'room', 0 end
  local first = redis.call('ZRANGE', HK, '0', '0', 'WITHSCORES')[2]
  return 'full', first and max(0, (tonumber(first) - now_ms) * 1000) or lease_ms * 1000
end

-- A fencing token: larger than every one given before on this subject (while its state lives,
-- and after, as long as Redis's clock does not go back).
local function next_fence()
  local f = max(now, (tonumber(redis.call('HGET', XK, 'fence')) or 0) + 1)
  redis.call('HSET', XK, 'fence', fmt(f))
  return f
end

-- Expiry: holders and their entries live as long as the last lease; waiters never expire.
local function finish()
  local last = redis.call('ZRANGE', HK, '-1', '-1', 'WITHSCORES')[2]
  local waiting = redis.call('ZCARD', WK) > 0
  if last then
    local ttl = ttl_ms((tonumber(last) - now_ms + 1000) * 1000)
    redis.call('PEXPIRE', HK, ttl)
    if not waiting then redis.call('PEXPIRE', XK, ttl) end
  end
  if waiting then
    redis.call('PERSIST', XK)
  elseif not last then
    redis.call('DEL', XK)
  end
end
