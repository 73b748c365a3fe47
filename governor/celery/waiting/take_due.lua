-- take_due.lua: pick up parked tasks that are nearly due (a pickup lapses, so nothing is lost).
--
-- KEYS[1]  ZSET due: parking id -> due time (Unix ms)
-- KEYS[2]  HASH msgs: parking id -> envelope
-- KEYS[3]  ZSET lease: parking id -> when its pickup lapses (Unix ms): being released now
-- ARGV[1]  horizon (ms): take what is due within this long from now
-- ARGV[2]  pickup (ms): how long a releaser may take to publish before others take them again
-- ARGV[3]  at most this many
-- ARGV[4]  now (Unix ms), or '' (or absent) to read Redis TIME (tests pass their own clock)
-- Returns  {now_ms, id_1, envelope_1, id_2, envelope_2, ...}. A releaser publishes each one, then
--          forgets it (ZREM lease, HDEL msgs). One that dies first leaves its pickup to lapse:
--          the entries are taken again, so nothing is lost; a task published twice that way is
--          run once (the consumer claims the parking id before running it).
local now = tonumber(ARGV[4])
if not now then
  local t = redis.call('TIME')
  now = t[1] * 1000 + math.floor(t[2] / 1000)
end
local limit = tonumber(ARGV[3])
local out = {now}
local function take(id)
  local env = redis.call('HGET', KEYS[2], id)
  redis.call('ZREM', KEYS[1], id)
  if env then
    redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), id)
    out[#out + 1] = id
    out[#out + 1] = env
  else
    redis.call('ZREM', KEYS[3], id)
  end
end
-- lapsed pickups first: their releaser died mid-release
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, limit)) do
  take(id)
end
local room = limit - (#out - 1) / 2
if room > 0 then
  local horizon = now + tonumber(ARGV[1])
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', horizon, 'LIMIT', 0, room)) do
    take(id)
  end
end
return out
