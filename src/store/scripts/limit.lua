-- sluice - limit.lua: the limits of a batch of requests, decided atomically in Redis.
--
-- One EVALSHA carries every request a worker decided on one node in one
-- loop iteration (store.c's batches), each with all the limits of its route
-- that live there. Requests are decided in order; each is all or nothing,
-- in one pass over its limits: each decides on the state before the
-- request, and one that allows consumes at once, logged; when a later limit
-- denies the request, the log undoes what the earlier ones consumed, so a
-- denied request costs nothing anywhere. A later request of the batch sees
-- what the earlier ones consumed (the STRING values are kept in a table,
-- the writes are made at the end, one write per key written; ZSET writes at
-- the end of their request). Time is Redis TIME, read once per call,
-- so several proxies agree. Every key written gets its expiry in this
-- script: none can live without a TTL.
--
-- Call:   EVALSHA sha K key_1..key_K  mode P (algo limit window_ms interval_us) x P
--                 R (m (ref cost) x |m|  or  32+ref  or  15+m ref x m) x R
--                 (b0 b1 b2 b3) x C  [now_us]
--   K keys          the batch's distinct keys (the caller deduplicates them:
--                   two requests of one key name it once)
--   mode            "d" = decide and consume; "t" = the same on a fake
--                   clock, for tests only (the proxy never sends it): one
--                   more ARGV, last, is now_us
--   P               distinct limit parameter sets in the batch, each sent once:
--     algo          0 fixed_window, 1 sliding_window, 2 sliding_log,
--                   3 token_bucket, 4 gcra, 5 concurrency (enum limiter_algo);
--                   16 * tag + algo (tag 1..2^32-1; algo 0, 1, 3, 4): a part
--                   of a route's key (see "One key per route")
--     limit         requests per window, the burst (bucket, gcra), or the
--                   slots (concurrency)
--     window_ms     window algorithms; the delay in ms for a limit sent with
--                   flag 4 (bucket, gcra); the lease in ms (concurrency)
--     interval_us   microseconds per token (bucket, gcra); fixed_window: 1
--                   for a calendar window (see "Calendar windows"), else 0;
--                   ignored otherwise
--   R               requests in the batch (>= 1), then per request:
--     m             its limits (1..16); negative (-m): also reply the marks
--                   refund.lua needs (Redis Cluster: a route decided in
--                   several slots); 32 + ref instead of m, ref and cost:
--                   a request of one limit of cost 1, no marks (the
--                   common case, one argument instead of three; its slot
--                   and ovr follow as below); 15 + m (17..31) instead of
--                   m: a request of m = 2..16 limits, each of cost 1, no
--                   marks: each limit is then ref [slot] [ovr], no cost;
--                   -(16 + m) (-18..-32) instead of m: m = 2..16 limits of
--                   cost 1, no marks, one ref follows, the first, and the
--                   others run from it (ref + 16, ref + 32...): a route's
--                   parts, whose parameter sets the caller sent in a row
--     per limit:    ref cost [slot] [ovr]
--     ref           ((key index - 1) * P + (param index - 1)) * 16 + flags,
--                   indexes 1-based into KEYS and the P sets; flags: 1 shadow
--                   (its denial does not deny the request; it consumes when
--                   it allows and the request passes), 2 check only (may
--                   deny; never consumes here), 4 delay (see "Delay"),
--                   8 override (an ovr index follows; see below)
--     cost          units this request consumes from the limit (>= 1;
--                   concurrency: ignored, one slot per request)
--     slot          concurrency only: this request's slot id (an integer
--                   below 2^53, unique per request), kept out of the shared
--                   parameter set
--     ovr           flag 8 only: the index in KEYS of the limit's run-time
--                   override key (its counter key and ":ovr"), a STRING
--                   "ALGO LIMIT INTERVAL_US" set by an operator (the admin
--                   API). When present and ALGO is the limit's algo, LIMIT
--                   replaces its limit (the burst for bucket and gcra; the
--                   slots for concurrency) and, for bucket and gcra,
--                   INTERVAL_US (>= 1) its interval; the window stays.
--   C               per calendar parameter set, in the order of the sets:
--     b0 b1 b2 b3   the starts (ms since the epoch) of the previous, the
--                   current, the next and the following period around the
--                   proxy's clock
-- Reply:  { time_s, time_us, then per request, per limit:
--           v, reset_ms [, mark] [, wait_ms] [, limit] }
--   v = remaining (>= 0) when the limit allows, -retry_ms (<= -1) when it
--   denies; a request is allowed when every limit that is not shadow allows
--   (the caller knows the flags), and then each allowing limit that is not
--   check-only is consumed. Limits that are not consumed report their
--   unconsumed state. mark (only when m < 0): the window index
--   (fixed_window, sliding_window), the count before this request
--   (sliding_log: its members are "time_s.time_us-(mark+j)", j = 1..cost),
--   the slot id (concurrency) or 0 (bucket, gcra); wait_ms (flag 4 only):
--   how long the proxy holds an admitted request (0: it passes at once);
--   limit (flag 8 only): the limit (or burst) applied; time_s, time_us: the
--   TIME this script ran at. All integers.
--
-- Key layouts (one key per limit, so each lives under its one hash tag).
-- Every algorithm but sliding_log and concurrency keeps one STRING, so one
-- MGET reads all of them and one command writes each, value and expiry:
-- SET PXAT when a window begins; SETRANGE at 0 (the key and its expiry
-- stand) when a window's key is written again in its own window, whose
-- PXAT it got when that window began; PSETEX (PX) for a bucket or a TAT:
--   fixed_window    STRING "F<window index> <count>"
--   sliding_window  STRING "S<window index> <current count> <previous count>"
--   token_bucket    STRING "B<last refill, us> <tokens>" (tokens as %.17g:
--                   the double round-trips exactly, as the C limiter keeps it)
--   gcra            STRING "<theoretical arrival time, us>"
--   sliding_log     ZSET, one member per admitted unit, score = ms admitted;
--                   written at its request's end, when the request passes
--   concurrency     ZSET of slot ids scored by lease expiry (ms); written at
--                   its request's end, when the request passes
-- A key of another type or layout (an algorithm changed by a reload, or a
-- key of an older sluice) reads as absent and is replaced on the next
-- write instead of failing every request: MGET answers nil for a key that
-- is not a string, a value that does not match the algorithm's pattern is
-- ignored (and is never written over with SETRANGE), SET and PSETEX
-- replace a key of any type, and sliding_log reads with
-- redis.pcall (a string there is deleted before its ZADD).
--
-- Delay (flag 4, token_bucket and gcra): a request that would pass within
-- the delay is admitted now and its future slot reserved here: gcra's TAT
-- runs up to delay past now + burst, the bucket's tokens go negative down to
-- -delay/interval. Its wait_ms is then the wait (>= 1), which the proxy
-- holds it for; 0 when it passes at once. A denial's retry is until it
-- would pass with the delay.
--
-- Calendar windows (fixed_window, interval 1): a day, week, month or year
-- in a time zone. Redis' Lua has no time-zone data, so the proxy sends the
-- period starts around its own clock and the window is the period among
-- [b0, b1), [b1, b2), [b2, b3) holding Redis TIME (the first or last when
-- the clocks differ by more than a period): Redis' clock decides. The
-- window is known by its start b (mark, "F<b> <count>"), the key expires at
-- the period's end, reset is the end minus now.
--
-- One key per route: the limits of a route that share a key specification
-- (redis.pack_limits, conf_load.c's mark_parts) keep one key per client,
-- "PREFIX{ROUTE||PARTS}", whose value is a record of 30 bytes per limit
-- (struct.pack '>c0I4Bddd'): ";", TAG (the limit's: FNV-1a of its name,
-- sent with its algorithm), the algorithm, then the numbers of its STRING
-- layout above as doubles, 0 for those it has not (fixed_window: the
-- window, the count; sliding_window: the window, the count, the previous
-- count; token_bucket: the last refill, us, and the tokens; gcra: the TAT,
-- us). Binary, so a decision neither parses nor formats text: the
-- doubles are the numbers themselves. The key expires at the latest its
-- parts need. A
-- request whose limits are parts (every one of them a part of the same key,
-- flags 2 and 8 only, no marks; anything else is refused) is decided by
-- packed_request() below, on the state before it, and writes the key once,
-- with SET PXAT, when it passes; a part it does not carry (another limit's,
-- one a reload removed) is kept as it was, with the key's own expiry (PTTL).
-- A part of another algorithm (after a reload) is absent, and replaced.
--
-- Concurrency (algo 5): expired slots leave (ZREMRANGEBYSCORE -inf now_ms),
-- then ZCARD counts the others; admitted: ZADD now+lease and PEXPIRE lease.
-- A slot id already in the set (a renewal) stays admitted and gets its new
-- lease. Denied: retry 1000 ms. The proxy gives a slot back with
-- refund.lua (ZREM) when the request ends.
--
-- Every argument is checked before anything is written. The hot path makes
-- no closures, no pcall (but sliding_log's ZCOUNT) and no tables per limit:
-- one flat loop over every limit of every request, the undo log's tables
-- reused per request. Redis 6.2 or later (SET PXAT); scripts replicate by their
-- effects there.

local floor, ceil, format, match = math.floor, math.ceil, string.format, string.match
local tonumber, find, sub, concat = tonumber, string.find, string.sub, table.concat
local pack, unpack_b = struct.pack, struct.unpack

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

-- The parameter sets, checked once each; pt[p] a part's tag (false: a
-- limit of a key of its own) and ptk[p] the head of its part's record
-- (";", the tag, the algorithm: see "One key per route").
local pa, pl, pw, pi, pt, ptk, npt = {}, {}, {}, {}, {}, {}, 0
for p = 1, np do
    local a = 4 * p - 1
    local algo, L, W, I = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]),
                          tonumber(ARGV[a + 3])
    if algo == nil or L == nil or W == nil or I == nil or algo % 1 ~= 0 or L % 1 ~= 0
            or W % 1 ~= 0 or I % 1 ~= 0 or algo < 0 or L < 0 or W < 0 or I < 0 then
        return redis.error_reply('ERR sluice limit.lua: bad limit ' .. p)
    end
    local tag = false
    if algo >= 16 then                       -- a part of a route's key: 16 * tag + algo
        tag = floor(algo / 16)
        algo = algo - 16 * tag
        if tag >= 4294967296 or algo == 2 or algo == 5 then
            return redis.error_reply('ERR sluice limit.lua: bad part ' .. p)
        end
        ptk[p], npt = pack('>c0I4B', ';', tag, algo), npt + 1
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
    pa[p], pl[p], pw[p], pi[p], pt[p] = algo, L, W, I, tag
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
-- epk[e]: the key's index when the request entry e begins is one of a
-- route's key (see "One key per route"); erun[e] its first ref when its
-- refs are a run (then eref and ec are not kept for its entries)
local epk, erun
for r = 1, nr do
    local m = tonumber(ARGV[a])
    if m == nil or m % 1 ~= 0 or m == 0 or m < -32 then
        return redis.error_reply('ERR sluice limit.lua: bad limit count ' .. r)
    end
    a = a + 1
    -- 32 + ref: one limit of cost 1, its ref is m - 32; 15 + m (17..31):
    -- m limits of cost 1, each a ref alone; -(16 + m) (-18..-32): m limits
    -- of cost 1, a run: ref r0 (the next argument), r0 + 16, r0 + 32...
    local short, sref, refs, run = m >= 32, m - 32, m > 16 and m < 32, m < -17
    if short then m = 1 elseif refs then m = m - 15
    elseif run then
        -- a run of parts: checked here at once, not limit by limit
        m, sref = -16 - m, tonumber(ARGV[a])
        a = a + 1
        local f = sref and sref % 16
        local p = sref and ((sref - f) / 16) % np + 1
        if sref == nil or sref % 1 ~= 0 or sref < 0 or sref + 16 * (m - 1) >= refmax
                or p + m - 1 > np or (f ~= 0 and f ~= 2) then
            return redis.error_reply('ERR sluice limit.lua: bad limit ' .. r)
        end
        for q = p, p + m - 1 do
            if not pt[q] then
                return redis.error_reply('ERR sluice limit.lua: bad part ' .. r)
            end
        end
        if epk == nil then epk = {} end
        if erun == nil then erun = {} end
        epk[ne + 1], erun[ne + 1] = ((sref - f) / 16 - (p - 1)) / np + 1, sref
    elseif m < -16 then
        return redis.error_reply('ERR sluice limit.lua: bad limit count ' .. r)
    end
    em[ne + 1] = m
    -- parts: every limit of the request a part of one key (k0), with no
    -- flag but 8 (override), no marks; or none
    local k0, pure, parts = nil, m > 0, false
    if m < 0 then m = -m end
    for j = 1, run and 0 or m do
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
        if npt > 0 then
            local k = ((ref - f) / 16 - (p - 1)) / np + 1
            if pt[p] then parts = true else pure = false end
            if (f % 8 ~= 0 and f % 8 ~= 2) or (k0 and k ~= k0) then pure = false end
            k0 = k
        end
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
    if parts then
        if not pure then
            return redis.error_reply('ERR sluice limit.lua: bad part ' .. r)
        end
        if epk == nil then epk = {} end
        epk[ne + 1] = k0
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

