-- token_bucket.lua: a bucket of limit_i tokens per rule, refilled evenly over window_i.
--
-- Levels are kept in token-microseconds (tokens x window_us), so the refill of limit_i per us is
-- an exact integer and no fraction of a token is ever lost.
-- KEYS[1]  STRING of packed little-endian doubles level_1, seen_1, ..., level_n, seen_n: each
--          rule's level and the moment (us) it was measured. A missing key is a full bucket; a
--          different number of rules than stored starts full.
-- KEYS[2]  manual block (see common.lua)
-- ARGV     see common.lua; no extras. Bookings are not supported: reserve and claim act as acquire.
--          A rule charged 0 units (another meter's call) neither decides nor moves.
-- Returns  see common.lua.
--
-- Settle: a reservation of e units taken at s has been refilled by time at N per W since; at
-- t, at most its units not yet refilled, floor((e x W - (t - s) x N) / W), can go back (never
-- beyond a full bucket). Use beyond the estimate is charged now: the level may go below zero
-- (a debt later calls wait for; at most 2^52 token-us deep).
-- @include common
-- @include packed
local key = KEYS[1]
local raw = redis.call('GET', key)
local st = nil
if raw then st = unpack_numbers(raw, 2 * n) end
local level, seen, cap = {}, {}, {}
for i = 1, n do
  cap[i] = lim[i] * win[i]
  level[i], seen[i] = cap[i], now
  if st then
    local lv, at = st[2 * i - 1], st[2 * i]
    if now > at then
      -- (a level below zero, after an overrun, takes longer than a window to refill)
      if now - at >= ceil((cap[i] - lv) / lim[i]) then lv = cap[i] else lv = lv + (now - at) * lim[i] end
      at = now
    end
    level[i], seen[i] = lv, at
  end
end

-- A decision (every operation but usage, refund, settle and sync), inline: the functions below
-- are made only by those (Lua makes every closure afresh on each call). As remaining(),
-- reset_after() and store() do.
if op ~= 'usage' and op ~= 'refund' and op ~= 'settle' and op ~= 'sync' then
  local untl, reason = read_block()
  if untl then return blocked_reply(untl, reason) end
  local wait, rule = 0, 0
  if not never then
    for i = 1, n do
      local short = cost[i] * win[i] - level[i]
      if cost[i] > 0 and short > 0 then
        local w = ceil(short / lim[i])
        if w > wait then wait, rule = w, i end
      end
    end
    if wait == 0 then
      for i = 1, n do level[i] = level[i] - cost[i] * win[i] end
    end
  end
  local best, full = nil, 0  -- what remains; when every bucket is full again
  for i = 1, n do
    local r = max(0, math.floor(level[i] / win[i]))
    if best == nil or r < best then best = r end
    local w = ceil((cap[i] - level[i]) / lim[i])
    if w > full then full = w end
  end
  if never then return decision(0, -1, never, best, full, 0, 0, '') end
  if wait > 0 then return decision(0, wait, rule, best, full, 0, 0, '') end
  if op == 'peek' then return decision(1, 0, 0, best, full, 0, 0, '') end
  if full <= 0 then
    redis.call('DEL', key)
  else
    local parts = {}
    for i = 1, n do parts[2 * i - 1], parts[2 * i] = level[i], seen[i] end
    redis.call('SET', key, pack_numbers(parts), 'PX', ttl_ms(full))
  end
  return decision(1, 0, 0, best, full, now, now, '')
end

local function remaining()
  local best = nil
  for i = 1, n do
    local r = max(0, math.floor(level[i] / win[i]))
    if best == nil or r < best then best = r end
  end
  return best
end

-- settle and sync only (the other calls do not make them): rule i's room now, in units; and
-- a charge of per-rule units now, admitted or not (settle's overrun, sync).
local room, charge_now
if op == 'settle' or op == 'sync' then
  room = function(i)
    return max(0, math.floor(level[i] / win[i]))
  end
  charge_now = function(units)
    for i = 1, n do level[i] = max(-2 ^ 52, level[i] - units[i] * win[i]) end
  end
end

local function reset_after()
  local m = 0
  for i = 1, n do
    local w = math.ceil((cap[i] - level[i]) / lim[i])
    if w > m then m = w end
  end
  return m
end

local function store()
  local parts = {}
  for i = 1, n do
    parts[2 * i - 1] = level[i]
    parts[2 * i] = seen[i]
  end
  local full = reset_after()
  if full <= 0 then
    redis.call('DEL', key)
  else
    redis.call('SET', key, pack_numbers(parts), 'PX', ttl_ms(full))
  end
end

if op == 'usage' then
  local per = {}
  for i = 1, n do
    per[#per + 1] = math.ceil((cap[i] - level[i]) / win[i])
    per[#per + 1] = level[i] >= win[i] and 0 or math.ceil((win[i] - level[i]) / lim[i])
    per[#per + 1] = math.ceil((cap[i] - level[i]) / lim[i])
  end
  return usage_reply(per)
end

if op == 'refund' then
  local shortest = win[1]
  for i = 2, n do shortest = math.min(shortest, win[i]) end
  -- an older admission's tokens have come back by refill already
  if raw and now - slot_start < shortest then
    for i = 1, n do level[i] = math.min(cap[i], level[i] + cost[i] * win[i]) end
    store()
  end
  return 1
end

if op == 'settle' then
  local back = {}
  for i = 1, n do
    local unfilled = idiv(cost[i] * win[i] - (now - slot_start) * lim[i], win[i])
    local headroom = idiv(cap[i] - level[i], win[i])
    back[i] = max(0, math.min(give[i], unfilled, headroom))
    level[i] = level[i] + back[i] * win[i]
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
if untl then return blocked_reply(untl, reason) end

if never then return decision(0, -1, never, remaining(), reset_after(), 0, 0, '') end

local wait, rule = 0, 0
for i = 1, n do
  local short = cost[i] * win[i] - level[i]
  if cost[i] > 0 and short > 0 then
    local w = math.ceil(short / lim[i])
    if w > wait then wait, rule = w, i end
  end
end
if wait > 0 then
  return decision(0, wait, rule, remaining(), reset_after(), 0, 0, '')
end
for i = 1, n do level[i] = level[i] - cost[i] * win[i] end
if op == 'peek' then return decision(1, 0, 0, remaining(), reset_after(), 0, 0, '') end
store()
return decision(1, 0, 0, remaining(), reset_after(), now, now, '')
