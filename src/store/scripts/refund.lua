-- sluice - refund.lua: give back what limit.lua (mode "c") consumed.
--
-- On Redis Cluster the limits of one route may live in several slots; each
-- slot's limits are decided by their own limit.lua call. When one slot
-- denies, the slots that allowed have consumed: this script undoes exactly
-- that consumption, so a denied request costs nothing in the end. Undoing
-- never makes a limit more permissive than it would have been without the
-- request, and every key it writes keeps (or gets) its expiry.
--
-- Call:   EVALSHA sha N key1..keyN  time_s time_us N  (algo limit window_ms interval_us cost mark) x N
--   time_s, time_us     the TIME limit.lua ran at (its extra reply fields)
--   algo, limit, window_ms, interval_us, cost   as given to limit.lua
--   mark                what limit.lua reported for the limit: the window
--                       index (fixed_window, sliding_window), the count
--                       before the request (sliding_log), 0 otherwise
--         [now_us]  tests only: a fake clock instead of TIME
-- Reply:  the number of limits whose consumption was found and given back.
--
-- Per algorithm (key layouts as in limit.lua):
--   fixed_window    n -= cost while the key still holds window `mark`
--   sliding_window  c -= cost while it holds window `mark`; p -= cost once
--                   the next window made that count the previous one
--   sliding_log     ZREM the members limit.lua added
--   token_bucket    tokens += cost, capped at the burst (full = no key)
--   gcra            TAT -= cost * interval, never below now (now = no key)
--   concurrency     ZREM the slot id `mark` (algo 5): the proxy's release of
--                   a request's slot when it ends, and a cross-slot refund
-- token_bucket and gcra also give back a delayed request whose client went
-- away before it was forwarded (time_s, time_us and mark 0).
-- Settlement (cost_from): the difference between the estimate a request
-- was admitted with and what its response reported, on fixed_window,
-- sliding_window, token_bucket or gcra: a positive cost gives back as
-- above; a negative cost charges -cost more, which may leave the key in
-- debt (a count above the limit, tokens below 0, a TAT past now + burst),
-- by at most one more limit (burst): a count stays <= 2 * limit, tokens
-- >= -burst, the TAT <= now + 2 * burst intervals. A window the request was
-- admitted in that is over takes nothing; an absent bucket is a full one,
-- an absent TAT is now. Every key written keeps or gets its expiry.
-- A key of another type or layout has nothing of this request: it is left
-- alone (MGET answers nil for a key that is not a string).

local floor, ceil, format, match = math.floor, math.ceil, string.format, string.match

local t = redis.call('TIME')
local now_us = t[1] * 1000000 + t[2]

-- A count after a settlement of c (< 0: a charge of -c): at least 0, and
-- a charge makes it at most twice the limit (or leaves it).
local function settled(n, c, L)
    local after = n - c
    if c < 0 and after > 2 * L then
        if n > 2 * L then after = n else after = 2 * L end
    end
    if after < 0 then after = 0 end
    return after
end

local function refund_fixed(key, s, L, W, c, mark)
    local sw, sn = match(s or '', '^F(%d+) (%d+)$')
    if not sw or tonumber(sw) ~= mark then return 0 end
    local n = settled(tonumber(sn), c, L)
    redis.call('SET', key, format('F%d %d', mark, n), 'KEEPTTL')   -- window mark's expiry
    return 1
end

local function refund_sliding(key, s, L, W, c, mark)
    local sw, sc, sp = match(s or '', '^S(%d+) (%d+) (%d+)$')
    if not sw then return 0 end
    sw, sc, sp = tonumber(sw), tonumber(sc), tonumber(sp)
    if sw == mark then
        sc = settled(sc, c, L)
    elseif sw == mark + 1 then
        sp = settled(sp, c, L)
    else
        return 0
    end
    redis.call('SET', key, format('S%d %d %d', sw, sc, sp), 'PXAT', format('%d', (sw + 2) * W))
    return 1
end

