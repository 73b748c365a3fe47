-- adapt.lua: an adaptive limit's multiplicative decrease after its upstream pushed back (AIMD).
-- Between decreases the factor climbs back by itself, additively with time, to at most 1:
-- factor(t) = min(1, factor_0 + rise x (t - t_0)), read by every worker from this hash.
--
-- KEYS[1]  HASH label -> "<factor_0>:<t_0 us>" (Redis time of the last decrease)
-- KEYS[2]  the live limits' version counter (incremented: workers read the hash again)
-- ARGV[1]  label
-- ARGV[2]  decrease: the factor is multiplied by this (0 < d < 1)
-- ARGV[3]  rise per second (fraction of the configured rate)
-- ARGV[4]  floor: the factor never goes below it
-- ARGV[5]  gap in microseconds: a decrease within this long of the last one does nothing (the
--          429s of one overload, from several processes, count once)
-- Returns  {factor (text), decreased (1|0), now_us}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local raw = redis.call('HGET', KEYS[1], ARGV[1])
local f0, t0 = 1, 0
if raw then
  local a, b = string.match(raw, '^([%d%.e%-]+):(%d+)$')
  f0, t0 = tonumber(a) or 1, tonumber(b) or 0
end
local f = math.min(1, f0 + tonumber(ARGV[3]) * (now - t0) / 1000000)
if raw and now - t0 < tonumber(ARGV[5]) then
  return {string.format('%.6f', f), 0, now}
end
f = math.max(tonumber(ARGV[4]), f * tonumber(ARGV[2]))
redis.call('HSET', KEYS[1], ARGV[1], string.format('%.6f', f) .. ':' .. string.format('%d', now))
redis.call('INCR', KEYS[2])
return {string.format('%.6f', f), 1, now}
