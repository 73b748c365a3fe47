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
--          Once a header sync found another client spending, meta goes on with the headroom's
--          state, ":h<t_1>/<A_1>,...,<t_M>/<A_M>" (below; t in us, A in units; A = 0: none for
--          that meter); it is dropped when every A is 0 again.
-- KEYS[2]  manual block (see common.lua)
-- ARGV     see common.lua; no extras.
-- Returns  see common.lua.
--
-- Headroom (header sync). A sync whose reading shows units the log did not count (another
-- client spends the same quota) charges them at the reading (common.lua), and keeps per meter,
-- apart from the log: t, the latest reading's moment, and A, what readings found, fading with
-- the time between them: A <- floor(A * (T - d) / T) + found (0 after a whole T), at most L,
-- for d the time since the previous reading, T the meter's shortest window and L its limit.
-- With readings every d finding the other client's spending, A is what it spends in a window
-- of T, and A / T its rate. A decision then keeps free, under each rule i of the meter, what
-- the other client is projected to have spent since the latest reading, which no reading
-- shows yet: H_i(x) = floor(A * min(x - t, W_i) / T) at moment x (0 before t), never more
-- than the limit less the call's units (no call waits forever for it). The next reading
-- counts that spending in the log and starts H again from 0; readings that find nothing let A
-- fade. Headroom only makes decisions stricter and is not counted: syncs compare the log alone,
-- usage shows the log. H grows with x, so a moment found for later (a retry-after, a booking)
-- must hold its own: the search moves on while the room at the moment found is short (16
-- steps, then once more with the most any moment keeps, floor(A * W_i / T)).
--
-- A moment x can take cost_i more units under rule i when the units inside
-- (x - W, x + W + tolerance + maxtol + 1 ms) leave room for them: any window of W that can hold
-- the new start lies in there (a stamp is at most maxtol + 1 ms after its start). Bookings far
-- ahead therefore do not crowd the present, and a request goes to the earliest such moment
-- (behind earlier bookings when they are near).
--
-- Cost per call: O(log k) reads for k entries, whatever the units; an entry written before
-- b newer ones (a booking ahead of it) rewrites those b (one LTRIM and one LPUSH).
--
-- Speed: Lua makes every closure afresh on each call, at a price that grows with what it
-- captures. The usual decision (acquire, peek or a reserve for now, on a log of one-unit
-- entries with nothing ahead) is decided inline and written at the head with no function made;
-- the general way makes its searches, and only the calls that rewrite the log make the writers
-- (see the sections below; docs/benchmarks.md has the figures).
-- @include common
local key = KEYS[1]
local E = 1 + M  -- list elements per entry
local CAP = 20000  -- entries kept at most (governor.algorithms.MAX_LOG)
local FIRST = 32  -- entries in the first read (with meta and base when they follow); then one by one
-- Entries that can count no more (at or before now minus the longest window) are dropped when
-- a write leaves the log with more than KEEP entries: a log as short as its largest limit (as
-- the stamp log was) keeps them, so most writes touch only its head. They lie outside every
-- window while the clock goes forward, and count exactly if it steps back.
local KEEP = min(maxlim, FIRST)

