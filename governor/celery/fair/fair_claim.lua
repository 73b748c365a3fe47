-- fair_claim.lua: a call sent on from a fair queue arrives: the first copy to claim it runs
-- (and the same copy again, redelivered: same token); another copy of it is dropped.
--
-- A claim is remembered ARGV[3] (an hour), or ARGV[7] (a day) for a call sent more than once.
-- A copy of a call that neither waits nor has a claim remembered (its claim was forgotten)
-- runs only while it cannot be a second copy: sent less than ARGV[3] ago (its entry was
-- lost, say by a failover), or the call's only copy (a redelivery of the copy that ran) sent
-- less than ARGV[7] ago. An older copy is dropped: no second copy ever runs.
--
-- KEYS[1..6]  fq, fm, ft, fv, fn, fl (see fair_put.lua, fair_take.lua)
-- KEYS[7]     HASH fs: member -> token of the copy that claimed it
-- KEYS[8]     ZSET fx: member -> when its claim is forgotten (ms)
-- KEYS[9]     HASH fc: member -> copies sent so far (see fair_take.lua)
-- ARGV[1]     member;  ARGV[2]  token (the copy's own)
-- ARGV[3]     how long a claim is remembered (ms)
-- ARGV[4]     now (Unix ms), or '' to read Redis TIME (tests pass their own clock)
-- ARGV[5]     when this copy was sent (Unix ms), '' if it does not say (sent before copies
--             said: treated as young)
-- ARGV[6]     which copy of the call this is (1 the first)
-- ARGV[7]     how long the claim of a call sent more than once is remembered (ms)
-- Returns     1 run it, 0 drop it
local now = tonumber(ARGV[4])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local short, long = tonumber(ARGV[3]), tonumber(ARGV[7]) or tonumber(ARGV[3])
local member = ARGV[1]
local seen = redis.call('HGET', KEYS[7], member)
if seen then return seen == ARGV[2] and 1 or 0 end
local copies = math.max(tonumber(redis.call('HGET', KEYS[9], member) or '') or 1,
  tonumber(ARGV[6]) or 1)
if redis.call('HEXISTS', KEYS[2], member) == 0 and not redis.call('ZSCORE', KEYS[6], member) then
  local sent = tonumber(ARGV[5])
  if sent and now - sent >= short and (copies > 1 or now - sent >= long) then return 0 end
end
local keep = copies > 1 and long or short
redis.call('HSET', KEYS[7], member, ARGV[2])
redis.call('ZADD', KEYS[8], now + keep, member)
redis.call('ZREM', KEYS[6], member)
redis.call('HDEL', KEYS[2], member)
redis.call('HDEL', KEYS[9], member)
for _, old in ipairs(redis.call('ZRANGEBYSCORE', KEYS[8], '-inf', now, 'LIMIT', 0, 20)) do
  redis.call('ZREM', KEYS[8], old)
  redis.call('HDEL', KEYS[7], old)
end
for i = 7, 8 do
  if redis.call('PTTL', KEYS[i]) < keep then redis.call('PEXPIRE', KEYS[i], keep) end
end
return 1
