-- sluice - bench/proto/limit_packed.lua: a PROTOTYPE, for make bench-redis
-- only (redis_cost.py --packed); sluice does not run it.
--
-- The question it answers (issue 19, "three limits at most 2.0x the
-- minimal script"): what Redis costs when the limits of one request live in
-- ONE key, written once, instead of one key per limit. Arguments as
-- limit.lua's batch protocol, parsed and checked by limit.lua's own code:
-- redis_cost.py puts limit.lua's lines from "local floor" to "local now_ms"
-- before this file's (this file alone does not run); the
-- refs of a request's limits all name its one key. The value is the
-- limits' STRING layouts (limit.lua's), ';'-separated in the order of the
-- request's limits; the key is written with one SET ... PXAT of the latest
-- expiry its parts need. Only fixed_window, token_bucket and gcra, cost 1,
-- no flags, no override, no delay, no undo log (a denied request writes
-- nothing): the common path of the benchmark's three limits, not a
-- limiter. Reply as limit.lua's: time, then (remaining or -retry, reset)
-- per limit.

-- (limit.lua's argument checks go here: see above)

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
