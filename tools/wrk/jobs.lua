-- wrk script: POST /v1/jobs with a fresh job id every request (issue 16, target 1).
--
--   RUN=r1 BATCH=1 API_KEY=... wrk -t2 -c64 -d10s -s tools/wrk/jobs.lua http://127.0.0.1:PORT
--
-- BATCH=1 (default) posts one job per request: {"job_id": ..., "workflow": ..., "params": ...};
-- BATCH=n posts {"jobs": [n jobs]}. Ids are "<RUN>_<thread>_<n>", unique per run, so no
-- request is a duplicate. WORKFLOW names the job type (default noop-workflow, a sample
-- type the ingest knows when onceflow_examples is among its workflow modules).
-- done() prints one JSON line (prefix "WRK_JSON ") that onceflow_tools.wrkbench reads.

local run = os.getenv("RUN") or tostring(os.time())
local batch = tonumber(os.getenv("BATCH") or "1")
local workflow = os.getenv("WORKFLOW") or "noop-workflow"
local key = os.getenv("API_KEY")

local threads = {}
local counter = 0
local prefix = ""
local headers = { ["Content-Type"] = "application/json" }
if key and key ~= "" then headers["Authorization"] = "Bearer " .. key end

function setup(thread)
  thread:set("tid", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  prefix = run .. "_" .. tostring(tid) .. "_"
end

local function job(id)
  return '{"job_id":"' .. id .. '","workflow":"' .. workflow .. '","params":{"n":1}}'
end

function request()
  counter = counter + 1
  local body
  if batch <= 1 then
    body = job(prefix .. counter)
  else
    local parts = {}
    for i = 1, batch do parts[i] = job(prefix .. counter .. "_" .. i) end
    body = '{"jobs":[' .. table.concat(parts, ",") .. ']}'
  end
  return wrk.format("POST", "/v1/jobs", headers, body)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"requests":%d,"duration_us":%d,"non_2xx":%d,"socket_errors":%d,'
      .. '"timeouts":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d,"batch":%d}\n',
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write,
    e.timeout, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, batch))
end
