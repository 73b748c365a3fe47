-- dead_put.lua: keep an entry that cannot be read or published in the dead-letter place (see
-- governor/celery/waiting/dead_letters.py). The same entry put again (its mover died before it
-- removed it from where it waited, and took it again) stays one letter, counted twice.
--
-- KEYS[1]  HASH msgs: dead id -> record (JSON: source, entry, reason, text, where)
-- KEYS[2]  ZSET index: dead id -> when it was first put here (Unix ms)
-- KEYS[3]  HASH times: dead id -> how many times it was put here
-- ARGV[1]  dead id;  ARGV[2]  record
-- ARGV[3]  now (Unix ms), or '' to read Redis TIME (tests pass their own clock)
-- Returns  {letters held now, times this one was put, when it was first put (ms)}
local now = tonumber(ARGV[3])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
redis.call('ZADD', KEYS[2], 'NX', now, ARGV[1])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local times = redis.call('HINCRBY', KEYS[3], ARGV[1], 1)
return {redis.call('ZCARD', KEYS[2]), times, redis.call('ZSCORE', KEYS[2], ARGV[1])}
