-- One page of summaries from an index, after a sequence number, optionally of one tenant.
-- KEYS: 1 index zset (score = enqueue sequence)
-- ARGV: 1 message hash prefix, 2 after seq, 3 rows wanted, 4 tenant ('' = any),
--       5 has tenant filter, 6 most index entries to scan
-- Returns {last scanned seq, exhausted (1/0), rows...}; a row is
-- {uuid, queue, tenant, state, enq, due, natt, reason, seq}.
local want, scan = tonumber(ARGV[3]), tonumber(ARGV[6])
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[2], '+inf', 'WITHSCORES', 'LIMIT', 0, scan)
local out = {0, 0}
local last = tonumber(ARGV[2])
local rows = 0
for i = 1, #ids, 2 do
  local id, seq = ids[i], tonumber(ids[i + 1])
  local f = redis.call('HMGET', ARGV[1] .. id, 'queue', 'tenant', 'state', 'enq', 'due', 'natt', 'reason')
  if f[1] and (ARGV[5] ~= '1' or f[2] == ARGV[4]) then
    if rows == want then
      out[1] = last
      return out
    end
    rows = rows + 1
    out[#out + 1] = {id, f[1], f[2], tonumber(f[3]), tonumber(f[4]), tonumber(f[5]), tonumber(f[6]), f[7], seq}
  end
  last = seq
end
out[1] = last
if #ids < 2 * scan then out[2] = 1 end
return out
