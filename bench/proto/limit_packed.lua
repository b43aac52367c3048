-- sluice - bench/proto/limit_packed.lua: a PROTOTYPE, for make bench-redis
-- only (redis_cost.py --packed); sluice does not run it.
--
-- The question it answers (issue 19, "three limits at most 2.0x the
-- minimal script"): what Redis costs when the limits of one request live in
-- ONE key, written once, instead of one key per limit. Arguments as
-- limit.lua's batch protocol, parsed and checked by limit.lua's own code
-- (copied below unchanged, from "local floor" to "local now_ms"); the
-- refs of a request's limits all name its one key. The value is the
-- limits' STRING layouts (limit.lua's), ';'-separated in the order of the
-- request's limits; the key is written with one SET ... PXAT of the latest
-- expiry its parts need. Only fixed_window, token_bucket and gcra, cost 1,
-- no flags, no override, no delay, no undo log (a denied request writes
-- nothing): the common path of the benchmark's three limits, not a
-- limiter. Reply as limit.lua's: time, then (remaining or -retry, reset)
-- per limit.

local floor, ceil, format, match = math.floor, math.ceil, string.format, string.match
local tonumber = tonumber

local mode, np, nargv = ARGV[1], tonumber(ARGV[2]), #ARGV
if mode == 't' then
    nargv = nargv - 1
elseif mode ~= 'd' then
    return redis.error_reply('ERR sluice limit.lua: unknown mode')
end
local nk = #KEYS
if np == nil or np < 1 or np % 1 ~= 0 or nk < 1 or nargv < 3 + 4 * np then
    return redis.error_reply('ERR sluice limit.lua: bad argument count')
end

-- The parameter sets, checked once each.
local pa, pl, pw, pi = {}, {}, {}, {}
for p = 1, np do
    local a = 4 * p - 1
    local algo, L, W, I = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]),
                          tonumber(ARGV[a + 3])
    if algo == nil or L == nil or W == nil or I == nil or algo % 1 ~= 0 or L % 1 ~= 0
            or W % 1 ~= 0 or I % 1 ~= 0 or algo < 0 or L < 0 or W < 0 or I < 0 then
        return redis.error_reply('ERR sluice limit.lua: bad limit ' .. p)
    end
    if algo > 5 then
        return redis.error_reply('ERR sluice limit.lua: bad algorithm ' .. p)
    end
    if (algo <= 2 or algo == 5) and W < 1 then
        return redis.error_reply('ERR sluice limit.lua: bad window ' .. p)
    end
    if (algo == 3 or algo == 4) and I < 1 then
        return redis.error_reply('ERR sluice limit.lua: bad interval ' .. p)
    end
    pa[p], pl[p], pw[p], pi[p] = algo, L, W, I
end

-- Calendar windows' period starts: the last 4 per calendar set.
local pcb, ncal = {}, 0
for p = 1, np do
    if pa[p] == 0 and pi[p] == 1 then ncal = ncal + 1 end
end
nargv = nargv - 4 * ncal
if nargv < 3 + 4 * np then
    return redis.error_reply('ERR sluice limit.lua: bad argument count')
end
local ab = nargv
for p = 1, np do
    if pa[p] == 0 and pi[p] == 1 then
        local b = { tonumber(ARGV[ab + 1]), tonumber(ARGV[ab + 2]), tonumber(ARGV[ab + 3]),
                    tonumber(ARGV[ab + 4]) }
        for j = 1, 4 do
            if b[j] == nil or b[j] % 1 ~= 0 or (j > 1 and b[j] <= b[j - 1]) then
                return redis.error_reply('ERR sluice limit.lua: bad calendar ' .. p)
            end
        end
        pcb[p], ab = b, ab + 4
    end
end

-- The requests: counts and references, checked before any write.
local a0 = 3 + 4 * np
local nr = tonumber(ARGV[a0])
if nr == nil or nr < 1 or nr % 1 ~= 0 then
    return redis.error_reply('ERR sluice limit.lua: bad request count')
