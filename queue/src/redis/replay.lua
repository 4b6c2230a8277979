-- Make a delivered or dead message pending again, due now.
-- KEYS: 1 message hash, 2 delayed, 3 index pending, 4 index delivered, 5 index dead,
--       6 delivered-at zset
-- ARGV: 1 uuid
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local f = redis.call('HMGET', KEYS[1], 'state', 'seq', 'natt')
if not f[1] then return 'not_found' end
if f[1] == '0' then return 'pending' end
redis.call('HINCRBY', KEYS[1], 'token', 1)
-- A fresh schedule: attempts and age of the next leases count from now (history kept).
redis.call('HSET', KEYS[1], 'state', '0', 'due', now, 'upd', now, 'cyc', now, 'base', f[3],
  'leases', 0)
redis.call('HDEL', KEYS[1], 'lease', 'sid')
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
redis.call('ZREM', KEYS[6], ARGV[1])
redis.call('ZADD', KEYS[3], f[2], ARGV[1])
redis.call('ZADD', KEYS[2], now, ARGV[1])
return 'ok'
