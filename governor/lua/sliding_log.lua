-- sliding_log.lua: exact "at most N in any window of W" for several rules over one timestamp log.
--
-- KEYS[1]  LIST [stamp_0, ..., stamp_k-1, meta, base], stamps sorted newest first, in ms as
--          offsets from base ("b<absolute ms>", the last element; prefixed so that removing a
--          stamp by value can never hit it). Stamps round up to the ms, so
--          rounding only makes the limiter stricter. An admission is stamped when it runs; a
--          booking at the latest moment its holder may start (slot + tolerance), so the rules
--          hold on actual start times. Only the largest limit's worth of stamps is kept.
--          meta is "f<floor>:<maxtol_us>": floor, the offset of the newest stamp trimmed away
--          (empty if none; missing stamps count as stamped at floor, which matters only after
--          a refund), and maxtol, the largest tolerance any booking used (how much earlier
--          than its stamp a booked task may start).
-- KEYS[2]  manual block (see common.lua)
-- ARGV     see common.lua; no extras.
-- Returns  see common.lua.
--
-- A moment x can take `cost` more when, for every rule, the stamps inside
-- (x - W, x + W + tolerance + maxtol + 1 ms) leave room for it: any window of W that can hold
-- the new start lies in there (a stamp is at most maxtol + 1 ms after its start). Bookings far
-- ahead therefore do not crowd the present, and a request goes to the earliest such moment
-- (behind earlier bookings when they are near).
local key = KEYS[1]
-- One LRANGE reads a short log whole (stamps, meta, base); longer ones read the rest by LINDEX.
local FIRST = 64
local first = redis.call('LRANGE', key, 0, FIRST - 1)
local len = #first
if len == FIRST then len = redis.call('LLEN', key) end
local k, base, floor, maxtol = 0, 0, nil, 0
if len > 0 then
  local tail = len < FIRST and {first[len - 1], first[len]} or redis.call('LRANGE', key, -2, -1)
  local f, t = string.match(tail[1] or '', '^f(%-?%d*):(%d+)$')
  base = tonumber(string.match(tail[2] or '', '^b(%-?%d+)$') or '')
  if not (t and base) then corrupt('sliding log') end
  k, floor, maxtol = len - 2, tonumber(f), tonumber(t)
end

local cache = {}  -- stamps read so far, in us
-- Stamp of entry i (0-based, newest first) in us; past the stamps, the floor (or nil).
local function entry(i)
  if i >= k then return floor and (base + floor) * 1000 end
  local v = cache[i]
  if v == nil then
    v = tonumber(first[i + 1] or redis.call('LINDEX', key, i))
    if not v then corrupt('sliding log') end
    v = (base + v) * 1000
    cache[i] = v
  end
  return v
end

-- How many stamps are above t (strictly, or at or above t when `inclusive`).
local function above(t, inclusive)
  local lo, hi = 0, k
  while lo < hi do
    local mid = (lo + hi - (lo + hi) % 2) / 2
    local e = entry(mid)
    if e > t or (inclusive and e == t) then lo = mid + 1 else hi = mid end
  end
  return lo
end

-- Stamps counted by rule i for a start at x: inside (x - W, x + W + tol + maxtol), capped at
-- the limit (missing stamps below the floor fill it while the floor is inside).
local function used(i, x, tol)
  local skip = 0
  local horizon = x + win[i] + tol + maxtol + 1000
  if k > 0 and entry(0) >= horizon then skip = above(horizon, true) end
  local lo, hi = skip, math.min(k, skip + lim[i])
  local edge = x - win[i]
  -- the usual answers first: all of them inside (long windows) or none (short ones)
  if lo < hi and entry(hi - 1) > edge then lo = hi end
  if lo < hi and entry(lo) <= edge then hi = lo end
  while lo < hi do
    local mid = (lo + hi - (lo + hi) % 2) / 2
    if entry(mid) > edge then lo = mid + 1 else hi = mid end
  end
  if lo == k and floor and (base + floor) * 1000 > edge then return lim[i] end
  return lo - skip
