-- fixed_window.lua: a counter per rule for the current window, windows aligned to the Unix epoch
-- (a "/d" rule resets at 00:00 UTC). Up to 2 x limit can pass around a window boundary.
--
-- KEYS[1]  STRING of packed little-endian doubles window_1, count_1, ..., window_n, count_n,
--          window = floor(us / window_us). A different number of rules than stored starts afresh.
-- KEYS[2]  manual block (see common.lua)
-- ARGV     see common.lua; no extras. Bookings are not supported: reserve and claim act as acquire.
--          A rule charged 0 units (another meter's call) neither decides nor counts.
-- Returns  see common.lua.
--
-- Settle: units not used go back to the window the reservation was counted in, if it is still
-- the current one (a passed window gives nothing back); use beyond the estimate is counted in
-- the current window, admitted or not.
-- @include common
-- @include packed
local key = KEYS[1]
local raw = redis.call('GET', key)
local st = nil
if raw then st = unpack_numbers(raw, 2 * n) end
local idx, cnt = {}, {}
for i = 1, n do
  idx[i], cnt[i] = math.floor(now / win[i]), 0
  -- a stored window at or after ours (the clock may step back) still counts
  if st and st[2 * i - 1] >= idx[i] then idx[i], cnt[i] = st[2 * i - 1], st[2 * i] end
end

-- A decision (every operation but usage, refund, settle and sync), inline: the functions below
-- are made only by those (Lua makes every closure afresh on each call). As window_end(),
-- remaining(), reset_after() and store() do.
if op ~= 'usage' and op ~= 'refund' and op ~= 'settle' and op ~= 'sync' then
  local untl, reason = read_block()
  if untl then return blocked_reply(untl, reason) end
  local wait, rule = 0, 0
  if not never then
    for i = 1, n do
      local e = (idx[i] + 1) * win[i] - now
      if cost[i] > 0 and cnt[i] + cost[i] > lim[i] and e > wait then wait, rule = e, i end
    end
    if wait == 0 then
      for i = 1, n do cnt[i] = cnt[i] + cost[i] end
    end
  end
  local best, live = nil, 0  -- what remains; when the last window with a count ends
  for i = 1, n do
    local r = max(0, lim[i] - cnt[i])
    if best == nil or r < best then best = r end
    local e = (idx[i] + 1) * win[i] - now
    if cnt[i] > 0 and e > live then live = e end
  end
  if never then return decision(0, -1, never, best, live, 0, 0, '') end
  if wait > 0 then return decision(0, wait, rule, best, live, 0, 0, '') end
  if op == 'peek' then return decision(1, 0, 0, best, live, 0, 0, '') end
  if live <= 0 then
    redis.call('DEL', key)
  else
    local parts = {}
    for i = 1, n do parts[2 * i - 1], parts[2 * i] = idx[i], cnt[i] end
    redis.call('SET', key, pack_numbers(parts), 'PX', ttl_ms(live))
  end
  return decision(1, 0, 0, best, live, now, now, '')
end

local function window_end(i)
  return (idx[i] + 1) * win[i] - now
end

-- Rule i's room now, in units (sync only: the other calls do not make it).
local room
if op == 'sync' then
  room = function(i) return max(0, lim[i] - cnt[i]) end
end

local function remaining()
  local best = nil
  for i = 1, n do
    local r = math.max(0, lim[i] - cnt[i])
    if best == nil or r < best then best = r end
  end
  return best
end

local function reset_after()
  local m = 0
  for i = 1, n do
    if cnt[i] > 0 and window_end(i) > m then m = window_end(i) end
  end
  return m
end

local function store()
  local parts = {}
  for i = 1, n do
    parts[2 * i - 1] = idx[i]
    parts[2 * i] = cnt[i]
  end
  local live = reset_after()
  if live <= 0 then
    redis.call('DEL', key)
  else
    redis.call('SET', key, pack_numbers(parts), 'PX', ttl_ms(live))
  end
end

if op == 'usage' then
  local per = {}
  for i = 1, n do
    per[#per + 1] = cnt[i]
    per[#per + 1] = cnt[i] >= lim[i] and window_end(i) or 0
    per[#per + 1] = cnt[i] > 0 and window_end(i) or 0
  end
  return usage_reply(per)
end

if op == 'refund' then
  if st then
    for i = 1, n do
      if idx[i] == math.floor(slot_start / win[i]) then cnt[i] = math.max(0, cnt[i] - cost[i]) end
    end
    store()
  end
  return 1
end

if op == 'settle' or op == 'sync' then
  local back, extra, units = {}, 0, charge
  if op == 'sync' then units, extra = sync_charge(room) end
  for i = 1, n do
    back[i] = 0
    if op == 'settle' and idx[i] == math.floor(slot_start / win[i]) then
      back[i] = math.min(give[i], cnt[i])
    end
    cnt[i] = cnt[i] - back[i] + units[i]
  end
  store()
  if op == 'sync' then return extra end
  return settled_reply(back, charge)
end

local untl, reason = read_block()
if untl then return blocked_reply(untl, reason) end

if never then return decision(0, -1, never, remaining(), reset_after(), 0, 0, '') end

local wait, rule = 0, 0
for i = 1, n do
  if cost[i] > 0 and cnt[i] + cost[i] > lim[i] and window_end(i) > wait then
    wait, rule = window_end(i), i
  end
end
if wait > 0 then
  return decision(0, wait, rule, remaining(), reset_after(), 0, 0, '')
end
for i = 1, n do cnt[i] = cnt[i] + cost[i] end
if op == 'peek' then return decision(1, 0, 0, remaining(), reset_after(), 0, 0, '') end
store()
return decision(1, 0, 0, remaining(), reset_after(), now, now, '')
