-- Depth, oldest pending age and dead count of one queue.
-- KEYS: 1 index pending, 2 index dead
-- ARGV: 1 message hash prefix
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local depth = redis.call('ZCARD', KEYS[1])
local dead = redis.call('ZCARD', KEYS[2])
local age = -1
local first = redis.call('ZRANGE', KEYS[1], 0, 0)
if first[1] then
  local enq = redis.call('HGET', ARGV[1] .. first[1], 'enq')
  if enq then age = now - tonumber(enq) end
end
return {depth, age, dead}
