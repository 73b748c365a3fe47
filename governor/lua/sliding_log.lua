-- sliding_log.lua: exact "at most N units in any window of W" for several rules, over one log
-- of weighted entries (a call of a thousand units is one entry, not a thousand stamps).
--
-- KEYS[1]  LIST, newest entry first, each entry its stamp then one number per meter, then meta
--          and base:  [s_0, y_0_1, ..., y_0_M, s_1, y_1_1, ..., y_1_M, ..., meta, base]
--          s: the entry's moment in ms as an offset from base ("b<absolute ms>"). Stamps round up
--          to the ms (rounding only makes the limiter stricter) and all the units stamped in
--          one ms are one entry, so stamps strictly decrease. An admission is stamped when it
--          runs; a booking at the latest moment its holder may start (slot + tolerance), so
--          the rules hold on actual start times.
--          y encodes the weights w (units per meter) as running sums from the oldest entry:
--          y_i = y_(i+1) + w_i - 1, so the units of meter m in entries [a, b) are
--          y_a - y_b + (b - a): two lookups for any range, a binary search for any window.
--          Calls of one unit leave y unchanged (small integers in Redis).
--          meta is "f<floor>:<maxtol>:<Y_1>,...,<Y_M>": floor, the offset of the newest entry
--          trimmed away (empty if none: entries missing below the log count as a full window
--          stamped at floor, which matters only when the clock steps back or the log hit its
--          cap); maxtol, the largest tolerance any booking used (how much earlier than its
--          stamp a booked task may start); Y_m, y below the oldest entry.
--          Entries that can count no more (at or before now minus the longest window) are
--          trimmed when the log is written; at most CAP entries are kept (past it the oldest
--          go below the floor: stricter, never looser).
-- KEYS[2]  manual block (see common.lua)
-- ARGV     see common.lua; no extras.
-- Returns  see common.lua.
--
-- A moment x can take cost_i more units under rule i when the units inside
-- (x - W, x + W + tolerance + maxtol + 1 ms) leave room for them: any window of W that can hold
-- the new start lies in there (a stamp is at most maxtol + 1 ms after its start). Bookings far
-- ahead therefore do not crowd the present, and a request goes to the earliest such moment
-- (behind earlier bookings when they are near).
--
-- Cost per call: O(log k) reads for k entries, whatever the units; an entry written before
-- b newer ones (a booking ahead of it) rewrites those b (one LTRIM and one LPUSH).
local key = KEYS[1]
local E = 1 + M  -- list elements per entry
local CAP = 20000  -- entries kept at most (governor.algorithms.MAX_LOG)
local FIRST = 64  -- one LRANGE reads a short log whole; longer ones are read by ranges

