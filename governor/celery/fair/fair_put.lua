-- fair_put.lua: a call denied under a fair limit waits in the limit's fair queue, placed by a
-- virtual start tag (start-time fair queuing, as Temporal's task-queue fairness): a tenant's
-- next tag is max(V, its last tag) + cost / weight, V being the tag of the last call sent on.
-- A tenant idle for a while (last tag <= V) starts at V: it banks no credit.
--
-- KEYS[1]  ZSET fq: member -> tag; member "<seq>:<id>" (seq keeps equal tags in arrival order)
-- KEYS[2]  HASH fm: member -> "<tenant>\n<tag>\n<envelope>" (the message to send on)
-- KEYS[3]  ZSET ft: tenant -> its last tag (tenants whose last tag <= V are removed)
-- KEYS[4]  STRING fv: "<V>:<seq>"
-- KEYS[5]  HASH fn: tenant -> calls waiting
-- ARGV[1]  id (the call's own; unique)
-- ARGV[2]  tenant
-- ARGV[3]  cost / weight (> 0)
-- ARGV[4]  the tag it had ('' for a new call): a call sent on and denied again keeps its place
-- ARGV[5]  envelope
-- ARGV[6]  key lifetime in ms (every key is refreshed while calls wait)
-- Returns  {tag (text), calls waiting}
local v_raw = redis.call('GET', KEYS[4]) or '0:0'
local v, seq = string.match(v_raw, '^([^:]+):(%d+)$')
v, seq = tonumber(v) or 0, (tonumber(seq) or 0) + 1
local tag = tonumber(ARGV[4])
if not tag then
  local last = tonumber(redis.call('ZSCORE', KEYS[3], ARGV[2]) or '') or v
  tag = math.max(v, last) + tonumber(ARGV[3])
  redis.call('ZADD', KEYS[3], tag, ARGV[2])
end
local member = string.format('%012d', seq) .. ':' .. ARGV[1]
redis.call('ZADD', KEYS[1], tag, member)
redis.call('HSET', KEYS[2], member, ARGV[2] .. '\n' .. string.format('%.17g', tag) .. '\n' .. ARGV[5])
redis.call('HINCRBY', KEYS[5], ARGV[2], 1)
redis.call('SET', KEYS[4], string.format('%.17g', v) .. ':' .. seq)
for i = 1, 5 do redis.call('PEXPIRE', KEYS[i], ARGV[6]) end
return {string.format('%.17g', tag), redis.call('ZCARD', KEYS[1])}
