-- Acknowledge held messages: forget each tag in kombu's unacked hash and index, and its charge
-- (a channel's acks no fetch carried, sluice.queues.broker.qos; a held message made a dead
-- letter or dropped). KEYS[1] the unacked hash, KEYS[2] its index, KEYS[3] the held charges,
-- KEYS[4] the tenants' usage; ARGV the delivery tags. Returns how many were held.
-- include held.lua

local count = 0
for j = 1, #ARGV do count = count + unhold(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[j]) end
return count
