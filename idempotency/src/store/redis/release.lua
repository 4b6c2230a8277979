-- release: delete the in-flight record iff the caller still holds a live lease.
-- KEYS[1] record hash   KEYS[2] holder marker   ARGV[1] fencing token
local rec = redis.call('HMGET', KEYS[1], 'state', 'fence')
if not rec[1] then
  local holder = redis.call('GET', KEYS[2])
  if holder and holder ~= ARGV[1] then return 'fenced' end
  return 'lease_lost'
end
if rec[1] ~= 'in_flight' or rec[2] ~= ARGV[1] then return 'fenced' end
redis.call('DEL', KEYS[1], KEYS[2])
return 'ok'