end
-- Checked once, kept as numbers per limit entry e (in call order): em[e]
-- the signed limit count of the request entry e begins (nil inside one),
-- eref[e], ec[e] its ref and cost, es[e] a slot id, eo[e] an override
-- key's index. The decisions below read these, not ARGV.
local refmax, ne, a = 16 * nk * np, 0, a0 + 1
local em, eref, ec, es, eo = {}, {}, {}, {}, {}
for r = 1, nr do
    local m = tonumber(ARGV[a])
    if m == nil or m % 1 ~= 0 or m == 0 or m < -16 then
        return redis.error_reply('ERR sluice limit.lua: bad limit count ' .. r)
    end
    a = a + 1
    -- 32 + ref: one limit of cost 1, its ref is m - 32; 15 + m (17..31):
    -- m limits of cost 1, each a ref alone
    local short, sref, refs = m >= 32, m - 32, m > 16 and m < 32
    if short then m = 1 elseif refs then m = m - 15 end
    em[ne + 1] = m
    if m < 0 then m = -m end
    for j = 1, m do
        local ref, c
        if short then
            ref, c = sref, 1
        elseif refs then
            ref, c = tonumber(ARGV[a]), 1
            a = a + 1
        else
            ref, c = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
            a = a + 2
        end
        if ref == nil or c == nil or ref % 1 ~= 0 or c % 1 ~= 0 or ref < 0 or ref >= refmax
                or c < 1 then
            return redis.error_reply('ERR sluice limit.lua: bad limit ' .. r)
        end
        local e = ne + j
        eref[e], ec[e] = ref, c
        local f = ref % 16
        local p = ((ref - f) / 16) % np + 1
        if pa[p] == 5 then                   -- the slot id
            local x = tonumber(ARGV[a])
            if f % 8 >= 4 or x == nil or x % 1 ~= 0 or x < 1 then
                return redis.error_reply('ERR sluice limit.lua: bad limit ' .. r)
            end
            es[e] = x
            a = a + 1
        elseif f % 8 >= 4 and pa[p] ~= 3 and pa[p] ~= 4 then
            return redis.error_reply('ERR sluice limit.lua: bad limit ' .. r)
        end
        if f >= 8 then                       -- the override key's index
            local x = tonumber(ARGV[a])
            if x == nil or x % 1 ~= 0 or x < 1 or x > nk then
                return redis.error_reply('ERR sluice limit.lua: bad limit ' .. r)
            end
            eo[e] = x
            a = a + 1
        end
        if a > nargv + 1 then
            return redis.error_reply('ERR sluice limit.lua: bad argument count')
        end
    end
    ne = ne + m
end
if a ~= nargv + 1 then
    return redis.error_reply('ERR sluice limit.lua: bad argument count')
end

local t = redis.call('TIME')
local now_us = t[1] * 1000000 + t[2]
-- Mode "t" (test_limiter_table.py runs the shared table of cases through
-- this script): only the time differs from "d".
if mode == 't' then
    now_us = tonumber(ARGV[#ARGV])
    if now_us == nil or now_us % 1 ~= 0 then
        return redis.error_reply('ERR sluice limit.lua: bad time')
    end
end
local now_ms = floor(now_us / 1000)

local gmatch, concat = string.gmatch, table.concat
local vals = redis.call('MGET', unpack(KEYS))
local out, o = { tonumber(t[1]), tonumber(t[2]) }, 2
local parts, pv = {}, {}
local e = 0
while e < ne do
    local m = em[e + 1]
    if m < 0 then m = -m end
    local k, nparts = nil, 0
    local ok_all, maxexp = true, 0
    for j = 1, m do
        e = e + 1
        local ref = eref[e]
        local f = ref % 16
        if f ~= 0 or ec[e] ~= 1 then
            return redis.error_reply('ERR limit_packed.lua: flags and costs are not prototyped')
        end
        ref = ref / 16
        local p = ref % np
        local kk = (ref - p) / np + 1
        p = p + 1
        if j == 1 then
            k = kk
            local s = vals[k]
            if s then
                for part in gmatch(s, '[^;]+') do nparts = nparts + 1; parts[nparts] = part end
            end
        elseif kk ~= k then
            return redis.error_reply('ERR limit_packed.lua: a request is one key')
        end
        local ps = j <= nparts and parts[j] or nil
        local algo, L, W, I = pa[p], pl[p], pw[p], pi[p]
        local rem, reset, v, x
        if algo == 0 then
            local win = floor(now_ms / W)
            local cnt = 0
            if ps then
                local sw, sn = match(ps, '^F(%d+) (%d+)$')
                if sw and tonumber(sw) == win then cnt = tonumber(sn) end
            end
            reset = (win + 1) * W - now_ms
            if cnt + 1 <= L then
                rem, v, x = L - cnt - 1, format('F%d %d', win, cnt + 1), (win + 1) * W
            else
                ok_all, rem = false, -reset
            end
        elseif algo == 3 then
            local B, tokens = L, L
            if ps then
                local su, st = match(ps, '^B(%d+) (%S+)$')
                if su then
                    local el = now_us - tonumber(su)
                    if el < 0 then el = 0 end
                    tokens = (tonumber(st) or B) + el / I
                    if tokens > B then tokens = B end
                end
            end
            if tokens >= 1 then
                local after = tokens - 1
                rem, reset = floor(after), ceil((B - after) * I / 1000)
                v, x = format('B%d %.17g', now_us, after), now_ms + reset
            else
                ok_all, rem, reset = false, -ceil((1 - tokens) * I / 1000), 0
            end
        elseif algo == 4 then
            local tat = now_us
            if ps then
                local y = tonumber(ps)
                if y and y > now_us then tat = y end
            end
            local nt = tat + I
            if nt - now_us <= L * I then
                rem, reset = floor((L * I - (nt - now_us)) / I), ceil((nt - now_us) / 1000)
                v, x = format('%d', nt), now_ms + reset
            else
                ok_all, rem, reset = false, -ceil((nt - now_us - L * I) / 1000), 0
            end
        else
            return redis.error_reply('ERR limit_packed.lua: algorithm not prototyped')
        end
        pv[j] = v
        if x and x > maxexp then maxexp = x end
        out[o + 1], out[o + 2] = rem, reset
        o = o + 2
    end
    if ok_all then
        local val = concat(pv, ';', 1, m)
        vals[k] = val
        redis.call('SET', KEYS[k], val, 'PXAT', maxexp)
    end
end
return out
