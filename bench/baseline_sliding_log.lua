-- baseline_sliding_log.lua: governor's sliding log before weighted entries (commit 5fb4baa:
-- governor/lua/common.lua, then governor/lua/sliding_log.lua, verbatim), kept for bench/tokens.py
-- to measure against in the same run. One stamp per unit of cost; not used by governor.

-- common.lua: the prelude governor puts in front of every algorithm script (see governor/scripts.py).
--
-- KEYS[1]  the subject's state (the algorithm's own key)
-- KEYS[2]  the subject's manual block: a string "<until_us>:<reason>"
-- ARGV[1]  the rules, packed once per limiter: little-endian doubles limit_1, ..., limit_n,
--          window_us_1, ..., window_us_n, then the algorithm's extra (sliding_window: precision)
-- ARGV[2]  op: acquire | peek | reserve | claim | refund | usage | lease
-- ARGV[3]  now in microseconds since the Unix epoch, or '' to read Redis TIME
-- ARGV[4]  cost (positive integer)
-- reserve: ARGV[5] not_before_us (0 = now), ARGV[6] max_wait_us (-1 = no limit),
--          ARGV[7] tolerance_us (how late a booked task may start)
-- claim:   ARGV[5] slot_start_us, ARGV[6] slot_end_us, ARGV[7] max_wait_us, ARGV[8] tolerance_us
-- refund:  ARGV[5] slot_start_us, ARGV[6] slot_end_us
-- lease:   ARGV[5] span_us: admit now, counted as if started at any moment up to span_us
--          later (algorithms that book: a booking whose slot is now)
--
-- Decision reply (acquire, peek, reserve, claim, lease), one string of space-separated fields:
--   "allowed(0|1) retry_after_us(-1 = never) rule(1-based; 0 none; -1 manual block) remaining
--    reset_after_us now_us slot_start_us slot_end_us block_reason" (the reason last: it may hold
--   spaces). One bulk reply parses much faster in clients than a nine-element array.
-- Usage reply: {now_us, block_until_us (0 = none), block_reason, booked (future bookings held),
--   booked_until_us (when the last booking held starts; 0 = none), then per rule: used,
--   retry_us, reset_us}. Refund reply: 1.
local min, max, ceil = math.min, math.max, math.ceil
local op = ARGV[2]
local now = tonumber(ARGV[3])
-- With a caller's clock, Redis expiry (which runs on real time) cannot follow it: keys then live
-- a minute longer than computed, so a slow test never sees state vanish early.
local ttl_pad = now and 60000 or 0
if not now then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local cost = tonumber(ARGV[4])
local not_before, max_wait, tol, slot_start, slot_end = 0, -1, 0, 0, 0
if op == 'reserve' then
  not_before, max_wait, tol = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
elseif op == 'claim' then
  slot_start, slot_end = tonumber(ARGV[5]), tonumber(ARGV[6])
  max_wait, tol = tonumber(ARGV[7]), tonumber(ARGV[8])
elseif op == 'refund' then
  slot_start, slot_end = tonumber(ARGV[5]), tonumber(ARGV[6])
elseif op == 'lease' then
  tol = tonumber(ARGV[5])