-- A log written in governor's first layout (one stamp per unit, key suffix 'sl') becomes an
-- entry log under this key: read once, left to expire (older workers may still write it).
local function migrate()
  if not plain or string.sub(key, -4) ~= ':sl2' then return end
  local old = string.sub(key, 1, -2)
  local vals = redis.call('LRANGE', old, '0', '-1')
  if #vals < 2 then return end
  local f, t = string.match(vals[#vals - 1], '^f(%-?%d*):(%d+)$')
  local b = string.match(vals[#vals], '^b(%-?%d+)$')
  if not (t and b) then return end
  local groups = {}  -- {offset, units}, newest first
  for i = 1, #vals - 2 do
    local v = tonumber(vals[i])
    if not v then return end
    local g = groups[#groups]
    if g and g[1] == v then g[2] = g[2] + 1 else groups[#groups + 1] = {v, 1} end
  end
  local ys, y = {}, 0
  for j = #groups, 1, -1 do
    y = y + groups[j][2] - 1
    ys[j] = y
  end
  local out = {}
  for j = 1, #groups do
    out[#out + 1] = fmt(groups[j][1])
    out[#out + 1] = fmt(ys[j])
  end
  out[#out + 1] = 'f' .. f .. ':' .. t .. ':0'
  out[#out + 1] = 'b' .. b
  for j = 1, #out, 4000 do redis.call('RPUSH', key, unpack(out, j, min(#out, j + 3999))) end
  local pttl = redis.call('PTTL', old)
  if pttl > 0 then redis.call('PEXPIRE', key, pttl) end
end

local first = redis.call('LRANGE', key, '0', fmt(FIRST - 1))
if #first == 0 then
  migrate()
  first = redis.call('LRANGE', key, '0', fmt(FIRST - 1))
end
local len = #first
if len == FIRST then len = redis.call('LLEN', key) end
local k, base, floor_us, maxtol, Y = 0, 0, nil, 0, {}
for m = 1, M do Y[m] = 0 end
if len > 0 then
  local meta, b = first[len - 1], first[len]
  if len >= FIRST then
    local tail = redis.call('LRANGE', key, '-2', '-1')
    meta, b = tail[1], tail[2]
  end
  local f, t, ys = string.match(meta or '', '^f(%-?%d*):(%d+):([%d,%-]+)$')
  base = tonumber(string.match(b or '', '^b(%-?%d+)$') or '')
  if not (t and base) or (len - 2) % E ~= 0 then corrupt('sliding log') end
  local m = 0
  for v in string.gmatch(ys, '[^,]+') do
    m = m + 1
    Y[m] = tonumber(v)
    if not Y[m] then corrupt('sliding log') end
  end
  if m ~= M then corrupt('sliding log') end
  k, maxtol = (len - 2) / E, tonumber(t)
  if f ~= '' then floor_us = (base + tonumber(f)) * 1000 end
end
local exists = len > 0

local cache = {}  -- entry i (0-based) -> {stamp_us, y_1, ..., y_M}
local function get(i)
  local e = cache[i]
  if e then return e end
  local at, raw = i * E, nil
  if at + E <= #first and at + E <= len - 2 then
    raw = {unpack(first, at + 1, at + E)}
  else
    raw = redis.call('LRANGE', key, fmt(at), fmt(at + E - 1))
  end
  e = {}
  for j = 1, E do
    e[j] = tonumber(raw[j])
    if not e[j] then corrupt('sliding log') end
  end
  e[1] = (base + e[1]) * 1000
  cache[i] = e
  return e
end

local function stamp(i)
  return get(i)[1]
end

local function y(i, m)
  if i >= k then return Y[m] end
  return get(i)[m + 1]
end

-- Units of meter m in entries [a, b).
local function units(a, b, m)
  return y(a, m) - y(b, m) + (b - a)
end

local head = k > 0 and stamp(0) or floor_us  -- the newest stamp (else the floor), kept up to date

-- How many entries are stamped after t (strictly, or at or after t when `inclusive`).
local function above(t, inclusive)
  local lo, hi = 0, k
  if hi > 0 and (stamp(hi - 1) > t or (inclusive and stamp(hi - 1) == t)) then return hi end
  while lo < hi do
    local mid = (lo + hi - (lo + hi) % 2) / 2
    local e = stamp(mid)
    if e > t or (inclusive and e == t) then lo = mid + 1 else hi = mid end
  end
  return lo
end

-- Entries at or beyond rule i's horizon for a start at x (too far ahead to share a window).
local function beyond(i, x, tol)
  local horizon = x + win[i] + tol + maxtol + 1000
  if k > 0 and head >= horizon then return above(horizon, true) end
  return 0
end

-- The first entry from `skip` on at which meter m's units pass `room`: the smallest j with
-- units(skip, j + 1) > room, or k if there is none.
local function cut(skip, room, m)
  local g = skip + room  -- where it is when every entry holds one unit (a count)
  if g < k and units(skip, g + 1, m) > room and (g == skip or units(skip, g, m) <= room) then
    return g
  end
  local lo, hi = skip, k
  while lo < hi do
    local mid = (lo + hi - (lo + hi) % 2) / 2
    if units(skip, mid + 1, m) > room then hi = mid else lo = mid + 1 end
  end
  return lo
end

-- Units counted by rule i for a start at x: inside (x - W, x + W + tol + maxtol), at most the
-- limit (a floor inside the window fills it).
local function used(i, x, tol)
  local skip, edge = beyond(i, x, tol), x - win[i]
  local last = above(edge, false)
  if last < skip then last = skip end
  if last == k and floor_us and floor_us > edge then return lim[i] end
  return min(lim[i], units(skip, last, meter[i]))
end

-- The earliest moment >= t0 that can take the cost (see the header), and the rule that
-- denied at t0 longest (0 = none). nil if it keeps moving (bookings everywhere).
local function place(t0, tol)
  local x, denier = t0, 0
  for round = 1, 8 do
    local moved = false
    for i = 1, n do
      if cost[i] > 0 then
        local j = cut(beyond(i, x, tol), lim[i] - cost[i], meter[i])
        local e = j < k and stamp(j) or floor_us  -- (past the entries only a floor counts)
        if e and e + win[i] > x then
          x, moved = e + win[i], true
          if round == 1 then denier = i end  -- the last to move it waits longest
        end
      end
    end
    if not moved then return x, denier end
  end
  return nil, denier
end

-- The smallest room over the rules (after this call's cost when `after`).
local function remaining(after)
  local best = nil
  for i = 1, n do
    local r = max(0, lim[i] - used(i, now, 0) - (after and cost[i] or 0))
    if best == nil or r < best then best = r end
  end
  return best or 0
end

local function reset_after()
  return head and max(0, head + maxwin - now) or 0
end

-- -- writing --------------------------------------------------------------------------------

local function meta_text()
  local ys = {}
  for m = 1, M do ys[m] = fmt(Y[m]) end
  local f = floor_us and fmt(floor_us / 1000 - base) or ''
  return 'f' .. f .. ':' .. fmt(maxtol) .. ':' .. table.concat(ys, ',')
end

-- Rewrite the newest `count` entries: edit(list) gets them as {stamp_us, w_1, ..., w_M} (units
-- per meter), newest first, and may change, add or remove entries (stamps strictly decreasing,
-- all after the entry below them); their y follow from the entry below.
local function rewrite(count, edit)
  if not exists then
    redis.call('RPUSH', key, meta_text(), 'b' .. fmt(base))
    exists, len = true, 2
  end
  local list = {}
  for i = 0, count - 1 do
    local e = {stamp(i)}
    for m = 1, M do e[m + 1] = y(i, m) - y(i + 1, m) + 1 end
    list[i + 1] = e
  end
  edit(list)
  local below = {}
  for m = 1, M do below[m] = y(count, m) end
  if count > 0 then redis.call('LTRIM', key, fmt(count * E), '-1') end
  local kept, out = {}, {}
  for i, e in pairs(cache) do
    if i >= count then kept[i - count + #list] = e end
  end
  for j = #list, 1, -1 do  -- oldest first: LPUSH leaves the newest at the head
    local e, c = list[j], {list[j][1]}
    for m = 1, M do
      below[m] = below[m] + e[m + 1] - 1
      c[m + 1] = below[m]
    end
    for m = M, 1, -1 do out[#out + 1] = fmt(c[m + 1]) end
    out[#out + 1] = fmt(e[1] / 1000 - base)
    kept[j - 1] = c
  end
  for j = 1, #out, 4000 do redis.call('LPUSH', key, unpack(out, j, min(#out, j + 3999))) end
  k, cache, first = k - count + #list, kept, {}
  head = k > 0 and stamp(0) or floor_us
end

-- Count w (units per meter) at stamp_ms, in the entry of that ms.
local function insert(stamp_ms, w)
  if not exists then base = stamp_ms end
  local far = math.abs(stamp_ms - base) > 2147483647
  for m = 1, M do far = far or (k > 0 and math.abs(y(0, m)) > 2 ^ 50) end
  if far then
    -- offsets must stay exact 32-bit integers and sums exact doubles: rewrite around a new base
    rewrite(k, function()
      base = stamp_ms
      for m = 1, M do Y[m] = 0 end
    end)
    redis.call('LSET', key, '-1', 'b' .. fmt(base))
  end
  local s = stamp_ms * 1000
  local pos = above(s, false)
  if pos < k and stamp(pos) == s then
    rewrite(pos + 1, function(list)
      for m = 1, M do list[pos + 1][m + 1] = list[pos + 1][m + 1] + w[m] end
    end)
  else
    rewrite(pos, function(list)
      local e = {s}
      for m = 1, M do e[m + 1] = w[m] end
      list[#list + 1] = e
    end)
  end
end

-- Take up to w (units per meter) back from the entry stamped stamp_us; what it took per meter,
-- or nil when there is no such entry.
local function take_back(stamp_us, w)
  local q = above(stamp_us, false)
  if q >= k or stamp(q) ~= stamp_us then return nil end
  local took = {}
  rewrite(q + 1, function(list)
    local e, left = list[q + 1], 0
    for m = 1, M do
      took[m] = min(w[m], e[m + 1])
      e[m + 1] = e[m + 1] - took[m]
      left = left + e[m + 1]
    end
    if left == 0 then table.remove(list, q + 1) end
  end)
  return took
end

-- Drop the entries that can count no more (stamped at or before now minus the longest window)
-- and those past the cap; the newest dropped becomes the floor.
local function trim()
  local t = k
  if k > 0 and stamp(k - 1) <= now - maxwin then t = above(now - maxwin, false) end
  if t > CAP then t = CAP end
  if t >= k then return end
  floor_us = max(floor_us or stamp(t), stamp(t))
  for m = 1, M do Y[m] = y(t, m) end
  if t == 0 then redis.call('DEL', key) else redis.call('LTRIM', key, '0', fmt(t * E - 1)) end
  redis.call('RPUSH', key, meta_text(), 'b' .. fmt(base))
  k = t
  head = k > 0 and stamp(0) or floor_us
end

-- Write meta, drop an empty log, set the expiry (when `counted`: something was added).
local function finish(counted)
  if not exists then return end
  if k == 0 and not floor_us then
    redis.call('DEL', key)
    return
  end
  redis.call('LSET', key, fmt(k * E), meta_text())
  if counted then redis.call('PEXPIRE', key, ttl_ms(head + maxwin - now)) end
end

-- Units per meter of a per-rule table (rules of one meter carry the same units).
local function per_meter(per_rule)
  local w = {}
  for m = 1, M do w[m] = 0 end
  for i = 1, n do w[meter[i]] = per_rule[i] end
  return w
end

-- Charge per-rule units now, admitted or not (settle's overrun, sync).
local function charge_now(per_rule)
  local w, any = per_meter(per_rule), false
  for m = 1, M do any = any or w[m] > 0 end
  if not any then return false end
  insert(ceil(now / 1000), w)
  trim()
  return true
end

-- -- operations -----------------------------------------------------------------------------

if op == 'usage' then
  local per = {}
  for i = 1, n do
    per[#per + 1] = used(i, now, 0)
    local j = cut(beyond(i, now, 0), lim[i] - 1, meter[i])
    local e = j < k and stamp(j) or floor_us
    per[#per + 1] = e and max(0, e + win[i] - now) or 0
    per[#per + 1] = head and max(0, head + win[i] - now) or 0
  end
  -- bookings are the entries after now (an admission is stamped at most 1 ms ahead), counted
  -- in the first meter's units
  local ahead = above(now + 1000, false)
  local last = (head and head > now + 1000) and head or 0
  return usage_reply(per, units(0, ahead, 1), last)
end

if op == 'settle' then
  local took = take_back(slot_end, per_meter(give))
  local back = {}
  for i = 1, n do
    -- given back to a rule whose window still holds the entry (an old one counts no more)
    back[i] = (took and slot_end > now - win[i]) and took[meter[i]] or 0
  end
  finish(charge_now(charge))
  return settled_reply(back, charge)
end

if op == 'sync' then
  local per_rule, extra = sync_charge(function(i) return max(0, lim[i] - used(i, now, 0)) end)
  finish(charge_now(per_rule))
  return extra
end

local untl, reason
if op ~= 'refund' then untl, reason = read_block() end
if op == 'refund' or (untl and op == 'claim') then
  -- give back one booking or admission (its units at its stamp, slot_end)
  take_back(slot_end, per_meter(cost))
  finish(false)
  if op == 'refund' then return 1 end
end
if held_by(untl) then return blocked_reply(untl, reason) end

if never then
  return decision(0, -1, never, remaining(false), reset_after(), 0, 0, '')
end

if op == 'claim' then
  if now < slot_start then
    return decision(0, slot_start - now, 0, remaining(false), reset_after(), slot_start, slot_end, '')
  end
  if now <= slot_end then
    return decision(1, 0, 0, remaining(false), reset_after(), slot_start, slot_end, '')
  end
  -- Late: ask again as a new arrival. The missed slot stays spent: a duplicate delivery may
  -- hold the same booking after it was used, and giving it back would forget a real start.
  op = 'reserve'
end

-- A lease is admitted now and stamped like a booking at now that may start up to span later.
local span = op == 'lease' and tol or 0
local at, rule = place(now, span)
local slot, rem = now, nil  -- where the new entry goes; rem: admitted now, what remains
if at and at <= now and (op ~= 'reserve' or not_before <= now) then
  rem = remaining(true)
  if op == 'peek' then return decision(1, 0, 0, rem, reset_after(), 0, 0, '') end
  tol = span  -- stamped as a booking at now (0 unless leasing)
elseif op ~= 'reserve' then
  local wait = at and at - now or reset_after()
  return decision(0, wait, rule, remaining(false), reset_after(), 0, 0, '')
else
  -- Reserve: the earliest moment from not_before on that is also one average interval (the
  -- shortest of cost x W/N among the rules) after the entry before it, so a backlog runs evenly
  -- rather than in bursts a worker pool could not start on time. Behind everyone if bookings
  -- are dense.
  local gap = nil
  for i = 1, n do
    local g = cost[i] > 0 and win[i] / lim[i] * cost[i] or nil
    if g and (gap == nil or g < gap) then gap = g end
  end
  gap = ceil(gap or 0)

  local function spaced(t0)
    local x = t0
    for _ = 1, 8 do
      x = place(x, tol)
      if not x then return nil end
      -- the entry before ours (ours rounds up to the ms: an equal stamp is before it too)
      local before = above(ceil((x + tol) / 1000) * 1000, false)
      local prev = before < k and stamp(before) or nil
      if not prev or prev - tol + gap <= x then return x end
      x = prev - tol + gap
    end
    return nil
  end

  slot = spaced(max(now, not_before))
  if not slot then
    local behind = max(now, not_before, head and head - tol + gap or now)
    slot = spaced(behind) or behind
  end
  if max_wait >= 0 and slot - now > max_wait then
    return decision(0, slot - now, rule, remaining(false), reset_after(), 0, 0, '')
  end
end

-- Count it in the entry of the ms it may start by; trim; write meta and the expiry.
local stamp_ms = ceil((slot + tol) / 1000)
insert(stamp_ms, per_meter(cost))
if tol > maxtol then maxtol = tol end
trim()
finish(true)
if rem then return decision(1, 0, 0, rem, reset_after(), now, stamp_ms * 1000, '') end
return decision(0, slot - now, rule, remaining(false), reset_after(), slot, stamp_ms * 1000, '')
