-- sluice - part_reset.lua: the admin API's reset of one limit that is a
-- part of its route's key (limit.lua's "One key per route"): the part is
-- removed, the other parts and the key's expiry stay; the key goes when
-- no part is left.
--
-- Call:   EVAL script 1 KEY HEAD     HEAD the part's head, ";TAG="
-- Reply:  1 when the part was there, else 0 (also for a key of another
--         type, which is left alone).

local find, sub = string.find, string.sub
local s = redis.pcall('GET', KEYS[1])
if type(s) ~= 'string' then return 0 end
local h = ARGV[1]
local out, n, found, x = {}, 0, 0, find(s, ';', 1, true)
while x do
    local y = find(s, ';', x + 1, true)
    local part = sub(s, x, (y or 0) - 1)
    if sub(part, 1, #h) == h then
        found = 1
    else
        n = n + 1
        out[n] = part
    end
    x = y
end
if found == 0 then return 0 end
if n == 0 then
    redis.call('DEL', KEYS[1])
else
    redis.call('SET', KEYS[1], table.concat(out), 'KEEPTTL')
end
return 1
