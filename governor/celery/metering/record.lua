-- record.lua: what governed tasks reserved and settled under limits with meters (totals per
-- limit and meter), and the recent uses that learned estimates read (see learned.py).
--
-- KEYS[1]     HASH totals: "<meter>|<what>|<label>" -> units or calls
-- KEYS[2...]  LIST per (task, meter): its last ARGV[2] uses, each in parts per million of the
--             estimate's default, newest first
-- ARGV[1]     the percentile to read, in parts per million (1 to 999999)
-- ARGV[2]     how many uses a list keeps
-- ARGV[3]     seconds a list lives after its last use
-- ARGV[4]     n: how many totals follow, as n pairs (field, increment) in ARGV[5...]
-- ARGV[5+2n...] one per list key: a use to add (ppm), or "" to read only
-- Returns     per list key: {uses it holds, their percentile (ppm; 0 when it holds none)}
local q = tonumber(ARGV[1])
local keep = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local n = tonumber(ARGV[4])
for i = 0, n - 1 do
  redis.call('HINCRBY', KEYS[1], ARGV[5 + 2 * i], ARGV[6 + 2 * i])
end
local out = {}
for k = 2, #KEYS do
  local use = ARGV[4 + 2 * n + k - 1]
  if use ~= nil and use ~= '' then
    redis.call('LPUSH', KEYS[k], use)
    redis.call('LTRIM', KEYS[k], 0, keep - 1)
    redis.call('EXPIRE', KEYS[k], ttl)
  end
  local raw = redis.call('LRANGE', KEYS[k], 0, keep - 1)
  local uses = {}
  for i = 1, #raw do uses[i] = tonumber(raw[i]) or 0 end
  table.sort(uses)
  local at = 0
  if #uses > 0 then
    local i = math.ceil(#uses * q / 1000000)
    if i < 1 then i = 1 end
    at = uses[i]
  end
  out[#out + 1] = {#uses, at}
end
return out
