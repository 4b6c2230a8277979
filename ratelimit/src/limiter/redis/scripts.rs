//! The Lua scripts of the Redis limiter (decision, give-back of a lease, refund of a slot
//! after another slot refused), on Redis server time. See the parent module's docs.

/// TAT helpers shared by the scripts. A bucket's TAT is stored as integer nanoseconds
/// since the epoch, a decimal string of about 19 digits: never converted to a Lua number
/// whole (doubles are exact below 2^53, Unix time is ~2^60.6 ns). `rel` splits it into whole
/// microseconds and a 0–999 ns remainder and returns `TAT − now` in the bucket's ticks
/// (`unit` = 1 for nanoseconds, 1000 for microseconds, remainder rounded up), which is
/// bounded by the policy's tolerance (≤ 2^52 ns, or 2^48 µs; see `policy/validate.rs`): exact.
/// `tat` formats `now + r` ticks back. `now` is the server's `TIME` in microseconds.
macro_rules! tat_lua {
    () => {
        r#"
local function rel(s, now, unit)
  local hi = tonumber(string.sub(s, 1, -4)) or 0
  local lo = tonumber(string.sub(s, -3)) or 0
  if unit == 1 then return (hi - now) * 1000 + lo end
  if lo > 0 then hi = hi + 1 end
  return hi - now
end
local function tat(now, r, unit)
  if unit == 1 then
    local us = math.floor(r / 1000)
    return string.format('%.0f%03d', now + us, r - us * 1000)
  end
  return string.format('%.0f000', now + r)
end
local function px(r, unit)
  return math.ceil(r * unit / 1000000)
end
if redis.replicate_commands then pcall(redis.replicate_commands) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
"#
    };
}

/// The decision script. See the module docs; `KEYS`/`ARGV` layout in its header.
pub(super) const SCRIPT: &str = concat!(
    r#"
-- Portcullis: all-or-nothing decision over #KEYS GCRA buckets (on Redis server time) and
-- calendar quota counters (windows chosen by the caller).
-- ARGV[1]: '1' = consume if admitted, '0' = peek.
-- ARGV[2 + 6(i-1) ..] for KEYS[i]: interval in ticks ('0': a quota counter), burst or quota,
--   cost, shadow ('1'/'0'), counter TTL in ms (quota counters; '0' for buckets), tick in ns
--   ('1' or '1000').
-- Returns {now_us, admitted (1/0), v_1 or -1, ..., v_n or -1}: each stored TAT (ns, as the
-- stored string) or count as read."#,
    tat_lua!(),
    r#"
local out = {now, 1}
local admitted = true
local new_vals = {}
for i = 1, #KEYS do
  local a = 2 + (i - 1) * 6
  local interval = tonumber(ARGV[a])
  local burst = tonumber(ARGV[a + 1])
  local cost = tonumber(ARGV[a + 2])
  local unit = tonumber(ARGV[a + 5])
  local stored = redis.call('GET', KEYS[i])
  out[i + 2] = stored or -1
  local fits, new_val
  if interval == 0 then
    new_val = (tonumber(stored) or 0) + cost
    fits = cost <= burst and new_val <= burst
  else
    local r = 0
    if stored then r = math.max(rel(stored, now, unit), 0) end
    new_val = r + cost * interval
    fits = cost <= burst and new_val <= burst * interval
  end
  if fits then
    new_vals[i] = new_val
  elseif ARGV[a + 3] ~= '1' then
    admitted = false
  end
end
if not admitted then out[2] = 0 end
if ARGV[1] == '1' and admitted then
  for i = 1, #KEYS do
    local a = 2 + (i - 1) * 6
    local nv = new_vals[i]
    if nv and ARGV[a] == '0' then
      if ARGV[a + 2] ~= '0' then
        redis.call('SET', KEYS[i], string.format('%.0f', nv), 'PX', ARGV[a + 4])
      end
    elseif nv and nv > 0 then
      local unit = tonumber(ARGV[a + 5])
      redis.call('SET', KEYS[i], tat(now, nv, unit), 'PX', px(nv, unit))
    end
  end
end
return out
"#
);

/// Admin: gives units back to one bucket or counter, atomically.
pub(super) const GIVE_BACK_SCRIPT: &str = concat!(
    r#"
-- Portcullis: give back ARGV[2] units to KEYS[1].
-- ARGV[1]: interval in ticks ('0': a quota counter); ARGV[3]: counter TTL in ms; ARGV[4]:
-- tick in ns.
-- Returns {now_us, value after (TAT in ns or count) or -1 when nothing is left to store}."#,
    tat_lua!(),
    r#"
local stored = redis.call('GET', KEYS[1])
if not stored then return {now, -1} end
local interval = tonumber(ARGV[1])
local amount = tonumber(ARGV[2])
if interval == 0 then
  local used = tonumber(stored) - amount
  if used <= 0 then
    redis.call('DEL', KEYS[1])
    return {now, -1}
  end
  redis.call('SET', KEYS[1], string.format('%.0f', used), 'PX', ARGV[3])
  return {now, used}
end
local unit = tonumber(ARGV[4])
local r = rel(stored, now, unit) - amount * interval
if r <= 0 then
  redis.call('DEL', KEYS[1])
  return {now, -1}
end
local v = tat(now, r, unit)
redis.call('SET', KEYS[1], v, 'PX', px(r, unit))
return {now, v}
"#
);

/// Cluster only: undoes what the decision script consumed in one slot, for a request that
/// another slot's script refused (see "Redis Cluster" in the module docs).
pub(super) const REFUND_SCRIPT: &str = concat!(
    r#"
-- Portcullis: give back what one admitted decision took from #KEYS (all in one slot).
-- ARGV[4(i-1)+1 ..] for KEYS[i]: interval in ticks ('0': a quota counter), amount, counter
-- TTL in ms, tick in ns."#,
    tat_lua!(),
    r#"
for i = 1, #KEYS do
  local a = (i - 1) * 4
  local interval = tonumber(ARGV[a + 1])
  local amount = tonumber(ARGV[a + 2])
  local stored = redis.call('GET', KEYS[i])
  if stored then
    if interval == 0 then
      local used = tonumber(stored) - amount
      if used <= 0 then
        redis.call('DEL', KEYS[i])
      else
        redis.call('SET', KEYS[i], string.format('%.0f', used), 'PX', ARGV[a + 3])
      end
    else
      local unit = tonumber(ARGV[a + 4])
      local r = rel(stored, now, unit) - amount * interval
      if r <= 0 then
        redis.call('DEL', KEYS[i])
      else
        redis.call('SET', KEYS[i], tat(now, r, unit), 'PX', px(r, unit))
      end
    end
  end
end
return #KEYS
"#
);
