-- What held messages charge their tenants (included by every script that holds a message or
-- lets one go: fetch, ack, forward). A held message's charge is recorded beside kombu's unacked
-- hash in the same atomic step that holds it, and removed in the same step that removes it
-- there, so a tenant's usage on a class is always the sum of its held messages' charges, through
-- any kill of a worker, a driver or Redis (sluice.tenants; the keys: sluice.keys.HELD_CHARGES and
-- TENANT_USAGE). Fields and records are tab-separated; numbers stay the strings they were sent
-- as (Lua's own would print a large byte count in exponent form).

local AXES = {'cpu', 'memory', 'gpu'}

local function usage_field(queue, tenant, axis)
  return queue .. '\t' .. tenant .. '\t' .. axis
end

-- Record that held message `tag` charges `tenant` on class `queue` the strings charge[1..3]
-- (millicores, bytes, gpus).
local function hold_charge(charges, usage, tag, queue, tenant, charge)
  redis.call('HSET', charges, tag, queue .. '\t' .. tenant .. '\t' .. table.concat(charge, '\t'))
  for k = 1, 3 do
    if charge[k] ~= '0' then redis.call('HINCRBY', usage, usage_field(queue, tenant, AXES[k]), charge[k]) end
  end
end

-- Remove held message `tag`'s charge, if it has one (a message kombu itself held has none).
local function release_charge(charges, usage, tag)
  local record = redis.call('HGET', charges, tag)
  if not record then return end
  redis.call('HDEL', charges, tag)
  local queue, tenant, m, b, g = string.match(record, '^([^\t]*)\t([^\t]*)\t(%d+)\t(%d+)\t(%d+)$')
  if not queue then return end
  local charge = {m, b, g}
  for k = 1, 3 do
    if charge[k] ~= '0' then
      local field = usage_field(queue, tenant, AXES[k])
      if redis.call('HINCRBY', usage, field, '-' .. charge[k]) <= 0 then redis.call('HDEL', usage, field) end
    end
  end
end

-- Forget held message `tag`: kombu's unacked hash and index, and its charge. 1 if it was held.
local function unhold(unacked, index, charges, usage, tag)
  release_charge(charges, usage, tag)
  redis.call('ZREM', index, tag)
  return redis.call('HDEL', unacked, tag)
end