local first = redis.call('LRANGE', key, '0', E == 2 and '65' or fmt(FIRST * E + 1))
if #first == 0 and plain and string.sub(key, -3) == ':lg' then
  -- A log written in governor's first layout (one stamp per unit, key suffix 'sl') becomes an
  -- entry log under this key (suffix 'lg'): read once, left to expire (older workers may still
  -- write it).
  local old = string.sub(key, 1, -3) .. 'sl'
  local vals = redis.call('LRANGE', old, '0', '-1')
  local f, t, b
  if #vals >= 2 then
    f, t = string.match(vals[#vals - 1], '^f(%-?%d*):(%d+)$')
    b = string.match(vals[#vals], '^b(%-?%d+)$')
  end
  local groups = {}  -- {offset, units}, newest first
  for i = 1, (t and b) and #vals - 2 or 0 do
    local v = tonumber(vals[i])
    if not v then
      groups = nil
      break
    end
    local g = groups[#groups]
    if g and g[1] == v then g[2] = g[2] + 1 else groups[#groups + 1] = {v, 1} end
  end
  if t and b and groups then
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
    first = redis.call('LRANGE', key, '0', fmt(FIRST * E + 1))
  end
end
local len = #first
if len == FIRST * E + 2 then len = redis.call('LLEN', key) end
local k, base, floor_us, maxtol, Y = 0, 0, nil, 0, {}
for m = 1, M do Y[m] = 0 end
local hr = nil  -- the headroom's state (see the header): {t = {t_m}, a = {A_m}}, or nil (none)
if len > 0 then
  local meta, b = first[len - 1], first[len]
  if len > #first then
    local tail = redis.call('LRANGE', key, '-2', '-1')
    meta, b = tail[1], tail[2]
  end
  local f, t, ys = string.match(meta or '', '^f(%-?%d*):(%d+):([%d,%-]+)$')
  if not t then  -- (a log with headroom: its state follows)
    local h
    f, t, ys, h = string.match(meta or '', '^f(%-?%d*):(%d+):([%d,%-]+):h([%d/,]+)$')
    if h then
      hr = {t = {}, a = {}}
      local m, any = 0, false
      for ht, ha in string.gmatch(h, '(%d+)/(%d+)') do
        m = m + 1
        hr.t[m], hr.a[m] = tonumber(ht), tonumber(ha)
        any = any or hr.a[m] > 0
      end
      if m ~= M then corrupt('sliding log') end
      if not any then hr = nil end
    end
  end
  base = tonumber(string.match(b or '', '^b(%-?%d+)$') or '')
  if not (t and base) or (len - 2) % E ~= 0 then corrupt('sliding log') end
  if M == 1 then
    Y[1] = tonumber(ys)
    if not Y[1] then corrupt('sliding log') end
  else
    local m = 0
    for v in string.gmatch(ys, '[^,]+') do
      m = m + 1
      Y[m] = tonumber(v)
      if not Y[m] then corrupt('sliding log') end
    end
    if m ~= M then corrupt('sliding log') end
  end
  k, maxtol = (len - 2) / E, tonumber(t)
  if f ~= '' then floor_us = (base + tonumber(f)) * 1000 end
end
local exists = len > 0
local dirty = false  -- meta changed (floor, maxtol, Y, the headroom's state)

-- The headroom (see the header), made only for a log that has some (and a sync): shortest()
-- per meter, the window T and limit L of its shortest rule (the smallest limit of rules as
-- short); spare(i, x) what rule i keeps free at moment x; most(i) the most it keeps at any.
local spare, most, shortest = nil, nil, nil
if hr or op == 'sync' then
  shortest = function()
    local w, l = {}, {}
    for i = 1, n do
      local m = meter[i]
      if not w[m] or win[i] < w[m] or win[i] == w[m] and lim[i] < l[m] then
        w[m], l[m] = win[i], lim[i]
      end
    end
    return w, l
  end
end
if hr then
  hr.w = shortest()
  spare = function(i, x)
    local m = meter[i]
    local a, d = hr.a[m], x - hr.t[m]
    if a == 0 or d <= 0 then return 0 end
    if d > win[i] then d = win[i] end
    return max(0, min(lim[i] - cost[i], math.floor(a * d / hr.w[m])))
  end
  most = function(i)
    local m = meter[i]
    return max(0, min(lim[i] - cost[i], math.floor(hr.a[m] * win[i] / hr.w[m])))
  end
end

-- The entries (0-based i, newest first): S[i] the stamp in us, Yv[i * M + m] its y for meter m,
-- and Yv[k * M + m] = Y[m] (below the oldest). An entry is parsed when first looked at, from
-- `first` while it holds the entry, else read alone: by at() in the usual decision, by a
-- metamethod (fetch) the general way.
local S, Yv, fetched, shift = {}, {}, FIRST, 0  -- (entry i is `first`'s entry i - shift)
for m = 1, M do Yv[k * M + m] = Y[m] end
if k > 0 then  -- the newest entry, which every call looks at
  local v, y = tonumber(first[1]), tonumber(first[2])
  if not (v and y) then corrupt('sliding log') end
  S[0], Yv[1] = (base + v) * 1000, y
end
-- Whether every entry holds one unit (one meter, y the same throughout): then the units of
-- entries [a, b) are b - a, and no search needs the y of any entry.
local uniform = M == 1 and Yv[1] == Y[1]

local head = k > 0 and S[0] or floor_us  -- the newest stamp (else the floor), kept up to date

-- -- the usual decision, inline ----------------------------------------------------------------
-- acquire, peek, or a reserve for now, on a log whose entries are one unit each and lie in
-- the past, with its entry to go at the head: admitted or denied here (the functions below,
-- made on every call that needs them, are not made), as the stamp log did. Anything else (a
-- booking, weighted entries, entries ahead, a block) goes the general way below.

local untl, reason = nil, nil
if op ~= 'usage' and op ~= 'refund' and op ~= 'settle' and op ~= 'sync' then
  untl, reason = read_block()
end
local stamp_ms, rem, slot, rule = nil, nil, now, 0
local fast = (op == 'acquire' or op == 'peek' or op == 'reserve' and not_before <= now)
  and uniform and not untl and not never and not hr
if fast then
  -- (an entry's stamp is parsed where it is looked at, S[j] or ..., the newest first: no
  -- function is made for it)
  stamp_ms = ceil(now / 1000)
  fast = k == 0 or S[0] < stamp_ms * 1000  -- nothing ahead (its entry would be the newest)
end
-- When it can take the cost: place() with nothing ahead settles in its first round, at the
-- latest moment a rule asks for (the last rule to move it denies).
local at, denier = now, 0
for i = 1, fast and n or 0 do
  local j = lim[i] - cost[i]
  local e = j < k and (S[j] or (base + (tonumber(j < FIRST and first[j * E + 1]
    or redis.call('LINDEX', key, fmt(j * E))) or corrupt('sliding log'))) * 1000) or floor_us
  if cost[i] > 0 and e and e + win[i] > at then at, denier = e + win[i], i end
end
if at > now and op == 'reserve' then fast = false end  -- a booking: the general way
if fast then
  -- what remains (after it, if admitted: remaining(), each rule's used() by index)
  local best, admitted = nil, at <= now
  for i = 1, n do
    if best == 0 then break end
    local l, c = lim[i], admitted and cost[i] or 0
    if best == nil or floor_us or l - k - c < best then
      -- the first of the newest l entries at or before the edge (l if none: full)
      local edge, lo, hi = now - win[i], 0, l > k and k or l
      while lo < hi do
        local mid = (lo + hi - (lo + hi) % 2) / 2
        local e = S[mid] or (base + (tonumber(mid < FIRST and first[mid * E + 1]
          or redis.call('LINDEX', key, fmt(mid * E))) or corrupt('sliding log'))) * 1000
        if e > edge then lo = mid + 1 else hi = mid end
      end
      local u = lo
      if lo == k and floor_us and floor_us > edge then u = l end
      local r = max(0, l - u - c)
      if best == nil or r < best then best = r end
    end
  end
  rem = best or 0
  if not admitted or op == 'peek' then
    local reset = head and max(0, head + maxwin - now) or 0
    if admitted then return decision(1, 0, 0, rem, reset, 0, 0, '') end
    return decision(0, at - now, denier, rem, reset, 0, 0, '')
  end
  -- admitted: written by the usual write below (see there), once the entries that can count
  -- no more are dropped as drop() does when the log grows past KEEP (their y is Y: only the
  -- floor changes); a log that needs a new base, or to be merged, is decided again the
  -- general way
  tol = 0
  fast = not exists or stamp_ms - base <= 2147483647 and base - stamp_ms <= 2147483647
    and Y[1] <= 2 ^ 50 and Y[1] >= -2 ^ 50
  local edge = now - maxwin
  if fast and k >= KEEP and k > 0 and (S[k - 1] or (base + (tonumber(
      k <= FIRST and first[k * E - E + 1] or redis.call('LINDEX', key, fmt(k * E - E)))
      or corrupt('sliding log'))) * 1000) <= edge then
    local lo, hi, e = 0, k - 1, nil  -- the newest entry at or before the edge
    while lo < hi do
      local mid = (lo + hi - (lo + hi) % 2) / 2
      e = S[mid] or (base + (tonumber(mid < FIRST and first[mid * E + 1]
        or redis.call('LINDEX', key, fmt(mid * E))) or corrupt('sliding log'))) * 1000
      if e > edge then lo = mid + 1 else hi = mid end
    end
    e = S[lo] or (base + (tonumber(lo < FIRST and first[lo * E + 1]
      or redis.call('LINDEX', key, fmt(lo * E))) or corrupt('sliding log'))) * 1000
    floor_us = max(floor_us or e, e)
    if lo == 0 then redis.call('DEL', key) else redis.call('LTRIM', key, '0', fmt(lo * E - 1)) end
    redis.call('RPUSH', key, 'f' .. fmt(floor_us / 1000 - base) .. ':' .. fmt(maxtol) .. ':'
      .. fmt(Y[1]), 'b' .. fmt(base))
    k = lo
    Yv[k + 1], head = Y[1], k > 0 and S[0] or floor_us
  end
  if not (fast and k < CAP) then stamp_ms, rem, fast = nil, nil, false end
end

-- -- the general way -------------------------------------------------------------------------

local lazy, above, older, cut, used, place, remaining
if not fast then
  local function fetch(t, j)
    local i, o = j, 1  -- entry i's element o (1: its stamp, 1 + m: its y for meter m)
    if t ~= S then
      o = (j - 1) % M + 2
      i = (j - o + 1) / M
    end
    if i >= k then return nil end
    local v
    if i >= shift and i - shift < fetched then
      v = first[(i - shift) * E + o]
    else
      v = redis.call('LINDEX', key, fmt(i * E + o - 1))
    end
    v = tonumber(v)
    if not v then corrupt('sliding log') end
    if o == 1 then v = (base + v) * 1000 end
    t[j] = v
    return v
  end
  lazy = {__index = fetch}
  setmetatable(S, lazy)
  setmetatable(Yv, lazy)

  -- How many entries are stamped after t (strictly, or at or after t when `inclusive`).
  above = function(t, inclusive)
    if k == 0 then return 0 end
    local e = S[0]
    if e < t or (e == t and not inclusive) then return 0 end
    e = S[k - 1]
    if e > t or (inclusive and e == t) then return k end
    local lo, hi = 0, k
    while lo < hi do
      local mid = (lo + hi - (lo + hi) % 2) / 2
      e = S[mid]
      if e > t or (inclusive and e == t) then lo = mid + 1 else hi = mid end
    end
    return lo
  end

  -- The first entry in [lo, hi) stamped at or before t (hi if none), searched from hi down:
  -- galloping (the answer is usually among the oldest entries looked at), then halving.
  older = function(lo, hi, t)
    if lo >= hi or S[hi - 1] > t then return hi end
    local top, step = hi - 1, 1  -- S[top] <= t
    local bottom = top - 1
    while bottom >= lo and S[bottom] <= t do
      top, step = bottom, step * 2
      bottom = top - step
    end
    if bottom < lo - 1 then bottom = lo - 1 end  -- S[bottom] > t, or bottom before lo
    while top - bottom > 1 do
      local mid = (bottom + top - (bottom + top) % 2) / 2
      if S[mid] <= t then top = mid else bottom = mid end
    end
    return top
  end

  -- Rule i's window for a start at x ends before its horizon, x + W + tol + maxtol + 1 ms
  -- (entries stamped from it on are too far ahead to share a window: they are skipped).
  -- The units of meter m in entries [a, b) are Yv[a * M + m] - Yv[b * M + m] + (b - a).

  -- The first entry from `skip` on at which meter m's units pass `room`: the smallest j with
  -- units(skip, j + 1) > room, or k if there is none.
  cut = function(skip, room, m)
    if uniform then
      local j = room > 0 and skip + room or skip
      return j < k and j or k
    end
    local top = Yv[skip * M + m] - skip  -- units(skip, j) = top - Yv[j * M + m] + j
    if top - Yv[k * M + m] + k <= room then return k end  -- the usual answer: there is room
    local g = skip + room  -- where it is when every entry holds one unit (a count)
    if g < k and top - Yv[(g + 1) * M + m] + g + 1 > room
      and (g == skip or top - Yv[g * M + m] + g <= room) then
      return g
    end
    local lo, hi = skip, k
    while lo < hi do
      local mid = (lo + hi - (lo + hi) % 2) / 2
      if top - Yv[(mid + 1) * M + m] + mid + 1 > room then hi = mid else lo = mid + 1 end
    end
    return lo
  end

  -- Units counted by rule i for a start at x: inside (x - W, x + W + tol + maxtol), at most the
  -- limit (a floor inside the window fills it).
  used = function(i, x, tol)
    local skip, edge, m, l = 0, x - win[i], meter[i], lim[i]
    local horizon = x + win[i] + tol + maxtol + 1000
    if k > 0 and head >= horizon then skip = above(horizon, true) end
    -- the entry at which the units reach the limit: if it is inside, the window is full
    local j = skip + l - 1
    if not uniform then j = cut(skip, l - 1, m) end
    if j < k and S[j] > edge then return l end
    -- else the window ends at or before it: entries [skip, last) are inside
    local last = older(skip, j < k and j + 1 or k, edge)
    if last == k and floor_us and floor_us > edge then return l end
    if uniform then return min(l, last - skip) end
    return min(l, Yv[skip * M + m] - Yv[last * M + m] + last - skip)
  end

  -- With headroom: the earliest moment from x on whose room under rule i holds the cost and
  -- that moment's own headroom, which grows with the moment: moved on while it does not (16
  -- steps, then once more with the most any moment keeps; see the header). place() and
  -- remaining() are handed the headroom by wrappers made only then: without it, they capture
  -- nothing more (a closure costs per variable it captures, on every call).
  local beyond = nil
  if hr then
    beyond = function(i, x, tol)
      local y, room = x, lim[i] - cost[i]
      local steps = hr.a[meter[i]] > 0 and 17 or 1  -- (a meter without: one step, as before)
      for step = 1, steps do
        local h = steps == 1 and 0 or step < 17 and spare(i, y) or most(i)
        local skip, horizon = 0, y + win[i] + tol + maxtol + 1000
        if k > 0 and head >= horizon then skip = above(horizon, true) end
        local j = cut(skip, room - h, meter[i])
        local e = j < k and S[j] or floor_us  -- (past the entries only a floor counts)
        if not (e and e + win[i] > y) then return y end
        y = e + win[i]
      end
      return y
    end
  end

  -- The earliest moment >= t0 that can take the cost (see the header; with headroom, `beyond`),
  -- and the rule that denied at t0 longest (0 = none). nil if it keeps moving (bookings
  -- everywhere).
  place = function(t0, tol, beyond)
    local x, denier = t0, 0
    for round = 1, 8 do
      local moved = false
      for i = 1, n do
        if cost[i] > 0 and beyond then
          local y = beyond(i, x, tol)
          if y > x then
            x, moved = y, true
            if round == 1 then denier = i end
          end
        elseif cost[i] > 0 then
          local skip, horizon = 0, x + win[i] + tol + maxtol + 1000
          if k > 0 and head >= horizon then skip = above(horizon, true) end
          local j = skip + lim[i] - cost[i]  -- (where cut finds it when every entry is one unit)
          if not uniform then j = cut(skip, lim[i] - cost[i], meter[i]) end
          local e = j < k and S[j] or floor_us  -- (past the entries only a floor counts)
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

  -- The smallest room over the rules (after this call's cost when `after`, less what each
  -- keeps free when `spare`). A rule that leaves more than the best so far even if it counted
  -- every entry is not searched (unless a floor may fill it).
  remaining = function(after, spare)
    local best = nil
    for i = 1, n do
      if best == 0 then break end
      local extra, m = after and cost[i] or 0, meter[i]
      if spare then extra = extra + spare(i, now) end  -- (what the rule keeps free)
      if best == nil or floor_us or lim[i] - (Yv[m] - Yv[k * M + m] + k) - extra < best then
        local r = max(0, lim[i] - used(i, now, 0) - extra)
        if best == nil or r < best then best = r end
      end
    end
    return best or 0
  end

  if hr then
    local place_in, remaining_in = place, remaining
    place = function(t0, tol) return place_in(t0, tol, beyond) end
    remaining = function(after) return remaining_in(after, spare) end
  end
end

if op == 'usage' then
  local per = {}
  for i = 1, n do
    per[#per + 1] = used(i, now, 0)
    local skip, horizon = 0, now + win[i] + maxtol + 1000
    if k > 0 and head >= horizon then skip = above(horizon, true) end
    local j = cut(skip, lim[i] - 1, meter[i])
    local e = j < k and S[j] or floor_us
    per[#per + 1] = e and max(0, e + win[i] - now) or 0
    per[#per + 1] = head and max(0, head + win[i] - now) or 0
  end
  -- bookings are the entries after now (an admission is stamped at most 1 ms ahead), counted
  -- in the first meter's units
  local ahead = above(now + 1000, false)
  local last = (head and head > now + 1000) and head or 0
  return usage_reply(per, Yv[1] - Yv[ahead * M + 1] + ahead, last)
end

-- -- deciding --------------------------------------------------------------------------------
-- A decision is worked out before anything is written: stamp_ms is where this call's cost goes
-- (nil: nothing), rem what remains if it is admitted now. settle, sync and refund write below.

if fast or op == 'settle' or op == 'sync' or op == 'refund' or (untl and op == 'claim') then
  -- (decided above; or written below, with the writers)
elseif held_by(untl) then
  return blocked_reply(untl, reason)
elseif never then
  return decision(0, -1, never, remaining(false), head and max(0, head + maxwin - now) or 0,
    0, 0, '')
else
  if op == 'claim' then
    local reset = head and max(0, head + maxwin - now) or 0
    if now < slot_start then
      return decision(0, slot_start - now, 0, remaining(false), reset, slot_start, slot_end, '')
    end
    if now <= slot_end then
      return decision(1, 0, 0, remaining(false), reset, slot_start, slot_end, '')
    end
    -- Late: ask again as a new arrival. The missed slot stays spent: a duplicate delivery may
    -- hold the same booking after it was used, and giving it back would forget a real start.
    op = 'reserve'
  end
  -- A lease is admitted now and stamped like a booking at now that may start up to span later.
  local span = op == 'lease' and tol or 0
  local at
  at, rule = place(now, span)
  if at and at <= now and (op ~= 'reserve' or not_before <= now) then
    rem = remaining(true)
    if op == 'peek' then
      return decision(1, 0, 0, rem, head and max(0, head + maxwin - now) or 0, 0, 0, '')
    end
    tol = span  -- stamped as a booking at now (0 unless leasing)
  elseif op ~= 'reserve' then
    local reset = head and max(0, head + maxwin - now) or 0
    return decision(0, at and at - now or reset, rule, remaining(false), reset, 0, 0, '')
  else
    -- Reserve: the earliest moment from not_before on that is also one average interval (the
    -- shortest of cost x W/N among the rules) after the entry before it, so a backlog runs
    -- evenly rather than in bursts a worker pool could not start on time. Behind everyone if
    -- bookings are dense.
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
        local prev = before < k and S[before] or nil
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
      return decision(0, slot - now, rule, remaining(false),
        head and max(0, head + maxwin - now) or 0, 0, 0, '')
    end
  end
  -- counted in the entry of the ms it may start by
  stamp_ms = ceil((slot + tol) / 1000)
end

-- The usual write, inline: a new log, or this call's entry the newest of one that keeps its
-- base and meta, where nothing is to expire (the usual decision dropped what was). Anything
-- else takes the writers below.
local s = stamp_ms and stamp_ms * 1000
if s and (fast or not exists or ((k == 0 or S[0] < s) and tol <= maxtol
    and (k < KEEP or k < CAP and S[k - 1] > now - maxwin)
    and stamp_ms - base <= 2147483647 and base - stamp_ms <= 2147483647)) then
  local ys, near = {cost[1] - 1}, true  -- the new entry's y per meter: below + units - 1
  if M > 1 then
    for i = 1, n do ys[meter[i]] = cost[i] - 1 end  -- (the rules of a meter carry its units)
  end
  if exists then
    for m = 1, M do
      local below = Yv[m]  -- entry 0's (Y when there are none)
      if k > 0 and (below > 2 ^ 50 or below < -2 ^ 50) then near = false end
      ys[m] = ys[m] + below
    end
  end
  if near then
    if not exists then
      base, maxtol = stamp_ms, tol
      local out, zeros = {'0'}, '0'
      for m = 1, M do out[m + 1] = fmt(ys[m]) end
      for _ = 2, M do zeros = zeros .. ',0' end
      out[M + 2] = 'f:' .. fmt(tol) .. ':' .. zeros
      out[M + 3] = 'b' .. fmt(base)
      redis.call('RPUSH', key, unpack(out))
    elseif M == 1 then
      redis.call('LPUSH', key, fmt(ys[1]), fmt(stamp_ms - base))
    else
      local out = {}
      for m = M, 1, -1 do out[#out + 1] = fmt(ys[m]) end
      out[#out + 1] = fmt(stamp_ms - base)
      redis.call('LPUSH', key, unpack(out))
    end
    exists, k, head = true, k + 1, s
    redis.call('PEXPIRE', key, ttl_ms(s + maxwin - now))
    local reset = max(0, s + maxwin - now)
    if rem then return decision(1, 0, 0, rem, reset, now, s, '') end
    -- a booking: what remains after it (entry i is the one read as i - 1 before, if read)
    S, Yv, shift = setmetatable({[0] = s}, lazy), setmetatable(ys, lazy), 1
    for m = 1, M do Yv[k * M + m] = Y[m] end
    uniform = M == 1 and ys[1] == Y[1]
    return decision(0, slot - now, rule, remaining(false), reset, slot, s, '')
  end
end

-- -- writers ---------------------------------------------------------------------------------
-- (made only by the calls that reach here: settle, sync, refund, and decisions written
-- anywhere but at the head, or that expire entries, change the base or meta, or pass the cap)

local function reset_after()
  return head and max(0, head + maxwin - now) or 0
end

local function meta_text()
  local ys = {}
  for m = 1, M do ys[m] = fmt(Y[m]) end
  local f = floor_us and fmt(floor_us / 1000 - base) or ''
  local text = 'f' .. f .. ':' .. fmt(maxtol) .. ':' .. table.concat(ys, ',')
  if not hr then return text end
  local h = {}
  for m = 1, M do h[m] = fmt(hr.t[m]) .. '/' .. fmt(hr.a[m]) end
  return text .. ':h' .. table.concat(h, ',')
end

-- After a write: the entries known (0-based, as S and Yv), the others read from Redis.
local function known(ks, ky)
  S, Yv, fetched, shift = setmetatable(ks, lazy), setmetatable(ky, lazy), 0, 0
  for m = 1, M do Yv[k * M + m] = Y[m] end
  head = k > 0 and S[0] or floor_us
  uniform = M == 1 and Yv[1] == Y[1]
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
    local e = {S[i]}
    for m = 1, M do e[m + 1] = Yv[i * M + m] - Yv[(i + 1) * M + m] + 1 end
    list[i + 1] = e
  end
  edit(list)
  local below = {}  -- (the edit may have changed Y, below the oldest)
  for m = 1, M do below[m] = count < k and Yv[count * M + m] or Y[m] end
  if count > 0 then redis.call('LTRIM', key, fmt(count * E), '-1') end
  -- the rewritten entries are known (what was read below them is read again if needed)
  local moved, ks, ky, out = #list - count, {}, {}, {}
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
  k = k + moved
  known(ks, ky)
end

-- Count w (units per meter) at stamp_ms, in the entry of that ms.
local function insert(stamp_ms, w)
  if not exists then base = stamp_ms end
  local far = math.abs(stamp_ms - base) > 2147483647
  for m = 1, M do far = far or (k > 0 and math.abs(Yv[m]) > 2 ^ 50) end
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
  if pos == 0 and (k == 0 or S[0] < s) then
    -- the newest entry: pushed at the head, nothing else moves
    local out, c = {}, {}
    for m = M, 1, -1 do
      c[m] = Yv[m] + w[m] - 1
      out[#out + 1] = fmt(c[m])
    end
    out[#out + 1] = fmt(stamp_ms - base)
    if not exists then
      redis.call('RPUSH', key, meta_text(), 'b' .. fmt(base))
      exists = true
    end
    redis.call('LPUSH', key, unpack(out))
    k = k + 1
    known({[0] = s}, c)
    return
  end
  if pos < k and S[pos] == s then
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
  if q >= k or S[q] ~= stamp_us then return nil end
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
  floor_us = max(floor_us or S[t], S[t])
  for m = 1, M do Y[m] = Yv[t * M + m] end
  if t == 0 then redis.call('DEL', key) else redis.call('LTRIM', key, '0', fmt(t * E - 1)) end
  redis.call('RPUSH', key, meta_text(), 'b' .. fmt(base))
  k, dirty = t, false  -- (the entries before t stay as they were read)
  head = k > 0 and S[0] or floor_us
end

-- Drop the entries that can count no more (stamped at or before now minus the longest window)
-- once a write left the log longer than KEEP.
local function expire()
  if k <= KEEP then return end
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
    k, dirty = p + #ms, false
    known({}, {})
  end
  if k > CAP then drop(CAP) end
end

-- Write meta, drop an empty log, set the expiry (when `counted`: something was added).
local function finish(counted)
  if not exists then return end
  if k == 0 and not floor_us and not hr then  -- (the headroom's state stays with its meta)
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

-- Charge per-rule units at `at` (default now), admitted or not (settle's overrun, sync).
local function charge_now(per_rule, at)
  local w, any = per_meter(per_rule), false
  for m = 1, M do any = any or w[m] > 0 end
  if not any then return false end
  insert(ceil((at or now) / 1000), w)
  expire()
  if k > CAP then coarsen() end
  return true
end

-- -- what was decided, written ---------------------------------------------------------------

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
  local asof, transit = tonumber(ARGV[8]), tonumber(ARGV[9]) or 0
  if asof and asof >= now then asof = nil end  -- a reading not in the past: as of now
  local room = function(i) return max(0, lim[i] - used(i, now, 0)) end
  if asof then
    -- as of the upstream's reading: the units stamped in (asof - W, asof] over the upstream's
    -- window W (the rule's less transit), entries stamped after it left out (admitted since,
    -- unseen by the upstream); a floor inside fills it
    local top = above(asof, false)
    room = function(i)
      local edge = asof - max(0, win[i] - transit)
      local last = older(top, k, edge)
      if last == k and floor_us and floor_us > edge then return 0 end
      local u = last - top
      if not uniform then u = Yv[top * M + meter[i]] - Yv[last * M + meter[i]] + u end
      return max(0, lim[i] - u)
    end
  end
  local per_rule, extra = sync_charge(room)
  -- the meter's headroom state (see the header): what this reading found added to what earlier
  -- ones found, faded by the time between them; the latest reading's moment
  local m, at = tonumber(ARGV[5]), asof or now
  local w, l = shortest()
  local a0 = hr and hr.a[m] or 0
  local a, t, found = a0, at, extra
  if a0 > 0 then
    local d = at - hr.t[m]
    if d <= 0 then
      -- a reading older than the latest, answered late: the latest one saw what it finds (its
      -- comparison leaves out the charge made at the later moment), so A does not take it
      t, found = hr.t[m], 0
    elseif d < w[m] then
      a = math.floor(a0 * (w[m] - d) / w[m])
    else
      a = 0
    end
  end
  a = min(l[m], a + found)
  if a ~= a0 or a > 0 and t ~= hr.t[m] then
    if not hr then
      hr = {t = {}, a = {}}
      for j = 1, M do hr.t[j], hr.a[j] = 0, 0 end
    end
    hr.t[m], hr.a[m] = a > 0 and t or 0, a
    local any = false
    for j = 1, M do any = any or hr.a[j] > 0 end
    if not any then hr = nil end
    dirty = true
  end
  -- charged as of the reading: what it stands for was spent before it, and a later reading
  -- (as of a later moment) must count it, or calls in flight would charge it once each
  finish(charge_now(per_rule, asof))
  return extra
end

if op == 'refund' or op == 'claim' then
  -- give back one booking or admission (its units at its stamp, slot_end); a claim here is
  -- one a block holds up
  take_back(slot_end, per_meter(cost))
  finish(false)
  if op == 'refund' then return 1 end
  return blocked_reply(untl, reason)
end

insert(stamp_ms, per_meter(cost))
expire()
if k > CAP then coarsen() end
if tol > maxtol then maxtol, dirty = tol, true end
finish(true)
if rem then return decision(1, 0, 0, rem, reset_after(), now, stamp_ms * 1000, '') end
return decision(0, slot - now, rule, remaining(false), reset_after(), slot, stamp_ms * 1000, '')
