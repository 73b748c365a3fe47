-- fair_claim.lua: a call sent on from a fair queue arrives: the first copy to claim it runs
-- (and the same copy again, redelivered: same token); another copy of it is dropped.
--
-- KEYS[2]  HASH fm (see fair_put.lua);  KEYS[6]  ZSET fl (see fair_take.lua)
-- KEYS[7]  HASH fs: member -> token of the copy that claimed it
-- KEYS[8]  ZSET fx: member -> when it was claimed (ms), to forget old claims
-- ARGV[1]  member;  ARGV[2]  token;  ARGV[3]  how long claims are remembered (ms)
-- ARGV[4]  now (Unix ms), or '' to read Redis TIME (tests pass their own clock)
-- Returns  1 run it, 0 drop it
local now = tonumber(ARGV[4])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local seen = redis.call('HGET', KEYS[7], ARGV[1])
if seen then return seen == ARGV[2] and 1 or 0 end
redis.call('HSET', KEYS[7], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[8], now, ARGV[1])
redis.call('ZREM', KEYS[6], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
for _, old in ipairs(redis.call('ZRANGEBYSCORE', KEYS[8], '-inf', now - tonumber(ARGV[3]), 'LIMIT', 0, 20)) do
  redis.call('ZREM', KEYS[8], old)
  redis.call('HDEL', KEYS[7], old)
end
redis.call('PEXPIRE', KEYS[7], ARGV[3])
redis.call('PEXPIRE', KEYS[8], ARGV[3])
return 1
