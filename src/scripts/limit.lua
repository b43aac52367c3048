-- sluice - limit.lua: every limit of one request, decided atomically in Redis.
--
-- One EVALSHA carries all limits of a route. Phase 1 reads every limit's key
-- (one MGET) and decides each without writing; phase 2 consumes from every
-- limit only when all of them allow, so a denied request costs nothing
-- anywhere. Time is Redis TIME, read once, so several proxies agree. Every
-- key written gets its expiry here, in the same SET: none can live without
-- a TTL.
--
-- Call:   EVALSHA sha N key1..keyN  mode N  (algo limit window_ms interval_us cost flags) x N
--   ARGV[1]             mode: "d" = decide and consume; "t" = the same on a
--                       fake clock, for tests only (the proxy never sends
--                       it): one more ARGV, last, is now_us; "c" = as "d",
--                       and the reply also carries what refund.lua needs
--                       to give the consumption back (Redis Cluster: the
--                       limits of a route decided in several slots)
--   ARGV[2]             N, equal to #KEYS
--   ARGV[3+6*(i-1)]     algo: 0 fixed_window, 1 sliding_window, 2 sliding_log,
--                             3 token_bucket, 4 gcra, 5 concurrency
--                             (enum limiter_algo)
--   ARGV[4+6*(i-1)]     limit: requests per window, or the burst (bucket, gcra)
--   ARGV[5+6*(i-1)]     window_ms (window algorithms; ignored otherwise)
--   ARGV[6+6*(i-1)]     interval_us: microseconds per token (bucket, gcra)
--   ARGV[7+6*(i-1)]     cost: units this request consumes (>= 1)
--   ARGV[8+6*(i-1)]     flags: 1 shadow (its denial does not deny the request;
--                       it consumes when it allows and the request passes),
--                       2 check only (may deny; never consumes here),
--                       4 delay (token_bucket, gcra: window_ms carries the
--                       delay in ms; see "Delay" below)
--   concurrency (algo 5): limit = slots, window_ms = the lease in ms,
--                       interval_us = this request's slot id (an integer
--                       below 2^53, unique per request); cost is ignored
--                       (one slot per request). See "Concurrency" below.
-- Run-time overrides (the admin API): the call may carry 2N keys instead
--   of N; then KEYS[N+i] is limit i's override key (its counter key and
--   ":ovr"), a STRING "ALGO LIMIT INTERVAL_US" set by an operator. When
--   present and ALGO is limit i's algo, LIMIT replaces its limit (the burst
--   for bucket and gcra) and, for bucket and gcra, INTERVAL_US (>= 1) its
--   interval; the window stays. With 2N keys the reply ends with one more
--   integer per limit: the limit (or burst) it applied. A concurrency
--   limit takes LIMIT only (its interval carries the slot id).
-- Reply:  { allowed, then per limit: allowed_i, remaining_i, reset_ms_i, retry_ms_i }
--   mode "c" appends { time_s, time_us, then per limit: mark_i }: the TIME
--   this script ran at, and per limit the window index (fixed_window,
--   sliding_window), the count before this request (sliding_log: its
--   members are "time_s.time_us-(mark+j)", j = 1..cost), or 0 (bucket, gcra)
--   all integers; retry_ms_i is 0 for an allowing limit and >= 1 otherwise;
--   allowed is 1 when every limit that is not shadow allows; then each
--   allowing limit that is not check-only is consumed. Limits that are not
--   consumed report their unconsumed state.
--
-- Key layouts (one key per limit, so each lives under its one hash tag).
-- Every algorithm but sliding_log keeps one STRING, so one MGET reads all
-- of them and one SET writes each, value and expiry (PXAT or PX; KEEPTTL
-- when a window's key is written again in its own window, whose PXAT it
-- got when that window began):
--   fixed_window    STRING "F<window index> <count>"
--   sliding_window  STRING "S<window index> <current count> <previous count>"
--   token_bucket    STRING "B<last refill, us> <tokens>" (tokens as %.17g:
--                   the double round-trips exactly, as the C limiter keeps it)
--   gcra            STRING "<theoretical arrival time, us>"
--   sliding_log     ZSET, one member per admitted unit, score = ms admitted
-- A key of another type or layout (an algorithm changed by a reload, or a
-- key of an older sluice) reads as absent and is replaced on the next
-- write instead of failing every request: MGET answers nil for a key that
-- is not a string, a value that does not match the algorithm's pattern is
-- ignored, SET replaces a key of any type, and sliding_log reads with
-- redis.pcall (a string there is deleted before its ZADD).
--
-- Delay (flag 4, token_bucket and gcra): a request that would pass within
-- the delay is admitted now and its future slot reserved here: gcra's TAT
-- runs up to delay past now + burst, the bucket's tokens go negative down to
-- -delay/interval. Its retry_ms_i is then the wait (ms, >= 1), which the
-- proxy holds it for; 0 when it passes at once. A denial's retry_ms_i is
-- until it would pass with the delay.
--
-- Concurrency (algo 5): ZSET of slot ids scored by lease expiry (ms). Expired
-- slots leave (ZREMRANGEBYSCORE -inf now_ms), then ZCARD counts the others;
-- admitted: ZADD now+lease and PEXPIRE lease. A slot id already in the set
-- (a renewal) stays admitted and gets its new lease. Denied: retry_ms 1000.
-- The proxy gives a slot back with refund.lua (ZREM) when the request ends.
-- Mode "c" reports the slot id as the mark.
--
-- The hot path makes no closures and no tables per limit: the decisions
-- go straight into the reply, and the planned writes into one flat table.
-- Redis 6.2 or later (SET PXAT); scripts replicate by their effects there.

