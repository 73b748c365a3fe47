-- caps_due.lua: which concurrency caps a sweeper should look at now, claimed for a while so that
-- the sweepers of other workers pass them by (see governor/celery/waiting.py).
--
-- KEYS[1]  ZSET: cap ("<name>:<subject>", escaped) -> when a sweep could matter (Unix ms)
-- ARGV[1]  at most this many
-- ARGV[2]  claim (ms): their scores move this far ahead (the sweep sets the real next moment)
-- Returns  {now_ms, cap_1, cap_2, ...}
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', '0', ARGV[1])
local out = {now}
for _, cap in ipairs(due) do
  redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), cap)
  out[#out + 1] = cap
end
return out
