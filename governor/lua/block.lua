-- block.lua: block a subject by hand until now + duration.
--
-- KEYS[1]  the subject's block key: STRING "<until_us>:<reason>", expiring with the block
-- ARGV[1]  now in microseconds since the Unix epoch, or '' to read Redis TIME
-- ARGV[2]  duration in microseconds (> 0), at most MAX_US (longer ones are cut to it, so the
--          moment stays an exact integer: %d of a larger double overflows into a negative one)
-- ARGV[3]  reason (free text)
-- Returns  {until_us, now_us}
local MAX_US = 3155760000000000  -- 100 years (governor.blocks.MAX_DURATION)
local now = tonumber(ARGV[1])
local pad = now and 60000 or 0  -- a caller's clock: expiry cannot follow it (see common.lua)
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local dur = tonumber(ARGV[2])
if not dur or dur < 1 then return redis.error_reply('governor: bad block duration ' .. ARGV[2]) end
dur = math.min(dur, MAX_US)
local untl = now + dur
local ms = math.max(1, math.ceil(dur / 1000)) + pad
redis.call('SET', KEYS[1], string.format('%d', untl) .. ':' .. ARGV[3], 'PX', string.format('%d', ms))
return {untl, now}
