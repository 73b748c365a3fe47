-- adapt.lua: an adaptive limit's multiplicative decrease after its upstream pushed back (AIMD).
-- Between decreases the factor climbs back by itself, additively with time, to at most 1, and
-- holds a while at HOLD_AT of the factor the upstream refused (see config/factors.py, whose
-- Factor.at computes the same): every worker reads it from this hash.
--
-- KEYS[1]  HASH label -> "<factor_0>:<t_0 us>:<refused>" (after the last decrease, Redis time
--          of it, the factor the upstream refused then; an older "<factor_0>:<t_0 us>" has none)
-- KEYS[2]  the live limits' version counter (incremented: workers read the hash again)
-- ARGV[1]  label
-- ARGV[2]  decrease: the factor is multiplied by this (0 < d < 1)
-- ARGV[3]  rise per second (fraction of the configured rate)
-- ARGV[4]  floor: the factor never goes below it
-- ARGV[5]  gap in microseconds: a decrease within this long of the last one does nothing (the
--          429s of one overload, from several processes, count once)
-- ARGV[6]  hold in seconds: how long the climb stays at HOLD_AT x refused
-- Returns  {factor (text), decreased (1|0), now_us}
local HOLD_AT = 0.9  -- config/factors.py HOLD_AT
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local raw = redis.call('HGET', KEYS[1], ARGV[1])
local f0, t0, refused = 1, 0, 0
if raw then
  local a, b, c = string.match(raw, '^([%d%.e%-]+):(%d+):?([%d%.e%-]*)$')
  f0, t0, refused = tonumber(a) or 1, tonumber(b) or 0, tonumber(c) or 0
end
local rise, hold = tonumber(ARGV[3]), tonumber(ARGV[6]) or 0
local climbed = math.max(0, (now - t0) / 1000000)
if refused > 0 and rise > 0 then
  local reach = math.max(0, (HOLD_AT * refused - f0) / rise)
  climbed = climbed - math.min(math.max(climbed - reach, 0), hold)
end
local f = math.min(1, f0 + rise * climbed)
if raw and now - t0 < tonumber(ARGV[5]) then
  return {string.format('%.6f', f), 0, now}
end
local lowered = math.max(tonumber(ARGV[4]), f * tonumber(ARGV[2]))
redis.call('HSET', KEYS[1], ARGV[1], string.format('%.6f', lowered) .. ':' ..
  string.format('%d', now) .. ':' .. string.format('%.6f', f))
redis.call('INCR', KEYS[2])
return {string.format('%.6f', lowered), 1, now}
