-- common.lua: the prelude of every algorithm script and of the cap's (each says
-- `-- @include common`; governor/scripts.py resolves it).
--
-- KEYS[1]  the subject's state (the algorithm's own key)
-- KEYS[2]  the subject's manual block: a string "<until_us>:<reason>"
-- KEYS[3]  settle only: ZSET of the reservations settled (id -> the end of its lease, us)
-- ARGV[1]  the rules, packed once per limiter: little-endian doubles limit_1, ..., limit_n,
--          window_us_1, ..., window_us_n, then the algorithm's extra (sliding_window: precision)
-- ARGV[2]  op: acquire | peek | reserve | claim | refund | usage | lease | settle | sync
-- ARGV[3]  now in microseconds since the Unix epoch, or '' to read Redis TIME
-- ARGV[4]  cost: one positive integer every rule is charged, or (a limiter with meters) per
--          rule "<units>@<meter>" separated by spaces: rule i is charged units of meter m
--          (1-based; 0 units: the call does not use that meter and the rule does not decide)
-- reserve: ARGV[5] not_before_us (0 = now), ARGV[6] max_wait_us (-1 = no limit),
--          ARGV[7] tolerance_us (how late a booked task may start)
-- claim:   ARGV[5] slot_start_us, ARGV[6] slot_end_us, ARGV[7] max_wait_us, ARGV[8] tolerance_us
-- refund:  ARGV[5] slot_start_us, ARGV[6] slot_end_us
-- lease:   ARGV[5] span_us: admit now, counted as if started at any moment up to span_us
--          later (algorithms that book: a booking whose slot is now)
-- settle:  ARGV[5] slot_start_us, ARGV[6] slot_end_us of the reservation (ARGV[4] is its
--          estimate), ARGV[7] the units really used (same form as ARGV[4]), ARGV[8] lease_us
--          (settled no later than slot_start + lease), ARGV[9] its id. Per rule, what the
--          estimate held beyond the use goes back where it was counted (as far as it still
--          counts: see each algorithm); use beyond the estimate is charged now, admitted or not.
-- sync:    ARGV[5] meter (1-based), ARGV[6] rule (1-based; 0 = the meter's rule with the least
--          room), ARGV[7] remaining: the upstream's room, ARGV[8] as_of_us: when the upstream
--          read it ('' = now), ARGV[9] transit_us: how much longer the rules' windows are than
--          the upstream's. What the rule's room exceeds it by is charged to the meter (every
--          rule of it counts it); the sliding log takes its room as of as_of (what it admitted
--          later left out) over the upstream's window and charges at as_of (and keeps the
--          headroom's state: see sliding_log.lua), the others take their room now and charge
--          now.
--
-- Decision reply (acquire, peek, reserve, claim, lease), one string of space-separated fields:
--   "allowed(0|1) retry_after_us(-1 = never) rule(1-based; 0 none; -1 manual block) remaining
--    reset_after_us now_us slot_start_us slot_end_us block_reason" (the reason last: it may hold
--   spaces). One bulk reply parses much faster in clients than a nine-element array.
-- Usage reply: {now_us, block_until_us (0 = none), block_reason, booked (future bookings held),
--   booked_until_us (when the last booking held starts; 0 = none), then per rule: used,
--   retry_us, reset_us}. Refund reply: 1.
-- Settle reply: "settled now_us back_1 charged_1 ... back_n charged_n" (units given back to and
--   charged to each rule), or "duplicate now_us" (the id was settled before: nothing changes),
--   or "lapsed now_us" (its lease ended: the estimate stands). Sync reply: units charged.
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
local not_before, max_wait, tol, slot_start, slot_end = 0, -1, 0, 0, 0
if op == 'reserve' then
  not_before, max_wait, tol = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
elseif op == 'claim' then
  slot_start, slot_end = tonumber(ARGV[5]), tonumber(ARGV[6])
  max_wait, tol = tonumber(ARGV[7]), tonumber(ARGV[8])
elseif op == 'refund' or op == 'settle' then
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

