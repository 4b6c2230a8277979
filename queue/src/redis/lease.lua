-- Lease up to `max` due messages of one queue.
-- KEYS: 1 stream, 2 delayed zset, 3 leased zset (score = lease end)
-- ARGV: 1 message hash prefix, 2 max, 3 lease ms
-- The message hash is the authority (state, token, due); the stream's consumer group
-- hands out each new entry once (XREADGROUP), and an entry whose lease ended (the leased
-- set, scored by the end each holder was given) is taken back from the group's
-- pending-entries list with XCLAIM.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local prefix, max, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local stream = KEYS[1]
redis.pcall('XGROUP', 'CREATE', stream, 'g', '0', 'MKSTREAM')

-- 1. Due messages of the delayed set enter the stream (bounded by `max`).
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, max)
for _, id in ipairs(due) do
  redis.call('ZREM', KEYS[2], id)
  local h = prefix .. id
  if redis.call('HGET', h, 'state') == '0' then
    local sid = redis.call('XADD', stream, '*', 'id', id)
    redis.call('HSET', h, 'sid', sid)
  end
end

local out = {}
local function take(sid, id)
  local h = prefix .. id
  local f = redis.call('HMGET', h, 'state', 'due', 'sid')
  if f[1] ~= '0' or f[3] ~= sid then
    -- A stale entry: the message was finished, purged or re-queued meanwhile.
    redis.call('XACK', stream, 'g', sid)
    redis.call('XDEL', stream, sid)
    return
  end
  if tonumber(f[2]) > now then return end -- a live lease (a longer one than ours)
  local token = redis.call('HINCRBY', h, 'token', 1)
  local leases = redis.call('HINCRBY', h, 'leases', 1)
  redis.call('HSET', h, 'due', now + lease, 'lease', now + lease, 'upd', now)
  redis.call('ZADD', KEYS[3], now + lease, id)
  local m = redis.call('HMGET', h, 'natt', 'enq', 'queue', 'tenant', 'method', 'path',
    'headers', 'body', 'base', 'cyc')
  -- Attempts and age count from the last entry into the queue (enqueue or replay).
  local attempts = tonumber(m[1]) - (tonumber(m[9]) or 0)
  out[#out + 1] = {id, token, attempts, leases, tonumber(m[2]), m[3], m[4], m[5], m[6],
    m[7], m[8], now, tonumber(m[10]) or tonumber(m[2])}
end

-- 2. Messages whose lease ended, then new entries.
local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, max)
for _, id in ipairs(expired) do
  redis.call('ZREM', KEYS[3], id)
  local sid = redis.call('HGET', prefix .. id, 'sid')
  if sid then
    redis.call('XCLAIM', stream, 'g', 'c', 0, sid)
    take(sid, id)
  end
end
if #out < max then
  local r = redis.call('XREADGROUP', 'GROUP', 'g', 'c', 'COUNT', max - #out, 'STREAMS', stream, '>')
  if r then
    for _, e in ipairs(r[1][2]) do
      if type(e[2]) == 'table' then take(e[1], e[2][2]) end
    end
  end
end
return out