-- MGET, not GET: it answers nil for a key of another type instead of
-- failing. vals[k] is then key k's value as read; once a request of this
-- call consumed from it, its state is kept as numbers instead, na[k] (the
-- algorithm) and n1..n3[k] (the fields of its STRING layout), and the
-- STRING is formatted once, at the end; wo[k], we[k] its write still due
-- (option, expiry).
local vals
if nk == 1 then vals = redis.call('MGET', KEYS[1]) else vals = redis.call('MGET', unpack(KEYS)) end
local wo, we, na, n1, n2, n3 = {}, {}, {}, {}, {}, {}
local out, o = { tonumber(t[1]), tonumber(t[2]) }, 2
-- A window's expiry (PXAT) per parameter set: one string per call, as
-- every limit of a set has the same window at one time (made when first
-- needed, as are the undo log's tables: a call of one request of one limit
-- makes none of them).
local pxs
-- The undo log of the current request (reused by every request): per
-- limit consumed u = 1..nu, its reply's place uo[u], the unconsumed
-- state's rem0, reset0 (ur0, us0), whether a wait follows (ud), and either
-- the key uk[u] with what its table entries were before (una, un1..un3,
-- uwo, uwe), or (uk[u] false) a ZSET write due at the request's end: key,
-- option, value, expiry, cost (zk, zopt, zval, zexp, zc). tr[k] is the
-- request that last consumed from key k, ub[k] its first undo entry there.
-- A request of one STRING limit needs no log: it consumes in place.
local uo, ur0, us0, ud, uk, una, un1, un2, un3, uwo, uwe
local zk, zopt, zval, zexp, zc, tr, ub
local m, mk, left, i, denied, nu, nz, rq = 0, false, 0, 0, false, 0, 0, 0