local function refund_log(key, c, mark, base)
    local removed = 0
    local i = 1
    while i <= c do                      -- ZREM in chunks: unpack has a limit
        local args = {}
        local last = c
        if last > i + 99 then last = i + 99 end
        for j = i, last do args[#args + 1] = base .. format('%d', mark + j) end
        local r = redis.pcall('ZREM', key, unpack(args))
        if type(r) ~= 'number' then return 0 end    -- not a zset: nothing of ours
        removed = removed + r
        i = last + 1
    end
    if removed > 0 then return 1 end
    return 0
end

local function refund_bucket(key, s, B, I, c)
    local su, st = match(s or '', '^B(%d+) (%S+)$')
    if not su and c > 0 then return 0 end           -- absent: already full
    local tokens = B
    if su then
        local elapsed = now_us - tonumber(su)
        if elapsed < 0 then elapsed = 0 end
        tokens = (tonumber(st) or B) + elapsed / I
        if tokens > B then tokens = B end
    end
    local after = tokens + c
    if c < 0 and after < -B then                    -- a debt of one burst at most
        if tokens < -B then after = tokens else after = -B end
    end
    if after >= B then
        redis.call('DEL', key)
    else
        local px = ceil((B - after) * I / 1000)
        if px < 1 then px = 1 end
        redis.call('SET', key, format('B%d %.17g', now_us, after), 'PX', format('%d', px))
    end
    return 1
end

local function refund_gcra(key, s, B, I, c)
    local tat = s and tonumber(s)
    if not tat and c > 0 then return 0 end
    local new_tat
    if c > 0 then
        new_tat = tat - c * I
    else
        local from = now_us
        if tat and tat > now_us then from = tat end
        local cap = now_us + 2 * B * I
        new_tat = from - c * I
        if new_tat > cap then
            if from > cap then new_tat = from else new_tat = cap end
        end
    end
    if new_tat <= now_us then
        redis.call('DEL', key)
    else
        local px = ceil((new_tat - now_us) / 1000)
        if px < 1 then px = 1 end
        redis.call('SET', key, format('%d', new_tat), 'PX', format('%d', px))
    end
    return 1
end

local function refund_slot(key, mark)
    local r = redis.pcall('ZREM', key, format('%d', mark))
    if type(r) == 'number' and r > 0 then return 1 end
    return 0                             -- gone already, or not a zset
end

local function arg_int(i, lowest)
    local v = tonumber(ARGV[i])
    if v == nil or v ~= floor(v) or v < lowest then return nil end
    return v
end

local ts, tus, n = arg_int(1, 0), arg_int(2, 0), arg_int(3, 1)
if ts == nil or tus == nil or n == nil or n ~= #KEYS or
        (#ARGV ~= 3 + 6 * n and #ARGV ~= 4 + 6 * n) then
    return redis.error_reply('ERR sluice refund.lua: bad argument count')
end
if #ARGV == 4 + 6 * n then
    -- tests only (test_limiter_table.py; the proxy never sends it): one
    -- more ARGV, last, is now_us, a fake clock as limit.lua's mode "t"
    now_us = tonumber(ARGV[#ARGV])
    if now_us == nil or now_us % 1 ~= 0 then
        return redis.error_reply('ERR sluice refund.lua: bad time')
    end
end
local base = format('%d', ts) .. '.' .. format('%d', tus) .. '-'
local vals = redis.call('MGET', unpack(KEYS))

local given = 0
for i = 1, n do
    local a = 4 + 6 * (i - 1)
    local algo, L, W = arg_int(a, 0), arg_int(a + 1, 0), arg_int(a + 2, 0)
    local I, c, mark = arg_int(a + 3, 0), arg_int(a + 4, -9007199254740992), arg_int(a + 5, 0)
    if algo == nil or L == nil or W == nil or I == nil or c == nil or mark == nil or c == 0
            or c < 0 and (algo == 2 or algo == 5) then
        return redis.error_reply('ERR sluice refund.lua: bad limit ' .. i)
    end
    local key = KEYS[i]
    if algo <= 2 and W < 1 or algo >= 3 and I < 1 then
        return redis.error_reply('ERR sluice refund.lua: bad limit ' .. i)
    end
    if algo == 0 then given = given + refund_fixed(key, vals[i], L, W, c, mark)
    elseif algo == 1 then given = given + refund_sliding(key, vals[i], L, W, c, mark)
    elseif algo == 2 then given = given + refund_log(key, c, mark, base)
    elseif algo == 3 then given = given + refund_bucket(key, vals[i], L, I, c)
    elseif algo == 4 then given = given + refund_gcra(key, vals[i], L, I, c)
    elseif algo == 5 then given = given + refund_slot(key, mark)
    else return redis.error_reply('ERR sluice refund.lua: bad algorithm ' .. i) end
end
return given