end

-- The earliest moment >= t0 that can take cost more (see the header), and the rule that
-- denied at t0 longest (0 = none). nil if it keeps moving (bookings everywhere): then behind them all.
local function place(t0, tol)
  local x, denier = t0, 0
  for round = 1, 8 do
    local moved = false
    for i = 1, n do
      local horizon = x + win[i] + tol + maxtol + 1000
      local skip = 0
      if k > 0 and entry(0) >= horizon then skip = above(horizon, true) end
      local e = entry(skip + lim[i] - cost)
      if e and e + win[i] > x then
        x, moved = e + win[i], true
        if round == 1 then denier = i end  -- the last to move it waits longest
      end
    end
    if not moved then return x, denier end
  end
  return nil, denier
end

local function remaining(extra_cost)
  local best = nil
  for i = 1, n do
    local r = math.max(0, lim[i] - used(i, now, 0) - extra_cost)
    if best == nil or r < best then best = r end
  end
  return best or 0
end

local function reset_after()
  local head = entry(0)
  if not head then return 0 end
  return math.max(0, head + maxwin - now)
end

local function meta_text()
  return 'f' .. (floor and fmt(floor) or '') .. ':' .. fmt(maxtol)
end

local function rebase(nb)
  local vals = k > 0 and redis.call('LRANGE', key, 0, k - 1) or {}
  local out = {}
  for j = 1, #vals do
    local v = tonumber(vals[j])
    if not v then corrupt('sliding log') end
    out[j] = fmt(base + v - nb)
  end
  if floor then floor = base + floor - nb end
  out[#out + 1] = meta_text()
  out[#out + 1] = 'b' .. fmt(nb)
  redis.call('DEL', key)
  for j = 1, #out, 4000 do
    redis.call('RPUSH', key, unpack(out, j, math.min(#out, j + 3999)))
  end
  base, first = nb, {}
end

-- Put cost copies of stamp_ms in their sorted place, trim, and set the TTL.
local function insert(stamp_ms, tol)
  if len == 0 then
    base = stamp_ms
    redis.call('RPUSH', key, meta_text(), 'b' .. fmt(base))
    len = 2
  elseif math.abs(stamp_ms - base) > 2147483647 then
    rebase(stamp_ms)
  end
  local off = fmt(stamp_ms - base)
  local top = stamp_ms * 1000  -- the newest stamp after this
  if k > 0 and entry(0) > top then top = entry(0) end
  local at = top > stamp_ms * 1000 and above(stamp_ms * 1000, false) or 0
  if at == 0 then
    local left = cost
    while left > 0 do
      local m = math.min(left, 4000)
      local chunk = {}
      for j = 1, m do chunk[j] = off end
      redis.call('LPUSH', key, unpack(chunk))
      left = left - m
    end
  else
    -- before the first stamp not above it (or before meta): sorted order stays
    local pivot = at < k and fmt(entry(at) / 1000 - base) or meta_text()
    for _ = 1, cost do redis.call('LINSERT', key, 'BEFORE', pivot, off) end
  end
  k = k + cost
  cache, first = {[0] = top}, {}  -- the prefetched text is out of date now
  local meta_changed = tol > maxtol
  maxtol = math.max(maxtol, tol)
  if k > maxlim then
    -- the newest stamp trimmed (at index maxlim) stays behind as the floor
    floor = tonumber(redis.call('LINDEX', key, maxlim))
    redis.call('LTRIM', key, 0, maxlim + 1)
    k = maxlim
    redis.call('LSET', key, maxlim + 1, 'b' .. fmt(base))
    meta_changed = true
  end
  if meta_changed then redis.call('LSET', key, k, meta_text()) end
  len = k + 2
  redis.call('PEXPIRE', key, ttl_ms(top + maxwin - now))
end

-- Remove one booking or admission (cost copies) stamped stamp_us.
local function release(stamp_us)
  if len == 0 then return end
  local removed = redis.call('LREM', key, cost, fmt(stamp_us / 1000 - base))
  if removed > 0 then
    k = k - removed
    len = k + 2
    cache, first = {}, {}
    if k == 0 and not floor then
      redis.call('DEL', key)
      len, k, maxtol = 0, 0, 0
    end
  end
end

if op == 'usage' then
  local per = {}
  local head = entry(0)
  for i = 1, n do
    per[#per + 1] = used(i, now, 0)
    local skip = 0
    local horizon = now + win[i] + maxtol + 1000
    if k > 0 and head >= horizon then skip = above(horizon, true) end
    local e = entry(skip + lim[i] - 1)
    per[#per + 1] = e and math.max(0, e + win[i] - now) or 0
    per[#per + 1] = head and math.max(0, head + win[i] - now) or 0
  end
  -- bookings are the stamps after now (an admission is stamped at most 1 ms ahead); the log
  -- keeps the newest max-limit stamps, so it counts at most that many, but its head is the last
  local last = (head and head > now + 1000) and head or 0
  return usage_reply(per, above(now + 1000, false), last)
end

if op == 'refund' then
  release(slot_end)
  return 1
end

local untl, reason = read_block()
if untl then
  if op == 'claim' then release(slot_end) end
  return blocked_reply(untl, reason)
end

local never = never_rule()
if never then
  return decision(0, -1, never, remaining(0), reset_after(), 0, 0, '')
end

if op == 'claim' then
  if now < slot_start then
    return decision(0, slot_start - now, 0, remaining(0), reset_after(), slot_start, slot_end, '')
  end
  if now <= slot_end then
    return decision(1, 0, 0, remaining(0), reset_after(), slot_start, slot_end, '')
  end
  -- Late: ask again as a new arrival. The missed slot stays spent: a duplicate delivery may
  -- hold the same booking after it was used, and giving it back would forget a real start.
  op = 'reserve'
end

-- A lease is admitted now and stamped like a booking at now that may start up to span later.
local span = op == 'lease' and tol or 0
local at, rule = place(now, span)
if at and at <= now and (op ~= 'reserve' or not_before <= now) then
  local stamp = math.ceil((now + span) / 1000)
  local rem = remaining(cost)
  if op == 'peek' then return decision(1, 0, 0, rem, reset_after(), 0, 0, '') end
  insert(stamp, span)
  return decision(1, 0, 0, rem, reset_after(), now, stamp * 1000, '')
end
if op ~= 'reserve' then
  local wait = at and at - now or reset_after()
  return decision(0, wait, rule, remaining(0), reset_after(), 0, 0, '')
end

-- Reserve: the earliest moment from not_before on that is also one average interval (cost x the
-- shortest W/N among the rules) after the stamp before it, so a backlog runs evenly rather than
-- in bursts a worker pool could not start on time. Behind everyone if the bookings ahead are dense.
local gap = nil
for i = 1, n do
  local g = win[i] / lim[i]
  if gap == nil or g < gap then gap = g end
end
gap = math.ceil(gap * cost)

local function spaced(t0)
  local x = t0
  for _ = 1, 8 do
    x = place(x, tol)
    if not x then return nil end
    -- the stamp before ours (ours rounds up to the ms: an equal stamp is before it too)
    local before = above(math.ceil((x + tol) / 1000) * 1000, false)
    local prev = before < k and entry(before) or nil
    if not prev or prev - tol + gap <= x then return x end
    x = prev - tol + gap
  end
  return nil
end

local slot = spaced(math.max(now, not_before))
if not slot then
  local head = entry(0)
  local behind = math.max(now, not_before, head and head - tol + gap or now)
  slot = spaced(behind) or behind
end
if max_wait >= 0 and slot - now > max_wait then
  return decision(0, slot - now, rule, remaining(0), reset_after(), 0, 0, '')
end
local stamp = math.ceil((slot + tol) / 1000)
insert(stamp, tol)
return decision(0, slot - now, rule, remaining(0), reset_after(), slot, stamp * 1000, '')