-- sliding_window, the two-counter estimate, for a request of cost c with
-- cc in window win and pc in the one before: est = pc * (W - elapsed) / W
-- + cc + c. Comparisons are made multiplied by W so they stay in exact
-- integer arithmetic. Returns ok, rem, reset, retry, rem0, reset0 (as in
-- the loop below).
local function sliding(L, W, c, cc, pc, win)
    local elapsed = now_ms - win * W
    local decay = pc * (W - elapsed)         -- previous count's weight, times W
    local LW = L * W
    local rem0, reset0 = floor((LW - decay - cc * W) / W), 0
    if rem0 < 0 then rem0 = 0 end
    if cc > 0 then reset0 = (win + 2) * W - now_ms
    elseif pc > 0 then reset0 = (win + 1) * W - now_ms end
    if c <= L and decay + (cc + c) * W <= LW then
        local rem = floor((LW - decay - (cc + c) * W) / W)
        if rem < 0 then rem = 0 end
        return true, rem, (win + 2) * W - now_ms, 0, rem0, reset0
    end
    local retry
    if c > L then
        retry = W
    elseif pc > 0 and cc + c <= L and ceil(W * (pc + cc + c - L) / pc) < W then
        -- within this window, once enough of the previous count decayed
        retry = ceil(W * (pc + cc + c - L) / pc) - elapsed
    else
        -- next window: today's count becomes the decaying previous one
        local q = 0
        if cc > 0 then
            q = ceil(W * (cc + c - L) / cc)
            if q < 0 then q = 0 end
        end
        retry = (win + 1) * W + q - now_ms
    end
    if retry < 1 then retry = 1 end
    return false, 0, reset0, retry, rem0, reset0
