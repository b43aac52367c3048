-- sluice - limit.lua: every limit of one request, decided atomically in Redis.
--
-- One EVALSHA carries all limits of a route. Phase 1 reads each limit's key
-- and decides it without writing; phase 2 consumes from every limit only when
-- all of them allow, so a denied request costs nothing anywhere. Time is
-- Redis TIME, read once, so several proxies agree. Every key written gets
-- its expiry here, in the same script: none can live without a TTL.
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
--                             3 token_bucket, 4 gcra  (enum limiter_algo)
--   ARGV[4+6*(i-1)]     limit: requests per window, or the burst (bucket, gcra)
--   ARGV[5+6*(i-1)]     window_ms (window algorithms; ignored otherwise)
--   ARGV[6+6*(i-1)]     interval_us: microseconds per token (bucket, gcra)
--   ARGV[7+6*(i-1)]     cost: units this request consumes (>= 1)
--   ARGV[8+6*(i-1)]     flags: 1 shadow (its denial does not deny the request;
--                       it consumes when it allows and the request passes),
--                       2 check only (may deny; never consumes here)
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
-- Key layouts (one key per limit, so each lives under its one hash tag):
--   fixed_window    HASH {w = window index, n = count}
--   sliding_window  HASH {w = window index, c = current count, p = previous}
--   sliding_log     ZSET, one member per admitted unit, score = ms admitted
--   token_bucket    HASH {t = tokens (fractional), u = last refill in us}
--   gcra            STRING: theoretical arrival time in us
-- A key of the wrong type (an algorithm changed by a reload) reads as absent
-- and is replaced on the next write instead of failing every request.

if redis.replicate_commands then redis.replicate_commands() end

local floor, ceil, max, min = math.floor, math.ceil, math.max, math.min

