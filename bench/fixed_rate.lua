-- sluice bench - fixed_rate.lua: a wrk script that paces each connection so
-- the whole run offers about BENCH_RATE requests per second (Debian's wrk has
-- no -R). Each connection waits connections/rate seconds after a response
-- before its next request; wrk measures latency from the send, so the wait is
-- not counted. Closed loop with think time: an approximation of wrk2's open
-- loop, good while latency stays far below the wait.
local rate = tonumber(os.getenv("BENCH_RATE") or "1000")
local conns = tonumber(os.getenv("BENCH_CONNS") or "64")
local gap_ms = conns * 1000 / rate

-- wrk's delay() takes whole milliseconds: alternate floor and ceil so the
-- mean wait is gap_ms, which also spreads the connections apart in time.
local whole = math.floor(gap_ms)
local frac = gap_ms - whole

function setup(thread)
    thread:set("seed", math.random(1, 1000000))
end

function init(args)
    math.randomseed(seed)
end

function delay()
    if math.random() < frac then
        return whole + 1
    end
    return whole
end
