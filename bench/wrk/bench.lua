-- One wrk script for every target, so wrk's own per-request cost is identical between the
-- targets being compared. Configured through the environment (set by bench/run.sh):
--
--   BENCH_METHOD      GET (default) or POST
--   BENCH_SEQ_HEADER  header that carries a per-request unique value, e.g. "Idempotency-Key"
--                     (keyed POST) or "X-Bench-Seq" (unkeyed POST of identical size); empty:
--                     a static request (no Lua call per request)
--   BENCH_KEY_PREFIX  run-unique prefix of that value (keys never repeat across runs)
--   BENCH_DELAY_MS    > 0: wait this long before each request on a connection (paced load,
--                     offered rate ~= connections * 1000 / BENCH_DELAY_MS)
--   BENCH_AUTH        non-empty: send "Authorization: Bearer <BENCH_AUTH>" (a tenant's API key
--                     for the rate-limit targets; nginx targets compared with them get the same
--                     header so the requests are the same size)
--
-- The POST body is fixed (62 bytes of JSON).

local method = os.getenv("BENCH_METHOD") or "GET"
local seq_header = os.getenv("BENCH_SEQ_HEADER") or ""
local prefix = os.getenv("BENCH_KEY_PREFIX") or "k"
local delay_ms = tonumber(os.getenv("BENCH_DELAY_MS") or "0") or 0
local auth = os.getenv("BENCH_AUTH") or ""

local nthreads = 0
function setup(thread)
   nthreads = nthreads + 1
   thread:set("tid", nthreads)
end

wrk.method = method
if auth ~= "" then
   wrk.headers["Authorization"] = "Bearer " .. auth
end
if method == "POST" then
   wrk.body = '{"item":"book","qty":1,"note":"portcullis benchmark payload"}'
   wrk.headers["Content-Type"] = "application/json"
end

if seq_header ~= "" then
   local counter = 0
   request = function()
      counter = counter + 1
      wrk.headers[seq_header] = prefix .. "-" .. tostring(tid or 0) .. "-" .. counter
      return wrk.format()
   end
end

if delay_ms > 0 then
   delay = function()
      return delay_ms
   end
end