end

-- One key per route: a request whose limits are all parts of one key
-- (epk) is decided here, its limits on the state before it, and written
-- with one SET PXAT when it passes: the parts it decided, then any other
-- part the value held (with the key's own expiry, PTTL, read only then).
-- Its limits carry no flag but 2 (check only: the part is kept as read)
-- and 8: no shadow or delay, no marks; so this is the common path of
-- fixed_window, sliding_window, token_bucket and gcra, without the undo
-- log, and it writes nothing for a denied request. The value's records
-- are as above.
local pbuf, pr0, ps0, po, ph = {}, {}, {}, {}, {}
local P53 = 9007199254740992
local function packed_request(e0, m, k)
    local s, r0 = vals[k], erun and erun[e0]
    local got, ok_all, xmax, nb, kept = 0, true, 0, 0, false
    for j = 1, m do
        local e = e0 + j - 1
        local ref, c
        if r0 then ref, c = r0 + 16 * (j - 1), 1 else ref, c = eref[e], ec[e] end
        local f = ref % 16
        local p = ((ref - f) / 16) % np + 1
        local algo, L, W, I = pa[p], pl[p], pw[p], pi[p]
        if f >= 8 then                       -- a run-time override, as below
            local ov = vals[eo[e]]
            local oa, ol, oi
            if ov then oa, ol, oi = match(ov, '^(%d+) (%d+) (%d+)$') end
            if oa and tonumber(oa) == algo and (algo <= 2 or tonumber(oi) >= 1) then
                L = tonumber(ol)
                if algo >= 3 then I = tonumber(oi) end
            end
        end
        -- the part: its record at x (a multiple of 30 bytes in), its
        -- numbers y1..y3
        local h, x, y1, y2, y3 = ptk[p], nil, nil, nil, nil
        ph[j] = h
        if s then
            x = find(s, h, 1, true)
            while x and (x - 1) % 30 ~= 0 do x = find(s, h, x + 1, true) end
            if x and x + 29 > #s then x = nil end
            if x then
                y1, y2, y3 = unpack_b('>ddd', s, x + 6)
                -- a number no decision writes (NaN, infinite, 2^53 or more
                -- away from 0) reads as absent, and the record is replaced
                if y1 > -P53 and y1 < P53 and y2 > -P53 and y2 < P53 and y3 > -P53
                        and y3 < P53 then
                    got = got + 30
                else
                    x = nil
                end
            end
        end
        local ok, rem, reset, retry, rem0, reset0, xa, v1, v2, v3
        if algo == 0 then
            local win = now_ms / W
            win = win - win % 1
            local wend = (win + 1) * W
            local cb = pcb[p]
            if cb then
                local q = now_ms < cb[2] and 1 or now_ms < cb[3] and 2 or 3
                win, wend = cb[q], cb[q + 1]
                W = wend - win
            end
            local cnt = 0
            if x and y1 == win then cnt = y2 end
            reset = wend - now_ms
            rem0, reset0 = L - cnt, reset
            if rem0 < 0 then rem0 = 0 end
            ok = cnt + c <= L
            if ok then
                rem, retry, xa, v1, v2, v3 = L - cnt - c, 0, wend, win, cnt + c, 0
            else
                rem, retry = 0, reset
                if c > L then retry = W end
            end
        elseif algo == 1 then
            local win = now_ms / W
            win = win - win % 1
            local cc, pc = 0, 0
            if x then
                if y1 >= win then cc, pc = y2, y3
                elseif y1 == win - 1 then pc = y2 end
            end
            ok, rem, reset, retry, rem0, reset0 = sliding(L, W, c, cc, pc, win)
            if ok then xa, v1, v2, v3 = (win + 2) * W, win, cc + c, pc end
        elseif algo == 3 then
            local tokens = L
            if x then
                local elapsed = now_us - y1
                if elapsed < 0 then elapsed = 0 end
                tokens = y2 + elapsed / I
                if tokens > L then tokens = L end
            end
            ok = c <= L and tokens >= c
            rem0, reset0 = tokens - tokens % 1, (L - tokens) * I / 1000
            reset0 = reset0 + -reset0 % 1
            if rem0 < 0 then rem0 = 0 end
            if ok then
                local after = tokens - c
                rem, reset, retry = after - after % 1, (L - after) * I / 1000, 0
                reset = reset + -reset % 1
                if rem < 0 then rem = 0 end
                xa, v1, v2, v3 = now_ms + (reset < 1 and 1 or reset), now_us, after, 0
            else
                rem, reset = 0, reset0
                if c > L then retry = ceil(L * I / 1000)
                else retry = ceil((c - tokens) * I / 1000) end
                if retry < 1 then retry = 1 end
            end
        else
            local tat = now_us
            if x and y1 > now_us then tat = y1 end
            local new_tat, BI = tat + c * I, L * I
            ok = c <= L and new_tat - now_us <= BI
            rem0 = (BI - (tat - now_us)) / I
            rem0 = rem0 - rem0 % 1
            if rem0 < 0 then rem0 = 0 end
            reset0 = (tat - now_us) / 1000
            reset0 = reset0 + -reset0 % 1
            if ok then
                rem = (BI - (new_tat - now_us)) / I
                rem = rem - rem % 1
                if rem < 0 then rem = 0 end
                reset, retry = (new_tat - now_us) / 1000, 0
                reset = reset + -reset % 1
                xa, v1, v2, v3 = now_ms + (reset < 1 and 1 or reset), new_tat, 0, 0
            else
                rem, reset = 0, reset0
                if c > L then retry = ceil(BI / 1000)
                else retry = ceil((new_tat - BI - now_us) / 1000) end
                if retry < 1 then retry = 1 end
            end
        end
        po[j], pr0[j], ps0[j] = o, rem0, reset0
        if ok and f % 8 == 2 then           -- check only: the part stays
            out[o + 1], out[o + 2] = rem0, reset0
            if x then
                nb, kept = nb + 1, true
                pbuf[nb] = sub(s, x, x + 29)
            end
        elseif ok then
            out[o + 1], out[o + 2] = rem, reset
            nb = nb + 1
            pbuf[nb] = pack('>c0ddd', h, v1, v2, v3)
            if xa > xmax then xmax = xa end
        else
            out[o + 1], out[o + 2] = -retry, reset
            ok_all = false
        end
        o = o + 2
        if f >= 8 then
            out[o + 1] = L
            o = o + 1
        end
    end
    if not ok_all then
        -- denied: nothing consumed, the limits that allowed say so
        for j = 1, m do
            local q = po[j]
            if out[q + 1] >= 0 then out[q + 1], out[q + 2] = pr0[j], ps0[j] end
        end
        return
    end
    if xmax == 0 then return end             -- check only: nothing written
    if s and got ~= #s then
        -- records of limits this request does not carry: kept (one of a
        -- limit it carries, of another algorithm, is not: by its tag)
        for x = 1, #s - 29, 30 do
            local t = sub(s, x, x + 4)
            local mine = false
            for j = 1, m do
                if sub(ph[j], 1, 5) == t then mine = true end
            end
            if not mine and sub(t, 1, 1) == ';' then
                nb, kept = nb + 1, true
                pbuf[nb] = sub(s, x, x + 29)
            end
        end
    end
    if kept then
        local ttl = redis.call('PTTL', KEYS[k])
        if ttl > 0 and now_ms + ttl > xmax then xmax = now_ms + ttl end
    end
    local v = concat(pbuf, '', 1, nb)
    redis.call('SET', KEYS[k], v, 'PXAT', xmax)
    vals[k] = v
end

local e = 0
while e < ne do
    e = e + 1
    if left == 0 and epk and epk[e] then
        local pm = em[e]
        rq = rq + 1
        packed_request(e, pm, epk[e])
        e = e + pm - 1
    else
        if left == 0 then                        -- a request begins
            m = em[e]
            mk = m < 0
            if mk then m = -m end
            left, i, denied, nu, nz, rq = m, 0, false, 0, 0, rq + 1
        end
        i, left = i + 1, left - 1
        local ref, c = eref[e], ec[e]
        local f = ref % 16
        ref = (ref - f) / 16
        local p = ref % np
        local k = (ref - p) / np + 1
        p = p + 1
        local algo, L, W, I = pa[p], pl[p], pw[p], pi[p]
        if algo == 5 then I = es[e] end          -- concurrency: I is the slot id
        local ovr = f >= 8
        if ovr then
            -- a run-time override of this key, for this algorithm, goes first
            local ov = vals[eo[e]]
            f = f - 8
            local oa, ol, oi
            if ov then oa, ol, oi = match(ov, '^(%d+) (%d+) (%d+)$') end
            if oa and tonumber(oa) == algo and (algo <= 2 or algo == 5 or tonumber(oi) >= 1) then
                L = tonumber(ol)
                if algo == 3 or algo == 4 then I = tonumber(oi) end
            end
        end
        -- delay (flag 4): window_ms is the delay, in ms (token_bucket, gcra)
        local D, dly = 0, f >= 4
        if dly then D, f = W * 1000, f - 4 end
        -- the key's numbers when this call consumed from it (ka == algo); a
        -- key another algorithm wrote in this call reads as absent, as its
        -- STRING would. A key an earlier limit of this request consumed from
        -- is read as it was before the request (its first undo entry): every
        -- limit decides on the state before its request.
        local s, ka, x1, x2, x3 = vals[k], na[k]
        if tr and tr[k] == rq then
            local u = ub[k]
            ka, x1, x2, x3 = una[u], un1[u], un2[u], un3[u]
        elseif ka then
            x1, x2, x3 = n1[k], n2[k], n3[k]
        end
        if ka ~= nil and ka ~= algo then s, ka = nil, nil end
        local ok, rem, reset, retry, rem0, reset0, mark, val, opt, exp
        local v1, v2, v3                         -- a STRING write: its fields
        if algo <= 2 then
            if W < 1 then
                return redis.error_reply('ERR sluice limit.lua: bad window ' .. i)
            end
            local win = floor(now_ms / W)
            local wend = (win + 1) * W           -- the window's end, ms
            local cb = pcb[p]
            if cb then                           -- a calendar window: the period holding now
                local j = now_ms < cb[2] and 1 or now_ms < cb[3] and 2 or 3
                win, wend = cb[j], cb[j + 1]
                W = wend - win
            end
            mark = win
            if algo == 0 then
                -- fixed_window: one count per window index
                local cnt, same = 0, false
                if ka then
                    if x1 == win then cnt, same = x2, true end
                elseif s then
                    local sw, sn = match(s, '^F(%d+) (%d+)$')
                    if sw and tonumber(sw) == win then cnt, same = tonumber(sn), true end
                end
                reset = wend - now_ms
                rem0, reset0 = L - cnt, reset
                if rem0 < 0 then rem0 = 0 end
                ok = cnt + c <= L
                if ok then
                    rem, retry = L - cnt - c, 0
                    val, v1, v2 = true, win, cnt + c
                    if same then opt = 'KEEPTTL'        -- this window's key: its expiry stands
                    else
                        if pxs == nil then pxs = {} end
                        exp = pxs[p]
                        if exp == nil then exp = format('%d', wend); pxs[p] = exp end
                        opt = 'PXAT'
                    end
                else
                    rem, retry = 0, reset
                    if c > L then retry = W end
                end
            elseif algo == 1 then
                -- sliding_window: the counts, then sliding() decides
                local cc, pc, same = 0, 0, false
                local sw, sc, sp
                if ka then
                    sw, sc, sp = x1, x2, x3
                elseif s then
                    sw, sc, sp = match(s, '^S(%d+) (%d+) (%d+)$')
                end
                if sw then
                    sw = tonumber(sw)
                    if sw >= win then          -- current window (or a clock that went back)
                        cc, pc, same = tonumber(sc), tonumber(sp), sw == win
                    elseif sw == win - 1 then  -- the stored window is now the previous one
                        pc = tonumber(sc)
                    end
                end
                ok, rem, reset, retry, rem0, reset0 = sliding(L, W, c, cc, pc, win)
                if ok then
                    val, v1, v2, v3 = true, win, cc + c, pc
                    if same then opt = 'KEEPTTL'        -- this window's key: its expiry stands
                    else
                        if pxs == nil then pxs = {} end
                        exp = pxs[p]
                        if exp == nil then exp = format('%d', (win + 2) * W); pxs[p] = exp end
                        opt = 'PXAT'
                    end
                end
            else
                -- sliding_log: entries exactly W old are out, the live range
                -- is (now_ms - W, +inf). A key of another type reads as empty.
                local key = KEYS[k]
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
                if ka then
                    local elapsed = now_us - x1
                    if elapsed < 0 then elapsed = 0 end
                    tokens = x2 + elapsed / I
                    if tokens > B then tokens = B end
                elseif s then
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
                    val, v1, v2, opt = true, now_us, after, 'PX'
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
                if ka then
                    if x1 > now_us then tat = x1 end
                elseif s then
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
                    val, v1, opt = true, new_tat, 'PX'
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
            local key, member = KEYS[k], format('%d', I)
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
        -- One pass: a limit that allows consumes at once (its table entry, or
        -- a ZSET write due at the request's end) and is logged; when a later
        -- limit denies the request, the log undoes it, so a denied request
        -- consumes nothing. Limits that are not consumed report their
        -- unconsumed state.
        local v, r, wt = rem, reset, 0
        if not ok then
            v = -retry
            if f ~= 1 and f ~= 3 then denied = true end     -- not shadow
        elseif f >= 2 or denied then
            v, r = rem0, reset0             -- check only, or the request is denied already
        elseif m == 1 and opt ~= 'Z' and opt ~= 'ZS' and opt ~= 'C' and opt ~= 'CS' then
            -- a request of one STRING limit: consumed in place, nothing to undo
            na[k], n1[k], n2[k], n3[k] = algo, v1, v2, v3
            if opt ~= 'KEEPTTL' or wo[k] == nil then wo[k], we[k] = opt, exp end
            wt = retry                      -- a delay's wait
        else
            if uo == nil then
                uo, ur0, us0, ud, uk, una, un1, un2, un3, uwo, uwe =
                    {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}
                zk, zopt, zval, zexp, zc, tr, ub = {}, {}, {}, {}, {}, {}, {}
            end
            nu = nu + 1
            uo[nu], ur0[nu], us0[nu], ud[nu] = o, rem0, reset0, dly
            if opt == 'Z' or opt == 'ZS' or opt == 'C' or opt == 'CS' then
                uk[nu], zk[nu], zopt[nu], zval[nu], zexp[nu], zc[nu] = false, k, opt, val, exp, c
                nz = nz + 1
            else
                -- a STRING: the next limit reads the new value; written once,
                -- at the end. A KEEPTTL after a PXAT of this call (the window
                -- began in this batch) keeps the PXAT.
                uk[nu], una[nu], un1[nu], un2[nu], un3[nu], uwo[nu], uwe[nu] =
                    k, na[k], n1[k], n2[k], n3[k], wo[k], we[k]
                if tr[k] ~= rq then tr[k], ub[k] = rq, nu end
                na[k], n1[k], n2[k], n3[k] = algo, v1, v2, v3
                if opt ~= 'KEEPTTL' or wo[k] == nil then wo[k], we[k] = opt, exp end
                wt = retry                  -- a delay's wait
            end
        end
        out[o + 1], out[o + 2] = v, r
        o = o + 2
        if mk then
            out[o + 1] = mark
            o = o + 1
        end
        if dly then
            out[o + 1] = wt
            o = o + 1
        end
        if ovr then
            out[o + 1] = L
            o = o + 1
        end

        -- The request's last limit: undo it all when it is denied (newest
        -- first, so a key consumed twice gets its first state back), else make
        -- its ZSET writes, so the next request sees them.
        if left == 0 and nu > 0 then
            if denied then
                for u = nu, 1, -1 do
                    local q = uo[u]
                    out[q + 1], out[q + 2] = ur0[u], us0[u]
                    if ud[u] then out[q + (mk and 4 or 3)] = 0 end
                    local kk = uk[u]
                    if kk then
                        na[kk], n1[kk], n2[kk], n3[kk], wo[kk], we[kk] =
                            una[u], un1[u], un2[u], un3[u], uwo[u], uwe[u]
                    end
                end
            elseif nz > 0 then
                for u = 1, nu do
                    local zo = uk[u] == false and zopt[u]
                    if zo == 'C' or zo == 'CS' then
                        -- concurrency: the slot, scored by its lease's end
                        local key, W = KEYS[zk[u]], zexp[u]
                        if zo == 'CS' then redis.call('DEL', key) end
                        redis.call('ZADD', key, format('%d', now_ms + W), zval[u])
                        redis.call('PEXPIRE', key, format('%d', W))
                    elseif zo then
                        -- sliding_log: one member per unit
                        local key, W, cost = KEYS[zk[u]], zexp[u], zc[u]
                        if zo == 'ZS' then
                            redis.call('DEL', key)
                        else
                            redis.call('ZREMRANGEBYSCORE', key, '-inf', format('%d', now_ms - W))
                        end
                        local score = format('%d', now_ms)
                        local base = t[1] .. '.' .. t[2] .. '-'
                        local q = 1
                        while q <= cost do           -- ZADD in chunks: unpack has a limit
                            local args = {}
                            local last = cost
                            if last > q + 99 then last = q + 99 end
                            for x = q, last do
                                args[#args + 1] = score
                                args[#args + 1] = base .. format('%d', zval[u] + x)
                            end
                            redis.call('ZADD', key, unpack(args))
                            q = last + 1
                        end
                        redis.call('PEXPIRE', key, format('%d', W))
                    end
                end
            end
        end
    end
end

-- The STRING writes, one per key: SETRANGE over a value of this window
-- (KEEPTTL's case: the key and its expiry stand, only the value changes;
-- a count only grows within a window, so the new value is as long as the
-- old or longer and covers it; SET KEEPTTL when it is not, e.g. a value
-- with leading zeros), PSETEX for a
-- bucket or a TAT (its expiry moves with it), SET PXAT for a new window.
for k = 1, nk do
    local opt = wo[k]
    if opt then
        local ka, v = na[k]
        if ka == 0 then v = format('F%d %d', n1[k], n2[k])
        elseif ka == 1 then v = format('S%d %d %d', n1[k], n2[k], n3[k])
        elseif ka == 3 then v = format('B%d %.17g', n1[k], n2[k])
        else v = format('%d', n1[k]) end
        if opt == 'KEEPTTL' then
            local old = vals[k]
            if old and #v >= #old then
                redis.call('SETRANGE', KEYS[k], 0, v)
            else
                redis.call('SET', KEYS[k], v, 'KEEPTTL')
            end
        elseif opt == 'PX' then
            redis.call('PSETEX', KEYS[k], we[k], v)
        else
            redis.call('SET', KEYS[k], v, opt, we[k])
        end
    end
end
return out
