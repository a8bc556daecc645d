-- Acknowledge held messages: forget each tag in kombu's unacked hash and index, and its charge
-- (a channel's acks no fetch carried, sluice.queues.broker.qos; a held message made a dead
-- letter or dropped). KEYS: the unacked hash, its index, the held charges, the tenants' usage, the
-- held limits, the limits' running counts (held.lua); ARGV the delivery tags. Returns how many were held.
-- include held.lua

local count = 0
local K = {KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]}
for j = 1, #ARGV do count = count + unhold(K, ARGV[j]) end
return count