local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
-- Mode "t" (test_limiter_table.py runs the shared table of cases through
-- this script): only the time differs from "d".
local fake_us = nil
if ARGV[1] == 't' then
    fake_us = tonumber(ARGV[#ARGV])
    if fake_us ~= nil and fake_us == floor(fake_us) then now_us = fake_us end
end
local now_ms = floor(now_us / 1000)
local member_base = t[1] .. '.' .. t[2] .. '-'

-- Integers as decimal text: Lua's own number formatting keeps only 14 digits.
local function int(x)
    return string.format('%d', x)
end

local function atleast1(x)
    if x < 1 then return 1 end
    return x
end

-- Reads that cannot fail on a key of another type: nil means "treat as absent".
local function read(...)
    local r = redis.pcall(...)
    if type(r) == 'table' and r.err then return nil end
    return r
end

-- Each decide_* returns a table d:
--   ok         this limit admits the cost
--   rem, reset, retry   what to report when the request is consumed (ok) or
--                       denied here (not ok)
--   rem0, reset0        what an allowing limit reports in a denied request
--   write      function consuming the cost (called only when all allow)

local function decide_fixed(key, L, W, c)
    local win = floor(now_ms / W)
    local h = read('HMGET', key, 'w', 'n')
    local stale = h == nil
    local n = 0
    if h and tonumber(h[1]) == win then n = tonumber(h[2]) or 0 end
    local reset = (win + 1) * W - now_ms
    local d = { ok = n + c <= L, reset = reset, reset0 = reset,
                rem0 = max(0, L - n), mark = win }
    if d.ok then
        d.rem, d.retry = L - n - c, 0
    else
        d.rem, d.retry = 0, reset
        if c > L then d.retry = W end
    end
    d.write = function()
        if stale then redis.call('DEL', key) end
        redis.call('HSET', key, 'w', int(win), 'n', int(n + c))
        redis.call('PEXPIREAT', key, int((win + 1) * W))
    end
    return d
end

-- The two-counter estimate: est = p * (W - elapsed) / W + c. Comparisons are
-- made multiplied by W so they stay in exact integer arithmetic.
local function decide_sliding(key, L, W, c)
    local cur = floor(now_ms / W)
    local h = read('HMGET', key, 'w', 'c', 'p')
    local stale = h == nil
    local sw = h and tonumber(h[1])
    local cc, pc = 0, 0
    if sw ~= nil then
        if sw >= cur then          -- current window (or a clock that went back)
            cc, pc = tonumber(h[2]) or 0, tonumber(h[3]) or 0
        elseif sw == cur - 1 then  -- the stored window is now the previous one
            pc = tonumber(h[2]) or 0
        end
    end
    local elapsed = now_ms - cur * W
    local decay = pc * (W - elapsed)          -- previous count's weight, times W
    local function remaining(count)
        return max(0, floor((L * W - decay - count * W) / W))
    end
    local function reset(count)
        if count > 0 then return (cur + 2) * W - now_ms end
        if pc > 0 then return (cur + 1) * W - now_ms end
        return 0
    end
    local d = { ok = c <= L and decay + (cc + c) * W <= L * W,
                rem0 = remaining(cc), reset0 = reset(cc), mark = cur }
    if d.ok then
        d.rem, d.reset, d.retry = remaining(cc + c), reset(cc + c), 0
    else
        d.rem, d.reset = 0, reset(cc)
        if c > L then
            d.retry = W
        elseif pc > 0 and cc + c <= L
               and ceil(W * (pc + cc + c - L) / pc) < W then
            -- within this window, once enough of the previous count decayed
            d.retry = ceil(W * (pc + cc + c - L) / pc) - elapsed
        else
            -- next window: today's count becomes the decaying previous one
            local e = 0
            if cc > 0 then e = max(0, ceil(W * (cc + c - L) / cc)) end
            d.retry = (cur + 1) * W + e - now_ms
        end
        d.retry = atleast1(d.retry)
    end
    d.write = function()
        if stale then redis.call('DEL', key) end
        redis.call('HSET', key, 'w', int(cur), 'c', int(cc + c), 'p', int(pc))
        redis.call('PEXPIREAT', key, int((cur + 2) * W))
    end
    return d
end

-- Entries exactly W old are out: the live range is (now_ms - W, +inf).
local function decide_log(key, L, W, c)
    local lo = '(' .. int(now_ms - W)
    local count = read('ZCOUNT', key, lo, '+inf')
    local stale = count == nil
    count = count or 0
    local reset0 = 0
    if count > 0 then
        local newest = read('ZRANGEBYSCORE', key, lo, '+inf', 'WITHSCORES',
                            'LIMIT', count - 1, 1)
        reset0 = max(0, tonumber(newest[2]) + W - now_ms)
    end
    local d = { ok = count + c <= L, rem0 = max(0, L - count), reset0 = reset0,
                mark = count }
    if d.ok then
        d.rem, d.reset, d.retry = L - count - c, W, 0
    else
        d.rem, d.reset = 0, reset0
        if c > L then
            d.retry = W
        else
            local k = count + c - L      -- this many oldest entries must leave
            local e = read('ZRANGEBYSCORE', key, lo, '+inf', 'WITHSCORES',
                           'LIMIT', k - 1, 1)
            d.retry = atleast1(tonumber(e[2]) + W - now_ms)
        end
    end
    d.write = function()
        if stale then
            redis.call('DEL', key)
        else
            redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now_ms - W))
        end
        local score = int(now_ms)
        local i = 1
        while i <= c do                  -- ZADD in chunks: unpack has a limit
            local args = {}
            local last = min(c, i + 99)
            for j = i, last do
                args[#args + 1] = score
                args[#args + 1] = member_base .. int(count + j)
            end
            redis.call('ZADD', key, unpack(args))
            i = last + 1
        end
        redis.call('PEXPIRE', key, int(W))
    end
    return d
end

-- A missing bucket is a full one; the key expires exactly when the bucket
-- would be full again, so expiry and absence mean the same thing.
local function decide_bucket(key, B, I, c)
    local h = read('HMGET', key, 't', 'u')
    local stale = h == nil
    local tokens = B
    if h and h[1] then
        local elapsed = max(0, now_us - (tonumber(h[2]) or now_us))
        tokens = min(B, (tonumber(h[1]) or B) + elapsed / I)
    end
    local function refill_ms(tk)
        return ceil((B - tk) * I / 1000)
    end
    local d = { ok = c <= B and tokens >= c,
                rem0 = floor(tokens), reset0 = refill_ms(tokens) }
    local after = tokens - c
    if d.ok then
        d.rem, d.reset, d.retry = floor(after), refill_ms(after), 0
    else
        d.rem, d.reset = 0, refill_ms(tokens)
        if c > B then
            d.retry = atleast1(ceil(B * I / 1000))
        else
            d.retry = atleast1(ceil((c - tokens) * I / 1000))
        end
    end
    d.write = function()
        if stale then redis.call('DEL', key) end
        redis.call('HSET', key, 't', after, 'u', int(now_us))
        redis.call('PEXPIRE', key, int(atleast1(refill_ms(after))))
    end
    return d
end

local function decide_gcra(key, B, I, c)
    local stored = read('GET', key)
    local stale = stored == nil
    local tat = now_us
    if stored then tat = max(tonumber(stored) or now_us, now_us) end
    local new_tat = tat + c * I
    local d = { ok = c <= B and new_tat - now_us <= B * I,
                rem0 = max(0, floor((B * I - (tat - now_us)) / I)),
                reset0 = ceil((tat - now_us) / 1000) }
    if d.ok then
        d.rem = floor((B * I - (new_tat - now_us)) / I)
        d.reset, d.retry = ceil((new_tat - now_us) / 1000), 0
    else
        d.rem, d.reset = 0, d.reset0
        if c > B then
            d.retry = atleast1(ceil(B * I / 1000))
        else
            d.retry = atleast1(ceil((new_tat - B * I - now_us) / 1000))
        end
    end
    d.write = function()
        if stale then redis.call('DEL', key) end
        redis.call('SET', key, int(new_tat), 'PX',
                   int(atleast1(ceil((new_tat - now_us) / 1000))))
    end
    return d
end

local function arg_int(i, lowest)
    local v = tonumber(ARGV[i])
    if v == nil or v ~= floor(v) or v < lowest then
        return nil
    end
    return v
end

if ARGV[1] ~= 'd' and ARGV[1] ~= 't' and ARGV[1] ~= 'c' then
    return redis.error_reply('ERR sluice limit.lua: unknown mode')
end
local n = tonumber(ARGV[2])
if n == nil or n ~= #KEYS or n < 1 or #ARGV ~= 2 + 6 * n + (fake_us and 1 or 0) then
    return redis.error_reply('ERR sluice limit.lua: bad argument count')
end
if ARGV[1] == 't' and now_us ~= fake_us then
    return redis.error_reply('ERR sluice limit.lua: bad time')
end

-- Phase 1: decide every limit, write nothing.
local decisions = {}
local all_ok = true
for i = 1, n do
    local a = 3 + 6 * (i - 1)
    local algo, L, W = arg_int(a, 0), arg_int(a + 1, 0), arg_int(a + 2, 0)
    local I, c, f = arg_int(a + 3, 0), arg_int(a + 4, 1), arg_int(a + 5, 0)
    if algo == nil or L == nil or W == nil or I == nil or c == nil or f == nil or f > 3 then
        return redis.error_reply('ERR sluice limit.lua: bad limit ' .. i)
    end
    local key = KEYS[i]
    local d
    if algo <= 2 then
        if W < 1 then
            return redis.error_reply('ERR sluice limit.lua: bad window ' .. i)
        end
        if algo == 0 then d = decide_fixed(key, L, W, c)
        elseif algo == 1 then d = decide_sliding(key, L, W, c)
        else d = decide_log(key, L, W, c) end
    elseif algo <= 4 then
        if I < 1 then
            return redis.error_reply('ERR sluice limit.lua: bad interval ' .. i)
        end
        if algo == 3 then d = decide_bucket(key, L, I, c)
        else d = decide_gcra(key, L, I, c) end
    else
        return redis.error_reply('ERR sluice limit.lua: bad algorithm ' .. i)
    end
    d.shadow = f % 2 == 1
    d.check_only = f >= 2
    decisions[i] = d
    if not d.ok and not d.shadow then all_ok = false end
end

-- Phase 2: consume everywhere or nowhere.
local out = { all_ok and 1 or 0 }
for i = 1, n do
    local d = decisions[i]
    local rem, reset, retry = d.rem, d.reset, d.retry
    if all_ok and d.ok and not d.check_only then
        d.write()
    elseif d.ok then
        rem, reset, retry = d.rem0, d.reset0, 0
    end
    out[#out + 1] = d.ok and 1 or 0
    out[#out + 1] = floor(rem)
    out[#out + 1] = max(0, ceil(reset))
    out[#out + 1] = ceil(retry)
end
if ARGV[1] == 'c' then
    out[#out + 1] = tonumber(t[1])
    out[#out + 1] = tonumber(t[2])
    for i = 1, n do out[#out + 1] = decisions[i].mark or 0 end
end
return out