-- Per rule: the units charged (ARGV[4] form) and the meter they count in; M meters in all.
-- plain: one integer for every rule (a limiter without meters). parse_cost reads the per-rule
-- form (and settle's use); a plain cost, the usual one, is read here, with no function made.
local cost, meter, M, plain, parse_cost = nil, nil, 1, tonumber(ARGV[4]) ~= nil, nil
if plain then  -- (n ones made at once: a table grown one by one is resized as it goes)
  local one = tonumber(ARGV[4])
  meter = {string.byte(string.rep('\1', n), 1, n)}
  cost = meter
  if one ~= 1 then
    cost = {}
    for i = 1, n do cost[i] = one end
  end
end
if not plain or op == 'settle' then
  parse_cost = function(text)
    local units, of = {}, {}
    local one = tonumber(text)
    if one then
      for i = 1, n do units[i], of[i] = one, 1 end
      return units, of, 1, true
    end
    local top = 1
    for u, m in string.gmatch(text, '(%d+)@(%d+)') do
      units[#units + 1], of[#of + 1] = tonumber(u), tonumber(m)
      if of[#of] > top then top = of[#of] end
    end
    if #units ~= n then return error('governor: cost does not match the rules: ' .. text) end
    return units, of, top, false
  end
  if not plain then cost, meter, M = parse_cost(ARGV[4]) end
end

-- never: the first rule whose limit is below its cost (such a request can never pass), or nil
local maxlim, maxwin, never = 0, 0, nil
for i = 1, n do
  if lim[i] > maxlim then maxlim = lim[i] end
  if win[i] > maxwin then maxwin = win[i] end
  if cost[i] > lim[i] and not never and op ~= 'settle' and op ~= 'sync' then never = i end
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

-- What only some operations use is made only by them (Lua makes every closure afresh on each
-- call, at a price: a decision makes none of these).
local usage_reply, idiv, give, charge, settled_reply, sync_charge
if op == 'usage' then
  usage_reply = function(per_rule, booked, booked_until)
    local untl, reason = read_block()
    local out = {now, untl or 0, reason or '', booked or 0, booked_until or 0}
    for i = 1, #per_rule do out[#out + 1] = per_rule[i] end
    return out
  end
elseif op == 'settle' or op == 'sync' then
  -- floor(a / b) for integers, exactly (a double quotient may round up to the next integer).
  idiv = function(a, b)
    local q = math.floor(a / b)
    if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
    return q
  end

  -- settle: the units given back (estimate beyond use) and charged (use beyond estimate) per
  -- rule; sync: the units charged per rule (nil for sync). A settle whose id was settled
  -- before, or whose lease ended, answers here: the algorithm never sees it.
  if op == 'settle' then
    local used = parse_cost(ARGV[7])
    local ids, lease, id = KEYS[3], tonumber(ARGV[8]), ARGV[9]
    redis.call('ZREMRANGEBYSCORE', ids, '-inf', '(' .. fmt(now))
    if redis.call('ZSCORE', ids, id) then return 'duplicate ' .. fmt(now) end
    if now > slot_start + lease then return 'lapsed ' .. fmt(now) end
    redis.call('ZADD', ids, fmt(slot_start + lease), id)
    local last = redis.call('ZRANGE', ids, '-1', '-1', 'WITHSCORES')[2]
    redis.call('PEXPIRE', ids, ttl_ms(tonumber(last) - now))
    give, charge = {}, {}
    for i = 1, n do
      give[i], charge[i] = max(0, cost[i] - used[i]), max(0, used[i] - cost[i])
    end
  end

  settled_reply = function(back, charged)
    local out = {'settled', fmt(now)}
    for i = 1, n do
      out[#out + 1] = fmt(back[i])
      out[#out + 1] = fmt(charged[i])
    end
    return table.concat(out, ' ')
  end

  -- sync: the rule whose room is compared with the upstream's, given each rule's room now;
  -- returns the units to charge to the meter, per rule.
  sync_charge = function(room)
    local m, rule, upstream = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
    local mine = nil
    for i = 1, n do
      if meter[i] == m and (rule == 0 or rule == i) then
        local r = room(i)
        if mine == nil or r < mine then mine = r end
      end
    end
    local extra = max(0, (mine or 0) - upstream)
    local out = {}
    for i = 1, n do out[i] = meter[i] == m and extra or 0 end
    return out, extra
  end
end
