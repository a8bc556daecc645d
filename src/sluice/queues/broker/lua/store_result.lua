-- Store a task's state unless a success is already stored: Celery's own rule (a lost or
-- redelivered task must not overwrite the result of a run that succeeded), kept in one atomic
-- step instead of Celery's GET and then a SET + PUBLISH pipeline, two round trips per state.
-- With a STARTED state, the worker's delivery-ledger claim rides along (sluice.tasks.ledger).
--
-- KEYS[1] the task's result key, KEYS[2] (optional) the task's ledger key.
-- ARGV[1] the encoded meta (JSON), ARGV[2] its expiry in seconds ("" for none), ARGV[3] the
-- message to publish instead of the meta ("" for the meta itself), and with KEYS[2]: ARGV[4]
-- the claim, ARGV[5] its expiry in seconds.
-- Publishes the meta on the key's channel, as Celery's Redis backend does, for the waiters
-- subscribed to it; a meta too big for Redis's pub/sub buffer limits is announced instead by
-- a notice (sluice.queues.broker.result_consumer.Notice), and the waiters read the stored meta.
-- Returns {1 when stored, 0 when a success was already there; the claim the new one
-- replaced, or nil}.

local stored = 0
local current = redis.call('GET', KEYS[1])
local ok, meta = false, nil
if current then ok, meta = pcall(cjson.decode, current) end
if not (ok and type(meta) == 'table' and meta['status'] == 'SUCCESS') then
  if ARGV[2] ~= '' then
    redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
  else
    redis.call('SET', KEYS[1], ARGV[1])
  end
  if ARGV[3] ~= '' then
    redis.call('PUBLISH', KEYS[1], ARGV[3])
  else
    redis.call('PUBLISH', KEYS[1], ARGV[1])
  end
  stored = 1
end
local previous = false
if KEYS[2] then previous = redis.call('SET', KEYS[2], ARGV[4], 'EX', ARGV[5], 'GET') end
return {stored, previous}
