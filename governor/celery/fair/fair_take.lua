-- fair_take.lua: take the calls with the lowest tags from a fair queue, as many as the limit
-- has room for now (less those already sent on and not yet arrived), to send on. Each is kept,
-- in transit, until its message claims it on arrival (fair_claim.lua); one still in transit
-- when its transit runs out (its sender died, the message was lost or sits in a broker
-- backlog) is sent again first, with a transit twice as long each time (up to ARGV[6]): a
-- backlog of B seconds makes about log2(B / transit) copies of a call, not B / transit.
--
-- KEYS[1..5]  fq, fm, ft, fv, fn (see fair_put.lua)
-- KEYS[6]     ZSET fl: member -> when its transit runs out (ms): sent on, not yet arrived
-- KEYS[7]     HASH fc: member -> copies sent so far
-- ARGV[1]     room: calls the limit admits now
-- ARGV[2]     transit of a first copy (ms)
-- ARGV[3]     at most this many
-- ARGV[4]     1: the caller booked a moment for each (calls in flight take no room)
-- ARGV[5]     now (Unix ms), or '' to read Redis TIME (tests pass their own clock)
-- ARGV[6]     the longest transit (ms)
-- ARGV[7]     key lifetime (ms): refreshed while calls wait or are in transit
-- Returns     {calls still waiting, calls sent on and not arrived, now (ms),
--             member_1, text_1, tag_1 ('' for a copy sent again), copy_1, ...}
local now = tonumber(ARGV[5])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local first, longest = tonumber(ARGV[2]), tonumber(ARGV[6])
local out = {0, 0, now}
local flying = ARGV[4] == '1' and 0 or redis.call('ZCOUNT', KEYS[6], now, '+inf')
local left = math.min(tonumber(ARGV[3]), tonumber(ARGV[1]) - flying)
local function send(member, tag)
  local text = redis.call('HGET', KEYS[2], member)
  if not text then
    redis.call('ZREM', KEYS[6], member)
    redis.call('HDEL', KEYS[7], member)
    return
  end
  local copy = redis.call('HINCRBY', KEYS[7], member, 1)
  redis.call('ZADD', KEYS[6], now + math.min(longest, first * 2 ^ (copy - 1)), member)
  out[#out + 1] = member
  out[#out + 1] = text
  out[#out + 1] = tag
  out[#out + 1] = copy
  left = left - 1
end
for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', now)) do
  if left <= 0 then break end
  send(member, '')
end
if left > 0 then
  local firsts = redis.call('ZRANGE', KEYS[1], 0, left - 1, 'WITHSCORES')
  local v_raw = redis.call('GET', KEYS[4]) or '0:0'
  local v, seq = string.match(v_raw, '^([^:]+):(%d+)$')
  v = tonumber(v) or 0
  for i = 1, #firsts, 2 do
    local member, tag = firsts[i], firsts[i + 1]
    redis.call('ZREM', KEYS[1], member)
    local text = redis.call('HGET', KEYS[2], member) or ''
    local tenant = string.match(text, '^([^\n]*)\n') or ''
    if redis.call('HINCRBY', KEYS[5], tenant, -1) <= 0 then redis.call('HDEL', KEYS[5], tenant) end
    if tonumber(tag) > v then v = tonumber(tag) end
    send(member, tag)
  end
  redis.call('SET', KEYS[4], string.format('%.17g', v) .. ':' .. (seq or '0'), 'KEEPTTL')
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', v)  -- idle tenants: nothing to remember
end
out[1] = redis.call('ZCARD', KEYS[1])
out[2] = redis.call('ZCARD', KEYS[6])
if out[1] + out[2] > 0 then  -- a queue without puts for a while keeps what it still holds
  for i = 1, 7 do redis.call('PEXPIRE', KEYS[i], ARGV[7]) end
end
return out
