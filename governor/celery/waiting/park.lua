-- park.lua: keep a deferred task message in Redis until it is nearly due.
--
-- KEYS[1]  ZSET due: parking id -> due time (Unix ms, Redis clock)
-- KEYS[2]  HASH msgs: parking id -> the message envelope (JSON, see governor/celery/parking.py)
-- ARGV[1]  parking id, ARGV[2] due (ms), ARGV[3] envelope
-- Returns  the number of parked tasks (ZCARD due)
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
return redis.call('ZCARD', KEYS[1])