local floor, ceil, format, match = math.floor, math.ceil, string.format, string.match

local mode, n, nargv, nk = ARGV[1], tonumber(ARGV[2]), #ARGV, #KEYS
if mode ~= 'd' and mode ~= 't' and mode ~= 'c' then
    return redis.error_reply('ERR sluice limit.lua: unknown mode')
end
if n == nil or (nk ~= n and nk ~= 2 * n) or n < 1
        or nargv ~= 2 + 6 * n + (mode == 't' and 1 or 0) then
    return redis.error_reply('ERR sluice limit.lua: bad argument count')
end

local t = redis.call('TIME')
local now_us = t[1] * 1000000 + t[2]
-- Mode "t" (test_limiter_table.py runs the shared table of cases through
-- this script): only the time differs from "d".
if mode == 't' then
    now_us = tonumber(ARGV[nargv])
    if now_us == nil or now_us % 1 ~= 0 then
        return redis.error_reply('ERR sluice limit.lua: bad time')
    end
end
local now_ms = floor(now_us / 1000)

-- MGET, not GET: it answers nil for a key of another type instead of
-- failing. One limit (the common case), unless it is a sliding_log or mode
-- "c", is decided, written and answered in place.
local vals
if nk == 1 then vals = redis.call('MGET', KEYS[1]) else vals = redis.call('MGET', unpack(KEYS)) end
local limits = nk == 2 * n and {} or nil   -- override keys sent: the limits applied
-- Made once the in-place answer is ruled out:
local out               -- allowed, then allowed_i remaining_i reset_i retry_i
local w                 -- per limit i: w[3i-2..3i] = value, 'PXAT'/'PX'/'KEEPTTL'/'Z', expiry
local z                 -- per limit i: z[2i-1], z[2i] = remaining, reset unconsumed
local marks = mode == 'c' and { tonumber(t[1]), tonumber(t[2]) } or nil
local all_ok = true

