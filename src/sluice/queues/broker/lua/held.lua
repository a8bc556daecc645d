-- What held messages charge their tenants and their concurrency limits (included by every script
-- that holds a message or lets one go: fetch, ack, forward). A held message's charge and limits
-- are recorded beside kombu's unacked hash in the same atomic step that holds it, and removed in
-- the same step that removes it there, so a tenant's usage on a class is always the sum of its
-- held messages' charges, and a limit's running count the number of its held messages, through
-- any kill of a worker, a driver or Redis (sluice.tenants, sluice.tasks.limits; the keys:
-- sluice.keys.HELD_CHARGES, TENANT_USAGE, HELD_LIMITS and LIMIT_RUNNING, in that order after the
-- unacked hash and index: sluice.queues.broker.layout.RedisLayout.unhold_keys). Fields and
-- records are tab-separated; numbers stay the strings they were sent as (Lua's own would print
-- a large byte count in exponent form).

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

-- Record that held message `tag` counts against each concurrency limit of `ids` (a table).
local function hold_limits(held_limits, running, tag, ids)
  if #ids == 0 then return end
  redis.call('HSET', held_limits, tag, cjson.encode(ids))
  for _, id in ipairs(ids) do redis.call('HINCRBY', running, id, 1) end
end

-- Remove held message `tag`'s count from its concurrency limits, if it has any.
local function release_limits(held_limits, running, tag)
  local record = redis.call('HGET', held_limits, tag)
  if not record then return end
  redis.call('HDEL', held_limits, tag)
  local ok, ids = pcall(cjson.decode, record)
  if not ok or type(ids) ~= 'table' then return end
  for _, id in ipairs(ids) do
    if redis.call('HINCRBY', running, id, -1) <= 0 then redis.call('HDEL', running, id) end
  end
end

-- Forget held message `tag`: kombu's unacked hash and index, its charge and its limits' counts.
-- K: the keys, as RedisLayout.unhold_keys names them. 1 if it was held.
local function unhold(K, tag)
  release_charge(K[3], K[4], tag)
  release_limits(K[5], K[6], tag)
  redis.call('ZREM', K[2], tag)
  return redis.call('HDEL', K[1], tag)
end
