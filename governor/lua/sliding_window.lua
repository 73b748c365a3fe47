-- sliding_window.lua: counters in time buckets, for limits too large for an exact log
-- (100000/d). Each window is cut into `precision` buckets; every bucket that overlaps the window
-- counts in full, so no real window ever holds more than the limit, and at most one bucket's worth
-- of capacity is held back.
--
-- KEYS[1]  HASH: '_' = the rules' signature (other rules start afresh); '<i>:<bucket>' = count of
--          rule i in bucket floor(us / bucket_us), bucket_us = ceil(window_us / precision).
-- KEYS[2]  manual block (see common.lua)
-- ARGV     see common.lua; extra: precision. The packed rules are the signature.
--          Bookings are not supported: reserve and claim act as acquire.
-- Returns  see common.lua.
local key = KEYS[1]
local precision = extra
local sig = ARGV[1]
local P, lo, cur, buckets, cnt, here = {}, {}, {}, {}, {}, {}
for i = 1, n do
  P[i] = ceil(win[i] / precision)
  lo[i] = math.floor((now - win[i]) / P[i])
  cur[i] = math.floor(now / P[i])
  buckets[i], cnt[i], here[i] = {}, 0, 0  -- here: the count stored in the current bucket
end
local flat = redis.call('HGETALL', key)
local fresh = #flat == 0
local stale = {}
if not fresh then
  local same = false
  for j = 1, #flat, 2 do
    if flat[j] == '_' then same = flat[j + 1] == sig end
  end
  if not same then
    fresh = true  -- other rules: the old counters are dropped when this call writes
  else
    for j = 1, #flat, 2 do
      local f = flat[j]
      if f ~= '_' then
        local i, b = string.match(f, '^(%d+):(%-?%d+)$')
        local c = tonumber(flat[j + 1])
        i, b = tonumber(i), tonumber(b)
        if not (i and b and c) then corrupt('sliding window state') end
        if i < 1 or i > n or b < lo[i] then
          stale[#stale + 1] = f
        else
          local bs = buckets[i]
          bs[#bs + 1] = {b, c}
          cnt[i] = cnt[i] + c
          if b == cur[i] then here[i] = c end
        end
      end
    end
  end
end
local function older(x, y) return x[1] < y[1] end
for i = 1, n do
  if #buckets[i] > 1 then table.sort(buckets[i], older) end
end

-- Wait until rule i admits c more (0 if it does now).
local function wait_for(i, c)
  local need = cnt[i] + c - lim[i]
  if need <= 0 then return 0 end
  local freed = 0
  for _, bc in ipairs(buckets[i]) do
    freed = freed + bc[2]
    if freed >= need then return (bc[1] + 1) * P[i] + win[i] - now end
  end
  return -1
end

local function remaining()
  local best = nil
  for i = 1, n do
    local r = math.max(0, lim[i] - cnt[i])
    if best == nil or r < best then best = r end
  end
  return best
end

local function rule_reset(i)
  local bs = buckets[i]
  if #bs == 0 then return 0 end
  return math.max(0, (bs[#bs][1] + 1) * P[i] + win[i] - now)
end

local function reset_after()
  local m = 0
  for i = 1, n do m = math.max(m, rule_reset(i)) end
  return m
end

local function finish()
  if #stale > 0 then redis.call('HDEL', key, unpack(stale)) end
  local live = reset_after()
  if live <= 0 then redis.call('DEL', key) else redis.call('PEXPIRE', key, ttl_ms(live)) end
end

if op == 'usage' then
  local per = {}
  for i = 1, n do
    per[#per + 1] = cnt[i]
    per[#per + 1] = math.max(0, wait_for(i, 1))
    per[#per + 1] = rule_reset(i)
  end
  return usage_reply(per)
end

if op == 'refund' then
  if not fresh then
    for i = 1, n do
      local b = math.floor(slot_start / P[i])
      for _, bc in ipairs(buckets[i]) do
        if bc[1] == b then
          local left = math.max(0, bc[2] - cost)
          cnt[i] = cnt[i] - (bc[2] - left)
          bc[2] = left
          if left == 0 then redis.call('HDEL', key, i .. ':' .. fmt(b)) else
            redis.call('HSET', key, i .. ':' .. fmt(b), left) end
        end
      end
    end
    finish()
  end
  return 1
end

local untl, reason = read_block()
if untl then return blocked_reply(untl, reason) end

if never then return decision(0, -1, never, remaining(), reset_after(), 0, 0, '') end

local wait, rule = 0, 0
for i = 1, n do
  local w = wait_for(i, cost)
  if w > wait then wait, rule = w, i end
end
if wait > 0 then
  return decision(0, wait, rule, remaining(), reset_after(), 0, 0, '')
end
for i = 1, n do
  cnt[i] = cnt[i] + cost
  local bs = buckets[i]
  if #bs > 0 and bs[#bs][1] == cur[i] then
    bs[#bs][2] = bs[#bs][2] + cost
  elseif #bs == 0 or bs[#bs][1] < cur[i] then
    table.insert(bs, {cur[i], cost})
  end
end
if op ~= 'peek' then
  -- one HSET: every rule's current bucket (and the signature when starting afresh)
  local fields = fresh and {'_', sig} or {}
  if fresh and #flat > 0 then redis.call('DEL', key) end
  for i = 1, n do
    fields[#fields + 1] = string.format('%d:%d', i, cur[i])
    fields[#fields + 1] = fmt(here[i] + cost)
  end
  redis.call('HSET', key, unpack(fields))
  finish()
end
if op == 'peek' then return decision(1, 0, 0, remaining(), reset_after(), 0, 0, '') end
return decision(1, 0, 0, remaining(), reset_after(), now, now, '')
