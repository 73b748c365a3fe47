-- packed.lua: numbers packed as little-endian doubles, the state of every algorithm but the
-- sliding log (gcra, token_bucket, fixed_window and sliding_window say `-- @include packed`;
-- the sliding log, which keeps a list, does not make these functions on each call).
--
-- KEYS, ARGV: none of its own (see the scripts that include it).
-- Returns  nothing itself: unpack_numbers(raw, count) gives `count` numbers (nil when raw does
--          not hold that many), pack_numbers(values) their packed string.
-- @include common
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
