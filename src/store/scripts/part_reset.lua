-- sluice - part_reset.lua: the admin API's reset of one limit that is a
-- part of its route's key (limit.lua's "One key per route"): its record is
-- removed, the other records and the key's expiry stay; the key goes when
-- no record is left.
--
-- Call:   EVAL script 1 KEY HEAD     HEAD ";" and the tag, big-endian (5
--                                    bytes): the record's first bytes
-- Reply:  1 when the record was there, else 0 (also for a key of another
--         type, which is left alone).

local sub = string.sub
local s = redis.pcall('GET', KEYS[1])
if type(s) ~= 'string' then return 0 end
local h = ARGV[1]
local out, n, found = {}, 0, 0
for x = 1, #s - 29, 30 do                    -- records of 30 bytes
    local rec = sub(s, x, x + 29)
    if sub(rec, 1, 5) == h then
        found = 1
    else
        n = n + 1
        out[n] = rec
    end
end
if found == 0 then return 0 end
if n == 0 then
    redis.call('DEL', KEYS[1])
else
    redis.call('SET', KEYS[1], table.concat(out), 'KEEPTTL')
end
return 1