end
local n = math.floor(#ARGV[1] / 16)
local rules_format = '<' .. string.rep('d', n)
-- (unpack returns the next position last: dropped)
local lim = {struct.unpack(rules_format, ARGV[1])}
local win = {struct.unpack(rules_format, ARGV[1], 8 * n + 1)}
lim[n + 1], win[n + 1] = nil, nil
-- never: the first rule whose limit is below cost (such a request can never pass), or nil
local maxlim, maxwin, never = 0, 0, nil
for i = 1, n do
  if lim[i] > maxlim then maxlim = lim[i] end
  if win[i] > maxwin then maxwin = win[i] end
  if cost > lim[i] and not never then never = i end
end
local extra = #ARGV[1] > 16 * n and struct.unpack('<d', ARGV[1], 16 * n + 1) or nil

-- Integers as exact decimal text (tostring would round above 14 digits).
local function fmt(x)
  return string.format('%d', x)
end

-- PEXPIRE argument for a duration in microseconds: rounded up, at least 1 ms. (Arguments to
-- redis.call go as text: Redis would format a Lua number with %.17g, which takes longer.)
local function ttl_ms(us)
  local ms = ceil(us / 1000)
  if ms < 1 then ms = 1 end
  return fmt(ms + ttl_pad)
end

local function corrupt(what)
  return error('governor: corrupt ' .. what .. ' at ' .. KEYS[1])
end

-- The active manual block: until_us, reason; or nil.
local function read_block()
  local v = redis.call('GET', KEYS[2])
  if not v then return nil end
  local sep = string.find(v, ':', 1, true)
  local untl = sep and tonumber(string.sub(v, 1, sep - 1))
  if not untl then return error('governor: corrupt block at ' .. KEYS[2]) end
  if untl <= now then return nil end
  return untl, string.sub(v, sep + 1)
end

-- Whether a block holds this call up: a booking asked for from the block's end on is not
-- (it cannot start inside the block; a paused task books its place behind the pause this way).
local function held_by(untl)
  return untl and not (op == 'reserve' and not_before >= untl)
end

local function decision(allowed, retry, rule, remaining, reset, start, stop, reason)
  -- the reason is appended, not formatted: %s would stop at a NUL byte
  return string.format('%d %d %d %d %d %d %d %d ', allowed, retry, rule, remaining, reset, now,
    start, stop) .. reason
end

local function blocked_reply(untl, reason)
  return decision(0, untl - now, -1, 0, untl - now, 0, 0, reason)
end

local function usage_reply(per_rule, booked, booked_until)
  local untl, reason = read_block()
  local out = {now, untl or 0, reason or '', booked or 0, booked_until or 0}
  for i = 1, #per_rule do out[#out + 1] = per_rule[i] end
  return out
end

-- Numbers packed as little-endian doubles (the state of all but the sliding log).
local function unpack_numbers(raw, count)
  if #raw ~= 8 * count then return nil end
  local out = {struct.unpack('<' .. string.rep('d', count), raw)}
  out[count + 1] = nil
  return out
end

local function pack_numbers(values)
  local count = #values
  if count <= 4000 then return struct.pack('<' .. string.rep('d', count), unpack(values)) end
  local parts = {}  -- unpack gives at most a few thousand values at once
  for j = 1, count, 4000 do
    local last = min(count, j + 3999)
    parts[#parts + 1] = struct.pack('<' .. string.rep('d', last - j + 1), unpack(values, j, last))
  end
  return table.concat(parts)
end

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
local first = redis.call('LRANGE', key, '0', '63')  -- FIRST elements
local len = #first
if len == FIRST then len = redis.call('LLEN', key) end
local k, base, floor, maxtol = 0, 0, nil, 0
if len > 0 then
  local meta, b = first[len - 1], first[len]
  if len >= FIRST then
    local tail = redis.call('LRANGE', key, '-2', '-1')
    meta, b = tail[1], tail[2]
  end
  local f, t = string.match(meta or '', '^f(%-?%d*):(%d+)$')
  base = tonumber(string.match(b or '', '^b(%-?%d+)$') or '')
  if not (t and base) then corrupt('sliding log') end
  k, floor, maxtol = len - 2, tonumber(f), tonumber(t)
end

local cache = {}  -- stamps read so far, in us (never past the stamps)
-- Stamp of entry i (0-based, newest first) in us; past the stamps, the floor (or nil).
local function entry(i)
  local v = cache[i]
  if v then return v end
  if i >= k then return floor and (base + floor) * 1000 end
  v = tonumber(first[i + 1] or redis.call('LINDEX', key, fmt(i)))
  if not v then corrupt('sliding log') end
  v = (base + v) * 1000
  cache[i] = v
  return v
end
local head = entry(0)  -- the newest stamp (the floor when there are none), kept up to date

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
  local lo, hi, edge, horizon = 0, k, x - win[i], x + win[i] + tol + maxtol + 1000
  if k > 0 and head >= horizon then lo = above(horizon, true) end
  local skip = lo
  if hi > lo + lim[i] then hi = lo + lim[i] end
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
      if k > 0 and head >= horizon then skip = above(horizon, true) end
      local j = skip + lim[i] - cost
      local e = (j < k or floor) and entry(j)  -- (past the stamps only a floor counts)
      if e and e + win[i] > x then
        x, moved = e + win[i], true
        if round == 1 then denier = i end  -- the last to move it waits longest
      end
    end
    if not moved then return x, denier end
  end
  return nil, denier
end

-- The smallest room over the rules after extra_cost more. A rule counts at most k (without a
-- floor), so one whose limit leaves more than the best so far even then is not searched.
local function remaining(extra_cost)
  local best = nil
  for i = 1, n do
    if best == 0 then break end
    if best == nil or floor or lim[i] - k - extra_cost < best then
      local r = max(0, lim[i] - used(i, now, 0) - extra_cost)
      if best == nil or r < best then best = r end
    end
  end
  return best or 0
end

local function reset_after()
  return head and max(0, head + maxwin - now) or 0
end

local function meta_text()
  return 'f' .. (floor and fmt(floor) or '') .. ':' .. fmt(maxtol)
end

if op == 'usage' then
  local per = {}
  for i = 1, n do
    per[#per + 1] = used(i, now, 0)
    local skip = 0
    local horizon = now + win[i] + maxtol + 1000
    if k > 0 and head >= horizon then skip = above(horizon, true) end
    local e = entry(skip + lim[i] - 1)
    per[#per + 1] = e and max(0, e + win[i] - now) or 0
    per[#per + 1] = head and max(0, head + win[i] - now) or 0
  end
  -- bookings are the stamps after now (an admission is stamped at most 1 ms ahead); the log
  -- keeps the newest max-limit stamps, so it counts at most that many, but its head is the last
  local last = (head and head > now + 1000) and head or 0
  return usage_reply(per, above(now + 1000, false), last)
end

local untl, reason
if op ~= 'refund' then untl, reason = read_block() end
if op == 'refund' or (untl and op == 'claim') then
  -- give back one booking or admission (cost copies stamped slot_end)
  local removed = len > 0 and redis.call('LREM', key, ARGV[4], fmt(slot_end / 1000 - base)) or 0
  if removed > 0 and removed == k and not floor then redis.call('DEL', key) end
  if op == 'refund' then return 1 end
end
if held_by(untl) then return blocked_reply(untl, reason) end

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
local slot, rem = now, nil  -- where the new stamp goes; rem: admitted now, what remains
if at and at <= now and (op ~= 'reserve' or not_before <= now) then
  rem = remaining(cost)
  if op == 'peek' then return decision(1, 0, 0, rem, reset_after(), 0, 0, '') end
  tol = span  -- stamped as a booking at now (0 unless leasing)
elseif op ~= 'reserve' then
  local wait = at and at - now or reset_after()
  return decision(0, wait, rule, remaining(0), reset_after(), 0, 0, '')
else
  -- Reserve: the earliest moment from not_before on that is also one average interval (cost x
  -- the shortest W/N among the rules) after the stamp before it, so a backlog runs evenly rather
  -- than in bursts a worker pool could not start on time. Behind everyone if bookings are dense.
  local gap = nil
  for i = 1, n do
    local g = win[i] / lim[i]
    if gap == nil or g < gap then gap = g end
  end
  gap = ceil(gap * cost)

  local function spaced(t0)
    local x = t0
    for _ = 1, 8 do
      x = place(x, tol)
      if not x then return nil end
      -- the stamp before ours (ours rounds up to the ms: an equal stamp is before it too)
      local before = above(ceil((x + tol) / 1000) * 1000, false)
      local prev = before < k and entry(before) or nil
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
    return decision(0, slot - now, rule, remaining(0), reset_after(), 0, 0, '')
  end
end

-- Stamp it: cost copies of the ms it may start by, in sorted place; trim; set the TTL.
local stamp = ceil((slot + tol) / 1000)
if len == 0 then
  base = stamp
  redis.call('RPUSH', key, meta_text(), 'b' .. fmt(base))
elseif math.abs(stamp - base) > 2147483647 then
  -- offsets must stay exact 32-bit integers: rewrite the log around a new base
  local vals = k > 0 and redis.call('LRANGE', key, '0', fmt(k - 1)) or {}
  local out = {}
  for j = 1, #vals do
    local v = tonumber(vals[j])
    if not v then corrupt('sliding log') end
    out[j] = fmt(base + v - stamp)
  end
  if floor then floor = base + floor - stamp end
  out[#out + 1] = meta_text()
  out[#out + 1] = 'b' .. fmt(stamp)
  redis.call('DEL', key)
  for j = 1, #out, 4000 do
    redis.call('RPUSH', key, unpack(out, j, min(#out, j + 3999)))
  end
  base, first = stamp, {}
end
local off = fmt(stamp - base)
local top = (k > 0 and head > stamp * 1000) and head or stamp * 1000  -- newest after this
local pos = top > stamp * 1000 and above(stamp * 1000, false) or 0
if pos == 0 and cost == 1 then
  redis.call('LPUSH', key, off)
elseif pos == 0 then
  local left = cost
  while left > 0 do
    local m = min(left, 4000)
    local chunk = {}
    for j = 1, m do chunk[j] = off end
    redis.call('LPUSH', key, unpack(chunk))
    left = left - m
  end
else
  -- before the first stamp not above it (or before meta): sorted order stays
  local pivot = pos < k and fmt(entry(pos) / 1000 - base) or meta_text()
  for _ = 1, cost do redis.call('LINSERT', key, 'BEFORE', pivot, off) end
end
k, head = k + cost, top
local meta_changed = tol > maxtol
maxtol = max(maxtol, tol)
if k > maxlim then
  -- the newest stamp trimmed (at index maxlim) stays behind as the floor
  floor = tonumber(redis.call('LINDEX', key, fmt(maxlim)))
  redis.call('LTRIM', key, '0', fmt(maxlim + 1))
  k = maxlim
  redis.call('LSET', key, fmt(maxlim + 1), 'b' .. fmt(base))
  meta_changed = true
end
if meta_changed then redis.call('LSET', key, fmt(k), meta_text()) end
redis.call('PEXPIRE', key, ttl_ms(top + maxwin - now))
if rem then return decision(1, 0, 0, rem, reset_after(), now, stamp * 1000, '') end  -- (head)
cache, first = {[0] = top}, {}  -- the prefetched text is out of date now
return decision(0, slot - now, rule, remaining(0), reset_after(), slot, stamp * 1000, '')
