-- POSTs for the asynchronous routes (bench/queue.sh): a JSON body of BENCH_BODY bytes
-- (default 512) and, with BENCH_KEY_PREFIX set, a unique `Idempotency-Key` per request (the
-- default dedupe source of an asynchronous route). Counts the answers: only 202s without
-- `Portcullis-Duplicate` are accepted messages. done() prints one line:
-- `accepted=N other=M errors=E rate=R` (M: any other answer, duplicates included; E: wrk's
-- socket errors and timeouts; R: accepted messages per second of the run).

local size = tonumber(os.getenv("BENCH_BODY") or "512") or 512
local prefix = os.getenv("BENCH_KEY_PREFIX") or ""

local head = '{"event":"bench","data":"'
local tail = '"}'
local fill = math.max(0, size - #head - #tail)
wrk.method = "POST"
wrk.body = head .. string.rep("x", fill) .. tail
wrk.headers["Content-Type"] = "application/json"

local threads = {}
function setup(thread)
   table.insert(threads, thread)
   thread:set("tid", #threads)
end

function init(args)
   accepted = 0
   other = 0
end

if prefix ~= "" then
   local counter = 0
   request = function()
      counter = counter + 1
      wrk.headers["Idempotency-Key"] = prefix .. "-" .. tostring(tid or 0) .. "-" .. counter
      return wrk.format()
   end
end

function response(status, headers, body)
   -- A duplicate (a key seen before) is a 202 too, but stores nothing.
   local duplicate = headers["portcullis-duplicate"] or headers["Portcullis-Duplicate"]
   if status == 202 and not duplicate then
      accepted = accepted + 1
   else
      other = other + 1
   end
end

function done(summary, latency, requests)
   local a, o = 0, 0
   for _, t in ipairs(threads) do
      a = a + t:get("accepted")
      o = o + t:get("other")
   end
   local e = summary.errors
   local errors = e.connect + e.read + e.write + e.timeout
   local seconds = summary.duration / 1e6
   io.write(string.format("accepted=%d other=%d errors=%d rate=%.0f\n", a, o, errors, a / seconds))
end
