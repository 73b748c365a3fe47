-- cap_none.lua: the rules part of a concurrency cap with no rules, run as `rate()` by the
-- capped decision script (cap_decide.lua puts it where it says @rate; see governor/scripts.py).
-- KEYS and ARGV: see common.lua and cap.lua. Returns a decision (common.lua), or nil to admit.
--
-- Only a manual block denies. A booking ahead (reserve with not_before after now) holds
-- nothing: the slot is taken when its holder claims that moment (a claim before it is early,
-- and the booking stays), so a task booked by another limit's rules does not sit on a slot
-- while it waits.
-- @include common
local untl, reason = read_block()
if held_by(untl) then return blocked_reply(untl, reason) end
if op == 'reserve' and not_before > now then
  local wait = not_before - now
  if max_wait >= 0 and wait > max_wait then return decision(0, wait, 0, 0, 0, 0, 0, '') end
  return decision(0, wait, 0, 0, 0, not_before, not_before + tol, '')
end
if op == 'claim' and now < slot_start then
  return decision(0, slot_start - now, 0, 0, 0, slot_start, slot_end, '')
end