-- Phase 1: decide every limit, write nothing.
for i = 1, n do
    local a = 6 * i - 3
    local algo, L, W = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
    local I, c, f = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5])
    if algo == nil or L == nil or W == nil or I == nil or c == nil or f == nil
            or algo % 1 ~= 0 or L % 1 ~= 0 or W % 1 ~= 0 or I % 1 ~= 0 or c % 1 ~= 0
            or f % 1 ~= 0 or algo < 0 or L < 0 or W < 0 or I < 0 or c < 1 or f < 0
            or f > 7 then
        return redis.error_reply('ERR sluice limit.lua: bad limit ' .. i)
    end
    if limits then
        -- a run-time override of this key, for this algorithm, goes first
        local ov = vals[n + i]
        local oa, ol, oi
        if ov then oa, ol, oi = match(ov, '^(%d+) (%d+) (%d+)$') end
        if oa and tonumber(oa) == algo and (algo <= 2 or algo == 5 or tonumber(oi) >= 1) then
            L = tonumber(ol)
            if algo == 3 or algo == 4 then I = tonumber(oi) end
        end
        limits[i] = L
    end
    -- delay (flag 4): window_ms is the delay, in ms (token_bucket, gcra)
    local D = 0
    if f >= 4 then
        if algo ~= 3 and algo ~= 4 then
            return redis.error_reply('ERR sluice limit.lua: bad limit ' .. i)
        end
        D, f = W * 1000, f - 4
    end
    local s = vals[i]
    local ok, rem, reset, retry, rem0, reset0, mark, val, opt, exp
    if algo <= 2 then
        if W < 1 then
            return redis.error_reply('ERR sluice limit.lua: bad window ' .. i)
        end
        local win = floor(now_ms / W)
        mark = win
        if algo == 0 then
            -- fixed_window: one count per window index
            local cnt, same = 0, false
            if s then
                local sw, sn = match(s, '^F(%d+) (%d+)$')
                if sw and tonumber(sw) == win then cnt, same = tonumber(sn), true end
            end
            reset = (win + 1) * W - now_ms
            rem0, reset0 = L - cnt, reset
            if rem0 < 0 then rem0 = 0 end
            ok = cnt + c <= L
            if ok then
                rem, retry = L - cnt - c, 0
                val = format('F%d %d', win, cnt + c)
                if same then opt = 'KEEPTTL'        -- this window's key: its expiry stands
                else opt, exp = 'PXAT', format('%d', (win + 1) * W) end
            else
                rem, retry = 0, reset
                if c > L then retry = W end
            end
        elseif algo == 1 then
            -- sliding_window, the two-counter estimate:
            -- est = p * (W - elapsed) / W + c. Comparisons are made
            -- multiplied by W so they stay in exact integer arithmetic.
            local cc, pc, same = 0, 0, false
            if s then
                local sw, sc, sp = match(s, '^S(%d+) (%d+) (%d+)$')
                if sw then
                    sw = tonumber(sw)
                    if sw >= win then          -- current window (or a clock that went back)
                        cc, pc, same = tonumber(sc), tonumber(sp), sw == win
                    elseif sw == win - 1 then  -- the stored window is now the previous one
                        pc = tonumber(sc)
                    end
                end
            end
            local elapsed = now_ms - win * W
            local decay = pc * (W - elapsed)   -- previous count's weight, times W
            local LW = L * W
            rem0 = floor((LW - decay - cc * W) / W)
            if rem0 < 0 then rem0 = 0 end
            if cc > 0 then reset0 = (win + 2) * W - now_ms
            elseif pc > 0 then reset0 = (win + 1) * W - now_ms
            else reset0 = 0 end
            ok = c <= L and decay + (cc + c) * W <= LW
            if ok then
                rem = floor((LW - decay - (cc + c) * W) / W)
                if rem < 0 then rem = 0 end
                reset, retry = (win + 2) * W - now_ms, 0
                val = format('S%d %d %d', win, cc + c, pc)
                if same then opt = 'KEEPTTL'        -- this window's key: its expiry stands
                else opt, exp = 'PXAT', format('%d', (win + 2) * W) end
            else
                rem, reset = 0, reset0
                if c > L then
                    retry = W
                elseif pc > 0 and cc + c <= L
                       and ceil(W * (pc + cc + c - L) / pc) < W then
                    -- within this window, once enough of the previous count decayed
                    retry = ceil(W * (pc + cc + c - L) / pc) - elapsed
                else
                    -- next window: today's count becomes the decaying previous one
                    local e = 0
                    if cc > 0 then
                        e = ceil(W * (cc + c - L) / cc)
                        if e < 0 then e = 0 end
                    end
                    retry = (win + 1) * W + e - now_ms
                end
                if retry < 1 then retry = 1 end
            end
        else
            -- sliding_log: entries exactly W old are out, the live range
            -- is (now_ms - W, +inf). A key of another type reads as empty.
            local key = KEYS[i]
            local lo = format('(%d', now_ms - W)
            local count = redis.pcall('ZCOUNT', key, lo, '+inf')
            local stale = type(count) ~= 'number'
            if stale then count = 0 end
            mark = count
            reset0 = 0
            if count > 0 then
                local newest = redis.call('ZRANGEBYSCORE', key, lo, '+inf', 'WITHSCORES',
                                          'LIMIT', count - 1, 1)
                reset0 = tonumber(newest[2]) + W - now_ms
                if reset0 < 0 then reset0 = 0 end
            end
            rem0 = L - count
            if rem0 < 0 then rem0 = 0 end
            ok = count + c <= L
            if ok then
                rem, reset, retry = L - count - c, W, 0
                val, opt, exp = count, stale and 'ZS' or 'Z', W
            else
                rem, reset = 0, reset0
                if c > L then
                    retry = W
                else
                    local k = count + c - L      -- this many oldest entries must leave
                    local e = redis.call('ZRANGEBYSCORE', key, lo, '+inf', 'WITHSCORES',
                                         'LIMIT', k - 1, 1)
                    retry = tonumber(e[2]) + W - now_ms
                    if retry < 1 then retry = 1 end
                end
            end
        end
    elseif algo <= 4 then
        if I < 1 then
            return redis.error_reply('ERR sluice limit.lua: bad interval ' .. i)
        end
        mark = 0
        local B = L
        if algo == 3 then
            -- token_bucket: a missing bucket is a full one; the key expires
            -- exactly when the bucket would be full again, so expiry and
            -- absence mean the same thing.
            local tokens = B
            if s then
                local su, st = match(s, '^B(%d+) (%S+)$')
                if su then
                    local elapsed = now_us - tonumber(su)
                    if elapsed < 0 then elapsed = 0 end
                    tokens = (tonumber(st) or B) + elapsed / I
                    if tokens > B then tokens = B end
                end
            end
            local need = (c - tokens) * I        -- delay: the missing tokens' refill, us
            ok = c <= B and (tokens >= c or need <= D)
            rem0, reset0 = floor(tokens), ceil((B - tokens) * I / 1000)
            if rem0 < 0 then rem0 = 0 end
            if ok then
                local after = tokens - c
                rem, reset, retry = floor(after), ceil((B - after) * I / 1000), 0
                if rem < 0 then rem = 0 end
                if tokens < c then
                    retry = ceil(need / 1000)
                    if retry < 1 then retry = 1 end
                end
                val, opt = format('B%d %.17g', now_us, after), 'PX'
                exp = reset < 1 and '1' or format('%d', reset)
            else
                rem, reset = 0, reset0
                if c > B then retry = ceil(B * I / 1000)
                else retry = ceil((need - D) / 1000) end
                if retry < 1 then retry = 1 end
            end
        else
            -- gcra: the theoretical arrival time
            local tat = now_us
            if s then
                local v = tonumber(s)
                if v and v > now_us then tat = v end
            end
            local new_tat = tat + c * I
            local BI = B * I
            local wait = new_tat - BI - now_us   -- delay: > 0 is the hold, us
            ok = c <= B and new_tat - now_us <= BI + D
            rem0 = floor((BI - (tat - now_us)) / I)
            if rem0 < 0 then rem0 = 0 end
            reset0 = ceil((tat - now_us) / 1000)
            if ok then
                rem = floor((BI - (new_tat - now_us)) / I)
                if rem < 0 then rem = 0 end
                reset, retry = ceil((new_tat - now_us) / 1000), 0
                if wait > 0 then
                    retry = ceil(wait / 1000)
                    if retry < 1 then retry = 1 end
                end
                val, opt = format('%d', new_tat), 'PX'
                exp = reset < 1 and '1' or format('%d', reset)
            else
                rem, reset = 0, reset0
                if c > B then retry = ceil(BI / 1000)
                else retry = ceil((wait - D) / 1000) end
                if retry < 1 then retry = 1 end
            end
        end
    elseif algo == 5 then
        -- concurrency: W is the lease (ms), I this request's slot id
        if W < 1 then
            return redis.error_reply('ERR sluice limit.lua: bad lease ' .. i)
        end
        local key, member = KEYS[i], format('%d', I)
        local gone = redis.pcall('ZREMRANGEBYSCORE', key, '-inf', format('%d', now_ms))
        local stale = type(gone) ~= 'number'     -- another type: reads as empty
        local count, mine = 0, false
        if not stale then
            count = redis.call('ZCARD', key)
            mine = redis.call('ZSCORE', key, member) ~= false
        end
        mark = I
        rem0, reset0, reset = L - count, 0, 0
        if rem0 < 0 then rem0 = 0 end
        if mine then count = count - 1 end       -- a renewal: its own slot
        ok = count + 1 <= L
        if ok then
            rem, retry = L - count - 1, 0
            val, opt, exp = member, stale and 'CS' or 'C', W
        else
            rem, retry = 0, 1000
        end
    else
        return redis.error_reply('ERR sluice limit.lua: bad algorithm ' .. i)
    end
    if n == 1 and opt ~= 'Z' and opt ~= 'ZS' and opt ~= 'C' and opt ~= 'CS'
            and not marks then
        local r
        if not ok then                                   -- allowed only when shadow
            r = { (f == 1 or f == 3) and 1 or 0, 0, rem, reset, retry }
        elseif f < 2 then                                -- not check only: consume
            if exp then redis.call('SET', KEYS[1], val, opt, exp)
            else redis.call('SET', KEYS[1], val, opt) end
            r = { 1, 1, rem, reset, retry }                 -- retry: a delay's wait
        else
            r = { 1, 1, rem0, reset0, 0 }
        end
        if limits then r[6] = L end
        return r
    end
    if i == 1 then out, w, z = { 1 }, {}, {} end
    if not ok then
        if f ~= 1 and f ~= 3 then all_ok = false end    -- not shadow
    elseif f < 2 then                                    -- check only never consumes
        w[3 * i - 2], w[3 * i - 1], w[3 * i] = val, opt, exp
    end
    local o = 4 * i
    out[o - 2], out[o - 1], out[o], out[o + 1] = ok and 1 or 0, rem, reset, retry
    z[2 * i - 1], z[2 * i] = rem0, reset0
    if marks then marks[i + 2] = mark end
