-- fair_take.lua: take the calls with the lowest tags from a fair queue, as many as the limit
-- has room for now (less those already sent on and not yet arrived), to send on. Each is kept,
-- under a lease, until its message claims it on arrival (fair_claim.lua); one whose lease ran
-- out (its sender died, or the message was lost) is taken again first.
--
-- KEYS[1..5]  fq, fm, ft, fv, fn (see fair_put.lua)
-- KEYS[6]     ZSET fl: member -> lease expiry (ms): sent on, not yet arrived
-- ARGV[1]     room: calls the limit admits now
-- ARGV[2]     lease in ms
-- ARGV[3]     at most this many
-- ARGV[4]     1: the caller booked a moment for each (calls in flight take no room)
-- ARGV[5]     now (Unix ms), or '' to read Redis TIME (tests pass their own clock)
-- Returns     {calls still waiting, calls sent on and not arrived, member_1, envelope_1, tag_1,
--             ...}
local now = tonumber(ARGV[5])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local lease = now + tonumber(ARGV[2])
local out = {0, 0}
local flying = ARGV[4] == '1' and 0 or redis.call('ZCOUNT', KEYS[6], now, '+inf')
local left = math.min(tonumber(ARGV[3]), tonumber(ARGV[1]) - flying)
local function send(member, tag)
  local text = redis.call('HGET', KEYS[2], member)
  if not text then redis.call('ZREM', KEYS[6], member) return end
  redis.call('ZADD', KEYS[6], lease, member)
  out[#out + 1] = member
  out[#out + 1] = text
  out[#out + 1] = tag
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
return out
