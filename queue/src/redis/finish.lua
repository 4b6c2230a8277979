-- Record the outcome of a leased message, if the token is the current one of a live lease.
-- KEYS: 1 message hash, 2 stream, 3 delayed, 4 index pending, 5 index delivered,
--       6 index dead, 7 delivered-at zset, 8 leased zset
-- ARGV: 1 uuid, 2 token, 3 op (delivered | retry | dead), 4 attempt JSON ('' = none),
--       5 due in ms (retry), 6 reason (dead)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local h = KEYS[1]
local f = redis.call('HMGET', h, 'state', 'token', 'lease', 'sid', 'seq', 'att')
if not f[1] then return 'not_found' end
if f[1] ~= '0' or f[2] ~= ARGV[2] or not f[3] then return 'fenced' end
if tonumber(f[3]) <= now then return 'lease_lost' end
if ARGV[4] ~= '' then
  local att = f[6]
  if att == '[]' then att = '[' .. ARGV[4] .. ']' else att = string.sub(att, 1, -2) .. ',' .. ARGV[4] .. ']' end
  redis.call('HSET', h, 'att', att)
  redis.call('HINCRBY', h, 'natt', 1)
end
if f[4] then
  redis.call('XACK', KEYS[2], 'g', f[4])
  redis.call('XDEL', KEYS[2], f[4])
end
redis.call('HDEL', h, 'lease', 'sid')
local id = ARGV[1]
redis.call('ZREM', KEYS[8], id)
if ARGV[3] == 'delivered' then
  redis.call('HSET', h, 'state', '1', 'due', now, 'upd', now)
  redis.call('ZREM', KEYS[4], id)
  redis.call('ZADD', KEYS[5], f[5], id)
  redis.call('ZADD', KEYS[7], now, id)
elseif ARGV[3] == 'retry' then
  local due = now + tonumber(ARGV[5])
  redis.call('HSET', h, 'due', due, 'upd', now)
  redis.call('ZADD', KEYS[3], due, id)
else
  redis.call('HSET', h, 'state', '2', 'upd', now, 'reason', ARGV[6])
  redis.call('ZREM', KEYS[4], id)
  redis.call('ZADD', KEYS[6], f[5], id)
end
return 'ok'