end

-- Phase 2: consume everywhere or nowhere. A limit that allows but is not
-- consumed reports its state without this request.
if not all_ok then out[1] = 0 end
for i = 1, n do
    local o = 4 * i
    if out[o - 2] == 1 then
        local v = all_ok and w[3 * i - 2]
        if not v then
            out[o - 1], out[o], out[o + 1] = z[2 * i - 1], z[2 * i], 0   -- no delay's wait
        elseif w[3 * i - 1] == 'KEEPTTL' then
            redis.call('SET', KEYS[i], v, 'KEEPTTL')
        elseif w[3 * i - 1] == 'PXAT' or w[3 * i - 1] == 'PX' then
            redis.call('SET', KEYS[i], v, w[3 * i - 1], w[3 * i])
        elseif w[3 * i - 1] == 'C' or w[3 * i - 1] == 'CS' then
            -- concurrency: the slot, scored by its lease's end
            local W = w[3 * i]
            if w[3 * i - 1] == 'CS' then redis.call('DEL', KEYS[i]) end
            redis.call('ZADD', KEYS[i], format('%d', now_ms + W), v)
            redis.call('PEXPIRE', KEYS[i], format('%d', W))
        else
            local key, W, cost = KEYS[i], w[3 * i], tonumber(ARGV[6 * i + 1])
            if w[3 * i - 1] == 'ZS' then
                redis.call('DEL', key)
            else
                redis.call('ZREMRANGEBYSCORE', key, '-inf', format('%d', now_ms - W))
            end
            local score = format('%d', now_ms)
            local base = t[1] .. '.' .. t[2] .. '-'
            local j = 1
            while j <= cost do               -- ZADD in chunks: unpack has a limit
                local args = {}
                local last = cost
                if last > j + 99 then last = j + 99 end
                for m = j, last do
                    args[#args + 1] = score
                    args[#args + 1] = base .. format('%d', v + m)
                end
                redis.call('ZADD', key, unpack(args))
                j = last + 1
            end
            redis.call('PEXPIRE', key, format('%d', W))
        end
    end
end
if marks then
    for i = 1, n + 2 do out[#out + 1] = marks[i] end
end
if limits then
    for i = 1, n do out[#out + 1] = limits[i] end
end
return out
