-- Enqueue one message, with an optional dedupe record, atomically.
-- KEYS: 1 message hash, 2 delayed zset, 3 index (all), 4 index pending, 5 sequence, 6 dedupe key
-- ARGV: 1 message uuid, 2 queue, 3 tenant ('' = none), 4 has tenant, 5 method, 6 path,
--       7 headers, 8 body, 9 dedupe key ('' = none), 10 dedupe window ms, 11 delay ms
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[9] ~= '' then
  local ok = redis.call('SET', KEYS[6], ARGV[1], 'NX', 'PX', ARGV[10])
  if not ok then
    return {'dup', redis.call('GET', KEYS[6])}
  end
end
local seq = redis.call('INCR', KEYS[5])
local due = now + tonumber(ARGV[11])
redis.call('HSET', KEYS[1], 'queue', ARGV[2], 'state', '0', 'method', ARGV[5], 'path', ARGV[6],
  'headers', ARGV[7], 'body', ARGV[8], 'enq', now, 'due', due, 'upd', now, 'token', 0,
  'leases', 0, 'natt', 0, 'att', '[]', 'seq', seq)
if ARGV[4] == '1' then redis.call('HSET', KEYS[1], 'tenant', ARGV[3]) end
if ARGV[9] ~= '' then redis.call('HSET', KEYS[1], 'dkey', ARGV[9]) end
redis.call('ZADD', KEYS[3], seq, ARGV[1])
redis.call('ZADD', KEYS[4], seq, ARGV[1])
-- Every message enters the stream through the delayed set: `lease` moves the due ones.
redis.call('ZADD', KEYS[2], due, ARGV[1])
return {'new', ARGV[1]}
