-- adapt.lua: an adaptive limit's multiplicative decrease after its upstream pushed back (AIMD).
-- Between decreases the factor climbs back by itself, additively with time, to at most 1, and
-- holds a while at HOLD_AT of the factor the upstream refused (see config/factors.py, whose
-- Factor.at computes the same): every worker reads it from this hash.
--
-- A refusal lowers the rate at once while the factor is above the hold (probing higher, or
-- never refused) or within CONFIRM gaps of the last decrease (still too high). At or under the
-- hold, where the quota was learnt, it lowers the rate only when a second comes within CONFIRM
-- gaps: a lone one (a call that met the quota's edge a few ms early: the upstream counts on
-- its own clock, by arrival) only pauses the limit, as every refusal does.
--
-- KEYS[1]  HASH label -> "<factor_0>:<t_0 us>:<refused>:<doubt us>": after the last decrease,
--          Redis time of it, the factor the upstream refused then, and the time of a lone
--          refusal since (0: none). Older forms "<factor_0>:<t_0 us>[:<refused>]" read too.
-- KEYS[2]  the live limits' version counter (incremented: workers read the hash again)
-- ARGV[1]  label
-- ARGV[2]  decrease: the factor is multiplied by this (0 < d < 1)
-- ARGV[3]  rise per second (fraction of the configured rate)
-- ARGV[4]  floor: the factor never goes below it
-- ARGV[5]  gap in microseconds: refusals within this long of the last one counted are the same
--          overload (the 429s of several processes) and count once
-- ARGV[6]  hold in seconds: how long the climb stays at HOLD_AT x refused
-- Returns  {factor (text), decreased (1|0), now_us}
local HOLD_AT = 0.9  -- config/factors.py HOLD_AT
local CONFIRM = 4  -- config/factors.py CONFIRM
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local raw = redis.call('HGET', KEYS[1], ARGV[1])
local f0, t0, refused, doubt = 1, 0, 0, 0
if raw then
  local fields = {}
  for part in string.gmatch(raw, '[^:]+') do fields[#fields + 1] = part end
  f0, t0 = tonumber(fields[1]) or 1, tonumber(fields[2]) or 0
  refused, doubt = tonumber(fields[3] or '') or 0, tonumber(fields[4] or '') or 0
end
local rise, hold, gap = tonumber(ARGV[3]), tonumber(ARGV[6]) or 0, tonumber(ARGV[5])
local climbed = math.max(0, (now - t0) / 1000000)
if refused > 0 and rise > 0 then
  local reach = math.max(0, (HOLD_AT * refused - f0) / rise)
  climbed = climbed - math.min(math.max(climbed - reach, 0), hold)
end
local f = math.min(1, f0 + rise * climbed)
local text = string.format('%.6f', f)

local function store(value, at, at_refused, at_doubt)
  redis.call('HSET', KEYS[1], ARGV[1], string.format('%.6f', value) .. ':' ..
    string.format('%d', at) .. ':' .. string.format('%.6f', at_refused) .. ':' ..
    string.format('%d', at_doubt))
end

if raw and t0 > 0 and now - t0 < gap then return {text, 0, now} end  -- the same overload
-- at or under the hold, and not just after a decrease: a refusal must repeat to count
local held = refused > 0 and f <= HOLD_AT * refused + 1e-9 and now - t0 > CONFIRM * gap
if held then
  if doubt > 0 and now - doubt < gap then return {text, 0, now} end  -- the doubted overload
  if not (doubt > 0 and now - doubt <= CONFIRM * gap) then  -- a lone refusal: remembered
    store(f0, t0, refused, now)
    return {text, 0, now}
  end
end
local lowered = math.max(tonumber(ARGV[4]), f * tonumber(ARGV[2]))
store(lowered, now, f, 0)
redis.call('INCR', KEYS[2])
return {string.format('%.6f', lowered), 1, now}
