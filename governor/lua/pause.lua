-- pause.lua: pause a subject after its upstream pushed back (HTTP 429 or 503): a block that
-- only grows, for a given time or for a capped exponential one.
--
-- KEYS[1]  the subject's block key (see block.lua): a later block already there is kept
-- KEYS[2]  the subject's backoff level: STRING integer, expiring twice its pause after the last
--          exponential pause (a quiet subject starts again at the base)
-- ARGV[1]  now in microseconds since the Unix epoch, or '' to read Redis TIME
-- ARGV[2]  the pause in microseconds (> 0), or '' for base * 2^(level - 1), at most ARGV[5]
-- ARGV[3]  reason (free text)
-- ARGV[4]  base in microseconds (exponential pauses)
-- ARGV[5]  largest exponential pause in microseconds
-- Every length is cut to MAX_US (see block.lua).
-- Returns  {until_us, now_us, level (0 for a given pause)}
local MAX_US = 3155760000000000  -- 100 years (governor.blocks.MAX_DURATION)
local now = tonumber(ARGV[1])
local pad = now and 60000 or 0  -- a caller's clock: expiry cannot follow it (see common.lua)
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local dur, level = tonumber(ARGV[2]), 0
if not dur then
  local base, most = tonumber(ARGV[4]), tonumber(ARGV[5])
  if not (base and most and base >= 1) then return redis.error_reply('governor: bad pause base') end
  level = redis.call('INCR', KEYS[2])
  dur = math.min(most, MAX_US, base * 2 ^ math.min(level - 1, 60))
  redis.call('PEXPIRE', KEYS[2], string.format('%d', math.ceil(2 * dur / 1000) + pad))
elseif dur < 1 then
  return redis.error_reply('governor: bad pause ' .. ARGV[2])
end
dur = math.min(dur, MAX_US)
local untl = now + dur
local old = redis.call('GET', KEYS[1])
local old_until = old and tonumber(string.match(old, '^(%-?%d+):'))
if old_until and old_until >= untl then return {old_until, now, level} end
redis.call('SET', KEYS[1], string.format('%d', untl) .. ':' .. ARGV[3],
  'PX', string.format('%d', math.max(1, math.ceil(dur / 1000)) + pad))
return {untl, now, level}
