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
--          stamped at floor, which matters only when the clock steps back, or when bookings
--          alone fill the log past its cap); maxtol, the largest tolerance any booking used (how
--          much earlier than its stamp a booked task may start); Y_m, y below the oldest entry.
--          Entries that can count no more (at or before now minus the longest window) are
--          trimmed when the log is written. Past CAP entries, the past is merged two by two,
--          each pair at its newer stamp (see coarsen: stricter, never looser).
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
local FIRST = 32  -- entries in the first read (with meta and base when they follow); then one by one

-- A log written in governor's first layout (one stamp per unit, key suffix 'sl') becomes an
-- entry log under this key (suffix 'lg'): read once, left to expire (older workers may still
-- write it).
local function migrate()
  if not plain or string.sub(key, -3) ~= ':lg' then return end
  local old = string.sub(key, 1, -3) .. 'sl'
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

local first = redis.call('LRANGE', key, '0', fmt(FIRST * E + 1))
if #first == 0 then
  migrate()
  first = redis.call('LRANGE', key, '0', fmt(FIRST * E + 1))
end
local len = #first
if len == FIRST * E + 2 then len = redis.call('LLEN', key) end
local k, base, floor_us, maxtol, Y = 0, 0, nil, 0, {}
for m = 1, M do Y[m] = 0 end
if len > 0 then
  local meta, b = first[len - 1], first[len]
  if len > #first then
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
local dirty = false  -- meta changed (floor, maxtol, Y)

-- Entries read so far (0-based i): cs[i] the stamp in us, cy[i * M + m] its y for meter m.
local cs, cy, prefetched = {}, {}, FIRST  -- (entries still valid in `first`)
local function load(i)
  local raw, o = first, i * E
  if i >= prefetched then raw, o = redis.call('LRANGE', key, fmt(i * E), fmt(i * E + E - 1)), 0 end
  local v = tonumber(raw[o + 1])
  if not v then corrupt('sliding log') end
  cs[i] = (base + v) * 1000
  for m = 1, M do
    v = tonumber(raw[o + 1 + m])
    if not v then corrupt('sliding log') end
    cy[i * M + m] = v
  end
end

local function stamp(i)
  local v = cs[i]
  if v then return v end
  load(i)
  return cs[i]
end

local function y(i, m)
  if i >= k then return Y[m] end
  local v = cy[i * M + m]
  if v then return v end
  load(i)
  return cy[i * M + m]
end

-- Units of meter m in entries [a, b).
local function units(a, b, m)
  return y(a, m) - y(b, m) + (b - a)
end

local head = k > 0 and stamp(0) or floor_us  -- the newest stamp (else the floor), kept up to date

-- How many entries are stamped after t (strictly, or at or after t when `inclusive`).
local function above(t, inclusive)
  local lo, hi = 0, k
  if hi == 0 or stamp(0) < t or (stamp(0) == t and not inclusive) then return 0 end
  if stamp(hi - 1) > t or (inclusive and stamp(hi - 1) == t) then return hi end
  while lo < hi do
    local mid = (lo + hi - (lo + hi) % 2) / 2
    local e = stamp(mid)
    if e > t or (inclusive and e == t) then lo = mid + 1 else hi = mid end
  end
  return lo
end

-- The first entry in [lo, hi) stamped at or before t (hi if none), searched from hi down:
-- galloping (the answer is usually among the oldest entries looked at), then halving.
local function older(lo, hi, t)
  if lo >= hi or stamp(hi - 1) > t then return hi end
  local top, step = hi - 1, 1  -- stamp(top) <= t
  local bottom = top - 1
  while bottom >= lo and stamp(bottom) <= t do
    top, step = bottom, step * 2
    bottom = top - step
  end
  if bottom < lo - 1 then bottom = lo - 1 end  -- stamp(bottom) > t, or bottom before lo
  while top - bottom > 1 do
    local mid = (bottom + top - (bottom + top) % 2) / 2
    if stamp(mid) <= t then top = mid else bottom = mid end
  end
  return top
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
  if units(skip, k, m) <= room then return k end  -- the usual answer: there is room
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
  -- the entry at which the units reach the limit: if it is inside, the window is full
  local j = cut(skip, lim[i] - 1, meter[i])
  if j < k and stamp(j) > edge then return lim[i] end
  -- else the window ends at or before it: entries [skip, last) are inside
  local last = older(skip, j < k and j + 1 or k, edge)
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

