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
-- Reply:  the number of limits whose consumption was found and given back.
--
-- Per algorithm:
--   fixed_window    n -= cost while the key still holds window `mark`
--   sliding_window  c -= cost while it holds window `mark`; p -= cost once
--                   the next window made that count the previous one
--   sliding_log     ZREM the members limit.lua added
--   token_bucket    tokens += cost, capped at the burst (full = no key)
--   gcra            TAT -= cost * interval, never below now (now = no key)

if redis.replicate_commands then redis.replicate_commands() end

local floor, ceil, max, min = math.floor, math.ceil, math.max, math.min

local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])

local function int(x)
    return string.format('%d', x)
end

local function read(...)
    local r = redis.pcall(...)
    if type(r) == 'table' and r.err then return nil end
    return r
end

local function refund_fixed(key, W, c, mark)
    local h = read('HMGET', key, 'w', 'n')
    if not h or tonumber(h[1]) ~= mark then return 0 end
    local n = max(0, (tonumber(h[2]) or 0) - c)
    redis.call('HSET', key, 'n', int(n))
    redis.call('PEXPIREAT', key, int((mark + 1) * W))
    return 1
end

local function refund_sliding(key, W, c, mark)
    local h = read('HMGET', key, 'w', 'c', 'p')
    local sw = h and tonumber(h[1])
    if sw == mark then
        redis.call('HSET', key, 'c', int(max(0, (tonumber(h[2]) or 0) - c)))
    elseif sw == mark + 1 then
        redis.call('HSET', key, 'p', int(max(0, (tonumber(h[3]) or 0) - c)))
    else
        return 0
    end
    redis.call('PEXPIREAT', key, int((sw + 2) * W))
    return 1
end

local function refund_log(key, c, mark, base)
    local ty = read('TYPE', key)
    if not ty or ty['ok'] ~= 'zset' then return 0 end
    local removed = 0
    local i = 1
    while i <= c do                      -- ZREM in chunks: unpack has a limit
        local args = {}
        local last = min(c, i + 99)
        for j = i, last do args[#args + 1] = base .. int(mark + j) end
        removed = removed + redis.call('ZREM', key, unpack(args))
        i = last + 1
    end
    if removed > 0 then return 1 end
    return 0
end

local function refund_bucket(key, B, I, c)
    local h = read('HMGET', key, 't', 'u')
    if not h or not h[1] then return 0 end      -- absent: already full
    local elapsed = max(0, now_us - (tonumber(h[2]) or now_us))
    local tokens = min(B, (tonumber(h[1]) or B) + elapsed / I)
    local after = min(B, tokens + c)
    if after >= B then
        redis.call('DEL', key)
    else
        redis.call('HSET', key, 't', after, 'u', int(now_us))
        redis.call('PEXPIRE', key, int(max(1, ceil((B - after) * I / 1000))))
    end
    return 1
end

local function refund_gcra(key, I, c)
    local stored = read('GET', key)
    local tat = stored and tonumber(stored)
    if not tat then return 0 end
    local new_tat = max(now_us, tat - c * I)
    if new_tat <= now_us then
        redis.call('DEL', key)
    else
        redis.call('SET', key, int(new_tat), 'PX', int(max(1, ceil((new_tat - now_us) / 1000))))
    end
    return 1
end

local function arg_int(i, lowest)
    local v = tonumber(ARGV[i])
    if v == nil or v ~= floor(v) or v < lowest then return nil end
    return v
end

local ts, tus, n = arg_int(1, 0), arg_int(2, 0), arg_int(3, 1)
if ts == nil or tus == nil or n == nil or n ~= #KEYS or #ARGV ~= 3 + 6 * n then
    return redis.error_reply('ERR sluice refund.lua: bad argument count')
end
local base = int(ts) .. '.' .. int(tus) .. '-'

local given = 0
for i = 1, n do
    local a = 4 + 6 * (i - 1)
    local algo, L, W = arg_int(a, 0), arg_int(a + 1, 0), arg_int(a + 2, 0)
    local I, c, mark = arg_int(a + 3, 0), arg_int(a + 4, 1), arg_int(a + 5, 0)
    if algo == nil or L == nil or W == nil or I == nil or c == nil or mark == nil then
        return redis.error_reply('ERR sluice refund.lua: bad limit ' .. i)
    end
    local key = KEYS[i]
    if algo <= 2 and W < 1 or algo >= 3 and I < 1 then
        return redis.error_reply('ERR sluice refund.lua: bad limit ' .. i)
    end
    if algo == 0 then given = given + refund_fixed(key, W, c, mark)
    elseif algo == 1 then given = given + refund_sliding(key, W, c, mark)
    elseif algo == 2 then given = given + refund_log(key, c, mark, base)
    elseif algo == 3 then given = given + refund_bucket(key, L, I, c)
    elseif algo == 4 then given = given + refund_gcra(key, I, c)
    else return redis.error_reply('ERR sluice refund.lua: bad algorithm ' .. i) end
end
return given
