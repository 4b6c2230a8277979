-- try_lock: look up the record and lock it if absent, in ONE atomic step.
-- KEYS[1] record hash   KEYS[2] holder marker   KEYS[3] per-tenant fencing counter
-- ARGV[1] fingerprint (32 raw bytes)   ARGV[2] lease ms   ARGV[3] retention ms
-- While in flight the record's TTL *is* the lease: a crashed holder's lock vanishes by
-- itself. The holder marker (TTL = retention, deleted on complete/release) outlives the
-- lease, so a lock found missing while the marker exists was abandoned: a takeover.
local rec = redis.call('HMGET', KEYS[1], 'state', 'fp', 'status', 'resp')
local state = rec[1]
if state then
  if rec[2] ~= ARGV[1] then return {'mismatch'} end
  if state == 'in_flight' then return {'in_flight', redis.call('PTTL', KEYS[1])} end
  if state == 'completed' then return {'completed', rec[4]} end
  return {'too_large', rec[3]}
end
local lease = tonumber(ARGV[2])
local retention = tonumber(ARGV[3])
if lease > retention then lease = retention end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local took_over = redis.call('EXISTS', KEYS[2])
-- The counter never expires: tokens must never repeat for a tenant (one key per tenant).
local fencing = redis.call('INCR', KEYS[3])
redis.call('HSET', KEYS[1], 'state', 'in_flight', 'fp', ARGV[1], 'fence', fencing,
  'created', now, 'exp', now + lease)
redis.call('PEXPIRE', KEYS[1], lease)
redis.call('SET', KEYS[2], fencing, 'PX', retention)
return {'acquired', fencing, took_over}
