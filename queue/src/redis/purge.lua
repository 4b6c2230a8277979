-- Remove a message in any state. Its dedupe record keeps its own TTL.
-- KEYS: 1 message hash, 2 stream, 3 delayed, 4 index (all), 5 index pending,
--       6 index delivered, 7 index dead, 8 delivered-at zset, 9 leased zset
-- ARGV: 1 uuid
local sid = redis.call('HGET', KEYS[1], 'sid')
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if sid then
  redis.call('XACK', KEYS[2], 'g', sid)
  redis.call('XDEL', KEYS[2], sid)
end
for i = 3, 9 do redis.call('ZREM', KEYS[i], ARGV[1]) end
redis.call('DEL', KEYS[1])
return 1
