-- cap_decide.lua: a decision under rules and a concurrency cap at once: common.lua, cap.lua,
-- then the rules' script as `rate()` (where it says @rate: governor/scripts.py puts the
-- algorithm there, or cap_none.lua for a cap without rules), which returns their decision, or
-- nil to admit. KEYS[1..2] and ARGV: see common.lua; KEYS[3..8] and the extra ARGV: cap.lua.
--
-- The cap is asked first; only when it has a slot for the holder are the rules asked, and
-- the slot is taken only when they admit too (all or nothing). A booking claimed while the cap
-- is full is given back in this call. A slot handed to the holder that a rule or a block
-- denies now lapses at once (the slot goes on; the holder keeps its place for when it comes
-- back), except a waiting process's, which it keeps until its lease ends. peek changes nothing.
-- refund gives back the rules' part (rate() with op refund) and the holder's slot, if its
-- token matches: {'1', 0, 0, handed pairs...}. An acquire whose message names a slot
-- ("<holder id> <token>": the previous task of the same process) gives that slot back first,
-- exactly as cap_ops.lua's release would (the oldest waiter gets it before this holder is
-- asked): one script for a release and the next admission.
-- Returns {decision (common.lua's string; a cap denial has rule -2 and reason full, copy or
--          done), fence (0 unless a slot was taken), free slots after it, then (id, message)
--          pairs of waiters this call handed a slot to: the caller publishes them}
-- @include common
-- @include cap
-- @rate
local out = {}
if op == 'refund' then  -- give back the rules' admission or booking, and the slot if it took one
  rate()
  local e = entry(holder)
  if e and token ~= '-' and e.token == token then drop(holder) end
  sweep(out)
  finish()
  return {'1', 0, 0, unpack(out)}
end
if op == 'acquire' and message ~= '' then
  local id, tok = string.match(message, '^(%S+) (%S+)$')
  if id then give_back(id, tok, '') end
end
if op ~= 'peek' then sweep(out) end
local why, wait, e = verdict(op == 'peek')
local reply, fence = nil, 0
if why == 'room' or why == 'mine' then
  reply = rate() or decision(1, 0, 0, 0, 0, now, now, '')
  if op ~= 'peek' then
    if string.byte(reply, 1) == 49 then  -- '1': admitted, so it takes the slot
      fence = next_fence()
      redis.call('ZADD', HK, expires, holder)
      if not quiet then
        redis.call('ZREM', KK, holder)
        redis.call('ZREM', LK, holder)
        redis.call('HDEL', XK, 'p' .. holder)
      end
      put(holder, token, now_ms, fmt(fence), '-', info)
    elseif why == 'mine' and redis.call('HEXISTS', XK, 'p' .. holder) == 1 then
      lapse(holder, e)  -- its message goes back to wait (the caller sends it): pass the slot on
      hand_over(out)
    end
  end
else
  if why == 'copy' and op ~= 'peek' and e.flags == '-' then
    put(holder, e.token, e.since, e.n, 'c', e.info)
  end
  if op == 'claim' then
    op = 'refund'  -- the booking it came to claim goes back: it cannot start now
    rate()
  end
  reply = decision(0, wait, -2, 0, wait > 0 and wait or 0, 0, 0, why)
end
if op ~= 'peek' then finish() end
local free = cap_limit - redis.call('ZCOUNT', HK, '(' .. fmt(now_ms), '+inf')
return {reply, fence, max(0, free), unpack(out)}
