-- gcra.lua: generic cell rate algorithm (leaky bucket as a meter), several rules at once.
--
-- Rule i lets limit_i through at once and then one every T_i = ceil(window_i / limit_i) us.
-- KEYS[1]  STRING: each rule's theoretical arrival time in us; one rule: the number as text,
--          several: packed little-endian doubles. A different number of rules starts afresh.
-- KEYS[2]  manual block (see common.lua)
-- ARGV     see common.lua; no extras. A rule charged 0 units (another meter's call) neither
--          decides nor moves.
-- Returns  see common.lua.
--
-- Settle: a reservation of e units counted at s is repaid by time at one unit per T; at t,
-- at most its units still ahead of t, floor((s + e x T - t) / T), can go back (and none
-- of what later calls already use: never more than the schedule holds past t). Use beyond the
-- estimate is charged now: tat = max(tat, now) + units x T.
-- @include common
-- @include packed
local key = KEYS[1]
local T, B, tat = {}, {}, {}
local raw = redis.call('GET', key)
if raw then
  if n == 1 then tat = {tonumber(raw)} else tat = unpack_numbers(raw, n) or {} end
end
for i = 1, n do
  T[i] = ceil(win[i] / lim[i])
  B[i] = T[i] * lim[i]
  tat[i] = tat[i] or 0
end

-- The usual decision (acquire, peek), inline: the functions below are made only by the other
-- operations (Lua makes every closure afresh on each call). As earliest(now), then advance,
-- remaining(now), reset_after() and store() do.
if op == 'acquire' or op == 'peek' then
  local untl, reason = read_block()
  if held_by(untl) then return blocked_reply(untl, reason) end
  local at, rule, first = now, 0, 1
  while first < n and cost[first] == 0 do first = first + 1 end
  for i = 1, n do
    local x = tat[i] + cost[i] * T[i] - B[i]
    if cost[i] > 0 and x > at then at, rule = x, i end
  end
  local admitted, before = not never and at <= now, tat[first]
  if admitted then
    for i = 1, n do
      if cost[i] > 0 then tat[i] = max(tat[i], now) + cost[i] * T[i] end
    end
  end
  local best, last = nil, now  -- what remains; the latest schedule
  for i = 1, n do
    local r = math.floor((now + B[i] - max(tat[i], now)) / T[i])
    if r > lim[i] then r = lim[i] end
    if r < 0 then r = 0 end
    if best == nil or r < best then best = r end
    if tat[i] > last then last = tat[i] end
  end
  if never then return decision(0, -1, never, best, last - now, 0, 0, '') end
  if not admitted then return decision(0, at - now, rule, best, last - now, 0, 0, '') end
  if op == 'peek' then return decision(1, 0, 0, best, last - now, 0, 0, '') end
  if last <= now then
    redis.call('DEL', key)
  elseif n == 1 then
    redis.call('SET', key, fmt(tat[1]), 'PX', ttl_ms(last - now))
  else
    redis.call('SET', key, pack_numbers(tat), 'PX', ttl_ms(last - now))
  end
  return decision(1, 0, 0, best, last - now, now, max(before, now), '')
end

-- Earliest moment >= t0 at which every rule admits its cost, and the rule that set it.
local function earliest(t0)
  local at, rule = t0, 0
  for i = 1, n do
    local x = tat[i] + cost[i] * T[i] - B[i]
    if cost[i] > 0 and x > at then at, rule = x, i end
  end
  return at, rule
end

-- The rule whose schedule names an admission or booking (slot_end): the first one charged.
local first = 1
while first < n and cost[first] == 0 do first = first + 1 end

local function remaining(t)
  local best = nil
  for i = 1, n do
    local r = math.floor((t + B[i] - max(tat[i], t)) / T[i])
    if r > lim[i] then r = lim[i] end
    if r < 0 then r = 0 end
    if best == nil or r < best then best = r end
  end
  return best
end

local function reset_after()
  local m = now
  for i = 1, n do
    if tat[i] > m then m = tat[i] end
  end
  return m - now
end

-- Write the state back; a subject that is fully replenished needs no key.
local function store()
  local last = now
  for i = 1, n do
    if tat[i] > last then last = tat[i] end
  end
  if last <= now then
    redis.call('DEL', key)
  elseif n == 1 then
    redis.call('SET', key, fmt(tat[1]), 'PX', ttl_ms(last - now))
  else
    redis.call('SET', key, pack_numbers(tat), 'PX', ttl_ms(last - now))
  end
end

-- Count the cost at moment eff for every rule charged.
local function advance(eff)
  for i = 1, n do
    if cost[i] > 0 then tat[i] = max(tat[i], eff) + cost[i] * T[i] end
  end
end

-- settle and sync only (the other calls do not make them): rule i's room now, in units; and
-- a charge of per-rule units now, admitted or not (settle's overrun, sync), a schedule
-- reaching at most 2^52 us (142 years) ahead.
local room, charge_now
if op == 'settle' or op == 'sync' then
  room = function(i)
    return max(0, min(lim[i], math.floor((now + B[i] - max(tat[i], now)) / T[i])))
  end
  charge_now = function(units)
    for i = 1, n do
      if units[i] > 0 then tat[i] = min(max(tat[i], now) + units[i] * T[i], now + 2 ^ 52) end
    end
  end
end

if op == 'usage' then
  local per = {}
  for i = 1, n do
    local backlog = math.max(0, tat[i] - now)
    per[#per + 1] = math.min(lim[i], math.ceil(backlog / T[i]))
    per[#per + 1] = math.max(0, tat[i] + T[i] - B[i] - now)
    per[#per + 1] = backlog
  end
  -- bookings: emissions scheduled beyond what a full burst allows now
  -- (the last booking started at tat - B: the earliest moment its rule had room for it)
  local booked, last = 0, 0
  for i = 1, n do
    booked = math.max(booked, math.ceil((tat[i] - now - B[i]) / T[i]))
    if tat[i] - B[i] > now then last = math.max(last, tat[i] - B[i]) end
  end
  return usage_reply(per, booked, last)
end

if op == 'refund' then
  -- Only the newest admission or booking can be taken back: its emission is the last one in
  -- every rule. An older one would open a gap that later bookings already rely on.
  if raw and tat[first] == math.max(slot_end, 0) + cost[first] * T[first] then
    for i = 1, n do tat[i] = tat[i] - cost[i] * T[i] end
    store()
  end
  return 1
end

if op == 'settle' then
  local back = {}
  for i = 1, n do
    local ahead = math.min(slot_start + cost[i] * T[i], tat[i]) - now
    back[i] = math.min(give[i], math.max(0, idiv(ahead, T[i])))
    tat[i] = tat[i] - back[i] * T[i]
  end
  charge_now(charge)
  store()
  return settled_reply(back, charge)
end

if op == 'sync' then
  local per_rule, extra = sync_charge(room)
  charge_now(per_rule)
  store()
  return extra
end

local untl, reason = read_block()
if held_by(untl) then return blocked_reply(untl, reason) end

if never then return decision(0, -1, never, remaining(now), reset_after(), 0, 0, '') end

if op == 'claim' then
  if now < slot_start then
    return decision(0, slot_start - now, 0, remaining(now), reset_after(), slot_start, slot_end, '')
  end
  if now <= slot_end then
    return decision(1, 0, 0, remaining(now), reset_after(), slot_start, slot_end, '')
  end
  op = 'reserve'  -- late: ask again as a new arrival (the missed slot stays spent)
end

local at, rule = earliest(now)
if at <= now and (op ~= 'reserve' or not_before <= now) then
  local before = tat[first]
  -- a lease counts as emitted at the end of its span (a booking whose slot is now)
  local eff = op == 'lease' and now + tol or now
  advance(eff)
  if op == 'peek' then return decision(1, 0, 0, remaining(now), reset_after(), 0, 0, '') end
  store()
  -- the slot's end is where this admission sits in the first charged rule's schedule (refunds)
  return decision(1, 0, 0, remaining(now), reset_after(), now, max(before, eff), '')
end
if op ~= 'reserve' then
  return decision(0, at - now, rule, remaining(now), reset_after(), 0, 0, '')
end

local slot = earliest(max(now, not_before))
if max_wait >= 0 and slot - now > max_wait then
  return decision(0, slot - now, rule, remaining(now), reset_after(), 0, 0, '')
end
advance(slot + tol)
store()
return decision(0, slot - now, rule, remaining(now), reset_after(), slot, slot + tol, '')
