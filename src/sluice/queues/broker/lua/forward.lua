-- Forward: move a message a worker holds to another queue, in one atomic step, so it is never
-- in both places (run twice) nor in neither (lost). Admission uses it (sluice.workers.admission),
-- a packed worker putting back a message it has no room for (sluice.workers.packing), and a
-- restore (kombu's, on a closing channel or a visibility timeout, and the orphan reaper's).
-- The held message's charge goes with it (held.lua): the fetch that takes it again charges it.
--
-- KEYS[1] kombu's unacked hash, KEYS[2] its unacked index, KEYS[3] the target queue's list (for
-- the message's priority and tenant), KEYS[4] the bell its class's workers wait on, KEYS[5] the
-- forward counters hash, KEYS[6] the held charges, KEYS[7] the tenants' usage, KEYS[8] the held
-- limits, KEYS[9] the limits' running counts (held.lua), KEYS[10] the target class's tenant set.
-- ARGV[1] the held message's delivery tag, ARGV[2] the message to push (its delivery info and
-- headers already rewritten for the target), ARGV[3] the bell cap, ARGV[4] the counter's field
-- ("" to count nothing), ARGV[5] "" to push it at the tail of the queue, or a number d to put it
-- back d messages behind the head (0: the head, taken next), where a packed worker found it,
-- ARGV[6] the tenant to list in the tenant set ("" for none: the class's own queue).
-- Returns 1 when moved, 0 when the tag was no longer held (restored by the reaper or by kombu's
-- visibility timeout: the queue it came from has it again, and nothing is pushed).
-- include held.lua

if unhold({KEYS[1], KEYS[2], KEYS[6], KEYS[7], KEYS[8], KEYS[9]}, ARGV[1]) == 0 then return 0 end
local depth = tonumber(ARGV[5])
if depth then
  local ahead = {}
  for _ = 1, depth do
    local message = redis.call('RPOP', KEYS[3])
    if not message then break end
    ahead[#ahead + 1] = message
  end
  redis.call('RPUSH', KEYS[3], ARGV[2])
  for k = #ahead, 1, -1 do redis.call('RPUSH', KEYS[3], ahead[k]) end
else
  redis.call('LPUSH', KEYS[3], ARGV[2])
end
redis.call('LPUSH', KEYS[4], 1)  -- a bell token, as sluice.queues.broker.bells rings (a test holds them equal)
redis.call('LTRIM', KEYS[4], 0, tonumber(ARGV[3]) - 1)
if ARGV[6] ~= '' then redis.call('SADD', KEYS[10], ARGV[6]) end
if ARGV[4] ~= '' then redis.call('HINCRBY', KEYS[5], ARGV[4], 1) end
return 1
