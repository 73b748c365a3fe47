-- sliding_window.lua: counters in time buckets, for limits too large for an exact log
-- (100000/d). Each window is cut into `precision` buckets; every bucket that overlaps the window
-- counts in full, so no real window ever holds more than the limit, and at most one bucket's worth
-- of capacity is held back.
--
-- KEYS[1]  STRING of little-endian doubles: m_1, ..., m_n (how many buckets each rule keeps),
--          then rule 1's m_1 pairs bucket, count (oldest first), then rule 2's, and so on;
--          bucket = floor(us / bucket_us), bucket_us = ceil(window_us / precision). The key's
--          name carries a fingerprint of the rules, so other rules start afresh. One GET reads
--          it and one SET writes it with its expiry.
-- KEYS[2]  manual block (see common.lua)
-- ARGV     see common.lua; extra: precision.
--          Bookings are not supported: reserve and claim act as acquire. A rule charged 0 units
--          (another meter's call) neither decides nor counts.
-- Returns  see common.lua.
--
-- Settle: units not used go back to the bucket the reservation was counted in while that
-- bucket is still in the rule's window (an old one gives nothing back); use beyond the estimate
-- is counted in the current bucket, admitted or not.
-- @include common
-- @include packed
local key = KEYS[1]
local precision = extra
local floor = math.floor
-- live[i]: rule i's buckets inside its window, flat {bucket, count, bucket, count, ...}, oldest
-- first; cnt[i]: their sum
local P, lo, cur, live, cnt = {}, {}, {}, {}, {}
for i = 1, n do
  local p = ceil(win[i] / precision)
  P[i], lo[i], cur[i], cnt[i] = p, floor((now - win[i]) / p), floor(now / p), 0
end

local raw = redis.call('GET', key)
if raw then
  local m = #raw >= 8 * n and {struct.unpack(rules_format, raw)}  -- (n doubles)
  local size = 8 * n
  for i = 1, n do
    if not (m and m[i] >= 0 and m[i] % 1 == 0) then corrupt('sliding window state') end
    size = size + 16 * m[i]
  end
  if size ~= #raw then corrupt('sliding window state') end
  local pos = 8 * n + 1
  for i = 1, n do
    local len = 2 * m[i]
    if len > 0 then
      local v = {struct.unpack('<' .. string.rep('d', len), raw, pos)}
      pos, v[len + 1] = v[len + 1], nil
      -- the buckets that left the window are the oldest: dropped (for good when this call writes)
      local s = 1
      while s < len and v[s] < lo[i] do s = s + 2 end
      if s > 1 then v = {unpack(v, s, len)} end
      for j = 2, #v, 2 do cnt[i] = cnt[i] + v[j] end
      live[i] = v
    end
  end
end
for i = 1, n do live[i] = live[i] or {} end

-- Wait until rule i admits c more (0 if it does now).
local function wait_for(i, c)
  local need = cnt[i] + c - lim[i]
  if need <= 0 then return 0 end
  local v, freed = live[i], 0
  for j = 1, #v, 2 do
    freed = freed + v[j + 1]
    if freed >= need then return (v[j] + 1) * P[i] + win[i] - now end
  end
  return -1
end

-- Rule i's room now, in units (sync only: the other calls do not make it).
local room
if op == 'sync' then
  room = function(i) return max(0, lim[i] - cnt[i]) end
end

-- Count c more in rule i's current bucket, kept in order (a clock that stepped back may find
-- newer buckets after it).
local function count_now(i, c)
  cnt[i] = cnt[i] + c
  local v = live[i]
  local j = #v - 1
  while j > 0 and v[j] > cur[i] do j = j - 2 end
  if j > 0 and v[j] == cur[i] then
    v[j + 1] = v[j + 1] + c
  else
    table.insert(v, j + 2, cur[i])
    table.insert(v, j + 3, c)
  end
end

local function remaining()
  local best = nil
  for i = 1, n do
    local r = max(0, lim[i] - cnt[i])
    if best == nil or r < best then best = r end
  end
  return best
end

local function rule_reset(i)
  local v = live[i]
  if #v == 0 then return 0 end
  return max(0, (v[#v - 1] + 1) * P[i] + win[i] - now)
end

local function reset_after()
  local m = 0
  for i = 1, n do m = max(m, rule_reset(i)) end
  return m
end

-- Write the buckets back, or delete the key when nothing counts any more; returns reset_after().
local function store()
  local ttl = reset_after()
  if ttl <= 0 then
    if raw then redis.call('DEL', key) end
    return ttl
  end
  local out = {}
  for i = 1, n do out[i] = #live[i] / 2 end
  for i = 1, n do
    local v = live[i]
    for j = 1, #v do out[#out + 1] = v[j] end
  end
  redis.call('SET', key, pack_numbers(out), 'PX', ttl_ms(ttl))
  return ttl
end

if op == 'usage' then
  local per = {}
  for i = 1, n do
    per[#per + 1] = cnt[i]
    per[#per + 1] = max(0, wait_for(i, 1))
    per[#per + 1] = rule_reset(i)
  end
  return usage_reply(per)
end

-- Take up to c back from rule i's bucket of moment t (if it is still in the window); returns
-- what it took.
local function take_back(i, t, c)
  local b, v, kept, took = floor(t / P[i]), live[i], {}, 0
  for j = 1, #v, 2 do
    local left = v[j + 1]
    if v[j] == b then
      took = min(c, left)
      left = left - took
      cnt[i] = cnt[i] - took
    end
    if left > 0 then kept[#kept + 1], kept[#kept + 2] = v[j], left end
  end
  live[i] = kept
  return took
end

if op == 'refund' then
  if raw then
    for i = 1, n do take_back(i, slot_start, cost[i]) end
    store()
  end
  return 1
end

if op == 'settle' or op == 'sync' then
  local back, extra, units = {}, 0, charge
  if op == 'sync' then units, extra = sync_charge(room) end
  for i = 1, n do
    back[i] = op == 'settle' and take_back(i, slot_start, give[i]) or 0
    if units[i] > 0 then count_now(i, units[i]) end
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
  local w = cost[i] > 0 and wait_for(i, cost[i]) or 0
  if w > wait then wait, rule = w, i end
end
if wait > 0 then
  return decision(0, wait, rule, remaining(), reset_after(), 0, 0, '')
end
for i = 1, n do
  if cost[i] > 0 then count_now(i, cost[i]) end
end
if op == 'peek' then return decision(1, 0, 0, remaining(), reset_after(), 0, 0, '') end
local reset = store()
return decision(1, 0, 0, remaining(), reset, now, now, '')