-- The smallest room over the rules (after this call's cost when `after`). A rule that leaves
-- more than the best so far even if it counted every entry is not searched (unless a floor
-- may fill it).
local function remaining(after)
  local best = nil
  for i = 1, n do
    if best == 0 then break end
    local extra = after and cost[i] or 0
    if best == nil or floor_us or lim[i] - units(0, k, meter[i]) - extra < best then
      local r = max(0, lim[i] - used(i, now, 0) - extra)
      if best == nil or r < best then best = r end
    end
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
  -- the rewritten entries are known (what was read below them is read again if needed)
  local shift, ks, ky, out = #list - count, {}, {}, {}
  for j = #list, 1, -1 do  -- oldest first: LPUSH leaves the newest at the head
    local e = list[j]
    ks[j - 1] = e[1]
    for m = 1, M do
      below[m] = below[m] + e[m + 1] - 1
      ky[(j - 1) * M + m] = below[m]
    end
    for m = M, 1, -1 do out[#out + 1] = fmt(ky[(j - 1) * M + m]) end
    out[#out + 1] = fmt(e[1] / 1000 - base)
  end
  for j = 1, #out, 4000 do redis.call('LPUSH', key, unpack(out, j, min(#out, j + 3999))) end
  k, cs, cy, prefetched = k + shift, ks, ky, 0
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
    dirty = true
    redis.call('LSET', key, '-1', 'b' .. fmt(base))
  end
  local s = stamp_ms * 1000
  local pos = above(s, false)
  if pos == 0 and (k == 0 or stamp(0) < s) then
    -- the newest entry (the usual case): pushed at the head, nothing else moves
    local out, c = {}, {}
    for m = M, 1, -1 do
      c[m] = y(0, m) + w[m] - 1
      out[#out + 1] = fmt(c[m])
    end
    out[#out + 1] = fmt(stamp_ms - base)
    if not exists then
      redis.call('RPUSH', key, meta_text(), 'b' .. fmt(base))
      exists = true
    end
    redis.call('LPUSH', key, unpack(out))
    k, head, cs, cy, prefetched = k + 1, s, {[0] = s}, {}, 0
    for m = 1, M do cy[m] = c[m] end
    return
  end
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

-- Drop the entries from t on; the newest of them becomes the floor.
local function drop(t)
  floor_us = max(floor_us or stamp(t), stamp(t))
  for m = 1, M do Y[m] = y(t, m) end
  if t == 0 then redis.call('DEL', key) else redis.call('LTRIM', key, '0', fmt(t * E - 1)) end
  redis.call('RPUSH', key, meta_text(), 'b' .. fmt(base))
  k, dirty = t, false
  head = k > 0 and stamp(0) or floor_us
end

-- Drop the entries that can count no more: stamped at or before now minus the longest window
-- (before a new entry goes in, while what was read of the oldest is still at hand).
local function expire()
  local t = older(0, k, now - maxwin)
  if t < k then drop(t) end
end

-- Past the cap: halve the resolution of the past (entries stamped up to now), merging them two
-- by two from the oldest, each pair at its newer stamp (its units count a little later:
-- stricter, never looser); bookings keep their entries. One pass rewrites the past; it comes
-- again only after as many new entries. Without a past to merge, the oldest go below the floor.
local function coarsen()
  local p = above(now, false)
  local past = k - p
  if past >= 2 then
    local raw = redis.call('LRANGE', key, fmt(p * E), fmt(k * E - 1))
    local st, ws, below = {}, {}, {}  -- oldest first
    for m = 1, M do below[m] = Y[m] end
    for j = past, 1, -1 do
      local o = (j - 1) * E
      local v = tonumber(raw[o + 1])
      if not v then corrupt('sliding log') end
      local w = {}
      for m = 1, M do
        local yv = tonumber(raw[o + 1 + m])
        if not yv then corrupt('sliding log') end
        w[m] = yv - below[m] + 1
        below[m] = yv
      end
      st[#st + 1], ws[#ws + 1] = v, w
    end
    local ms, mw = {}, {}  -- merged, oldest first
    for j = 1, past, 2 do
      local w = ws[j]
      if j < past then
        for m = 1, M do w[m] = w[m] + ws[j + 1][m] end
      end
      ms[#ms + 1], mw[#mw + 1] = st[min(j + 1, past)], w
    end
    for m = 1, M do
      Y[m] = Y[m] - (past - #ms)
      below[m] = Y[m]
    end
    local ys = {}
    for j = 1, #ms do
      ys[j] = {}
      for m = 1, M do
        below[m] = below[m] + mw[j][m] - 1
        ys[j][m] = below[m]
      end
    end
    local out = {}
    for j = #ms, 1, -1 do  -- newest first, as the list keeps them
      out[#out + 1] = fmt(ms[j])
      for m = 1, M do out[#out + 1] = fmt(ys[j][m]) end
    end
    out[#out + 1] = meta_text()
    out[#out + 1] = 'b' .. fmt(base)
    if p == 0 then redis.call('DEL', key) else redis.call('LTRIM', key, '0', fmt(p * E - 1)) end
    for j = 1, #out, 4000 do redis.call('RPUSH', key, unpack(out, j, min(#out, j + 3999))) end
    k, cs, cy, prefetched, dirty = p + #ms, {}, {}, 0, false
    head = stamp(0)
  end
  if k > CAP then drop(CAP) end
end

-- Write meta, drop an empty log, set the expiry (when `counted`: something was added).
local function finish(counted)
  if not exists then return end
  if k == 0 and not floor_us then
    redis.call('DEL', key)
    return
  end
  if dirty then redis.call('LSET', key, fmt(k * E), meta_text()) end
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
  expire()
  insert(ceil(now / 1000), w)
  if k > CAP then coarsen() end
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
expire()
insert(stamp_ms, per_meter(cost))
if k > CAP then coarsen() end
if tol > maxtol then maxtol, dirty = tol, true end
finish(true)
if rem then return decision(1, 0, 0, rem, reset_after(), now, stamp_ms * 1000, '') end
return decision(0, slot - now, rule, remaining(false), reset_after(), slot, stamp_ms * 1000, '')
