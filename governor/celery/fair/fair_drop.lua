-- fair_drop.lua: forget a call taken from a fair queue that cannot be sent on (it went to the
-- dead letters, see governor/celery/waiting/dead_letters.py): it leaves transit and takes no
-- more room.
--
-- KEYS[1]  HASH fm (see fair_put.lua);  KEYS[2]  ZSET fl;  KEYS[3]  HASH fc (see fair_take.lua)
-- ARGV[1]  member
-- Returns  1 if it was there, else 0
local was = redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return was
