-- complete: store the outcome iff the caller still holds a live lease (fencing check).
-- KEYS[1] record hash   KEYS[2] holder marker
-- ARGV[1] fencing token   ARGV[2] state ('completed' | 'too_large')   ARGV[3] status
-- ARGV[4] encoded response (empty for too_large)   ARGV[5] retention ms
local rec = redis.call('HMGET', KEYS[1], 'state', 'fence')
if not rec[1] then
  local holder = redis.call('GET', KEYS[2])
  if holder and holder ~= ARGV[1] then return 'fenced' end
  return 'lease_lost'
end
if rec[1] ~= 'in_flight' or rec[2] ~= ARGV[1] then return 'fenced' end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'state', ARGV[2], 'status', ARGV[3], 'resp', ARGV[4],
  'exp', now + tonumber(ARGV[5]))
redis.call('PEXPIRE', KEYS[1], ARGV[5])
redis.call('DEL', KEYS[2])
return 'ok'
