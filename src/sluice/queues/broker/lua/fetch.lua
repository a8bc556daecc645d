-- Reliable fetch: take the next message off a worker's queues and record it as held, in one
-- atomic step, so a message is always in Redis: in a queue, in kombu's unacked hash, or in a
-- dead-letter list. (kombu's BRPOP removes it first and records it from Python afterwards.)
-- The arguments are built in one place, sluice.queues.broker.fetching.FetchCall.
--
-- KEYS[1] kombu's unacked hash, KEYS[2] its unacked index (sorted set by delivery time), KEYS[3]
-- the held messages' charges, KEYS[4] the tenants' usage, KEYS[5] the held messages' limits,
-- KEYS[6] the limits' running counts (held.lua), KEYS[7] the revoked task ids (sorted set: id ->
-- until when kept, sluice.queues.revokes), KEYS[8] the rate limits in use (sorted set:
-- "<id>\t<seconds between starts>" -> when one last started), KEYS[9] each task's limits for a
-- message that carries neither limits nor a charge (a plain Celery producer's:
-- sluice.keys.TASK_LIMITS), then six keys per queue, in the order to try them: its bell, its
-- dead-letter list, its dead-letter counter, its tenant set, its parked lines (sorted set) and
-- its parked count (list; sluice.keys.parked, parked_count).
-- ARGV[1] now (seconds), ARGV[2] "1" when a bell ring woke this fetch (its token is spent),
-- ARGV[3] the dead-letter list cap, ARGV[4] the bell cap, ARGV[5] a queue read deep and ARGV[6]
-- how deep ("0": at the head, as always; more: a packed worker backfilling past messages it has
-- no room for, see sluice.workers.packing; its class's own lines only), ARGV[7] the key prefix,
-- ARGV[8] kombu's separator and ARGV[9] its priority steps ("0,3,6,9": a queue's lists, read in
-- that order), ARGV[10] the separator of a tenant's queue, ARGV[11] the default tenant, ARGV[12]
-- and ARGV[13] the tenant and charge headers, ARGV[14] the publish-time header and ARGV[15] the
-- longest a message waits behind higher priorities of its tenant ("0": no bound), ARGV[16] the
-- limits header, ARGV[17] the prefix of a rate limit's key (+ its id: string, the earliest next
-- start in microseconds of Redis's clock, expiring then), ARGV[18] the number of queues; then four per
-- queue: "1" for a no-ack consumer (the message is only popped, as kombu does for no_ack) or
-- "0"; the queue's name; for a resource class, the charge of one slot ("<millicores> <bytes>
-- <gpus>") and the tenants' shares ("<tenant> <weight> <cpu cap> <memory cap> <gpu cap> ...",
-- "-" for no cap), "" for any other queue (taken first-in first-out, nothing charged); then the
-- delivery tags of messages the worker has acknowledged since its last fetch, forgotten first
-- (kombu's ack, carried by the fetch: a round trip fewer per task).
--
-- A resource class's next message comes from the tenant (the default one on the class's own
-- queue, each other on its tenant queue) with the lowest weighted dominant share of what its
-- held messages charge (dominant-resource fairness over cpu, memory and gpu, in slots of the
-- class), among those with a message waiting whose charge fits under their quota; inside a
-- tenant, the lowest priority step first, then first in, first out (past a message waiting for a
-- concurrency limit, up to SCAN deep: it stays where it is; one waiting for a rate limit is
-- parked, see below), except that a message at the
-- head of a later step that has waited past the bound (by its publish-time header) goes first,
-- the longest-waiting of such first, so no priority starves. A message on the class's own
-- queue that names another tenant (a plain Celery producer's header, or one put back there) is
-- moved to its tenant's queue and the choice made again. A taken message's charge (its charge
-- header, else one slot) is recorded with it (held.lua). A message whose charge alone is over
-- its tenant's quota could never fit: it is taken, and admission on the worker fails it.
--
-- A publish pushes one bell token and does not trim (one command less on every .delay()): the
-- fetch that takes a message spends a token and trims the bell to its cap, so a bell holds at
-- most the cap while its queue is served, and one small token per waiting message while not
-- (the token and the cap: sluice.queues.broker.bells).
--
-- A message whose envelope is not kombu's (not JSON, not valid UTF-8, not an object, no delivery
-- tag) is moved to its queue's dead-letter list as "<json header>\n<raw message>" (the format of
-- sluice.queues.broker.letters.DeadLetter; a test holds the two equal) and the search goes on;
-- on a no-ack consumer's list (a control command's replies) it is dropped instead, as kombu would
-- have popped it and failed to read it, and nothing is left behind.
-- A message's limits ({id, most running, 0} or {id, 0, seconds between starts, N, window} in its
-- limits header) have room while each running count is under its most and, by Redis's clock
-- (the same for every worker), each rate limit's next start has come and fewer than N of its
-- starts fall in the last window. Taking it counts it (held.lua) and records the start. Starts
-- are spaced evenly (Celery's token bucket of one), one up to half a spacing early after a late
-- one, so the rate is not lost to a worker's lateness, while the window caps any stretch at N.
-- A message that must wait for a rate limit is parked: moved out of its line to a list of its
-- queue's for that line and limit, listed with the limit's next start, so no fetch reads it
-- again before then; once that time has come, a fetch of the queue puts the oldest parked one
-- back at the head of its line (one per line and limit per fetch: the next start it takes moves
-- the rest's time on). One waiting for a concurrency limit stays in its line, read past.
-- Returns {dead} when nothing could be taken ({dead, microseconds} when a message waits for a
-- rate limit's next start, the soonest such), else {dead, queue number (1-based), raw, tag, 1
-- when the message's task is recorded as revoked (the worker ends it REVOKED) or 0}.
-- include held.lua

-- The position of the first byte that is not part of well-formed UTF-8 (RFC 3629: no overlong
-- forms, no surrogates, nothing past U+10FFFF; what Python's strict decoder refuses), or nil.
-- cjson does not check, and sluice's readers (sluice.entries.loads, strict as this) would refuse
-- the message after a worker took it. Redis's Lua 5.1 has no utf8 library: ASCII runs are skipped by
-- string.find (C speed; a kombu message is ASCII throughout), each other sequence is checked
-- here by its lead byte, the range of its second byte, and the continuation bytes after it.
local function bad_utf8_at(s)
  local i = 1
  while true do
    i = string.find(s, '[\128-\255]', i)
    if not i then return nil end
    local lead, low, high, more = string.byte(s, i), 128, 191, 0
    if lead >= 194 and lead <= 223 then more = 1
    elseif lead == 224 then low, more = 160, 2      -- no overlong 3-byte forms
    elseif lead == 237 then high, more = 159, 2     -- no surrogates (U+D800..U+DFFF)
    elseif lead >= 225 and lead <= 239 then more = 2
    elseif lead == 240 then low, more = 144, 3      -- no overlong 4-byte forms
    elseif lead == 244 then high, more = 143, 3     -- nothing past U+10FFFF
    elseif lead >= 241 and lead <= 243 then more = 3
    else return i end                                -- a continuation byte, C0, C1 or F5..FF
    local second = string.byte(s, i + 1)
    if not second or second < low or second > high then return i end
    for j = i + 2, i + more do
      local byte = string.byte(s, j)
      if not byte or byte < 128 or byte > 191 then return i end
    end
    i = i + more + 1
  end
end

local function envelope(raw)
  local ok, message = pcall(cjson.decode, raw)
  if not ok then return nil, 'not JSON' end
  local bad = bad_utf8_at(raw)
  if bad then return nil, 'not valid UTF-8 (byte ' .. (bad - 1) .. ')' end
  if type(message) ~= 'table' or #message > 0 then return nil, 'not a JSON object' end  -- cjson: arrays are tables
  local properties = message['properties']
  if type(properties) ~= 'table' then return nil, 'no "properties" object' end
  local tag = properties['delivery_tag']
  if type(tag) ~= 'string' or tag == '' then return nil, 'no "properties.delivery_tag" string' end
  local info = properties['delivery_info']
  if type(info) ~= 'table' then return nil, 'no "properties.delivery_info" object' end
  local exchange, routing_key = info['exchange'], info['routing_key']
  if type(exchange) ~= 'string' or type(routing_key) ~= 'string' then
    return nil, 'no "delivery_info.exchange" and "routing_key" strings'
  end
  local headers = message['headers']
  return tag, exchange, routing_key, type(headers) == 'table' and headers or {}
end

local UNACKED, INDEX, CHARGES, USAGE, HELD_LIMITS, RUNNING, REVOKED, RATES = KEYS[1], KEYS[2], KEYS[3],
  KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local TASK_LIMITS = KEYS[9]
local UNHOLD = {UNACKED, INDEX, CHARGES, USAGE, HELD_LIMITS, RUNNING}
local now, woken, cap, bell_cap = ARGV[1], ARGV[2] == '1', tonumber(ARGV[3]), tonumber(ARGV[4])
local deep_queue, depth = ARGV[5], tonumber(ARGV[6])
local prefix, sep, tenant_sep, default_tenant = ARGV[7], ARGV[8], ARGV[10], ARGV[11]
local tenant_header, charge_header = ARGV[12], ARGV[13]
local steps = {}
for step in string.gmatch(ARGV[9], '[^,]+') do steps[#steps + 1] = step end
local sent_header, max_wait, limits_header, rate_prefix = ARGV[14], tonumber(ARGV[15]), ARGV[16], ARGV[17]
local queues = tonumber(ARGV[18])
local FIRST = 19  -- the first argument of the first queue
local SCAN = 64   -- how many messages whose limits have no room one line's read passes or parks
local PARK_CHECK = 8  -- parked lines a fetch looks at per queue
local RATE_SEEN = 600  -- how long a rate limit stays listed in RATES after its last start (seconds)
local STARTS = '\tstarts'  -- a rate limit's key + this: its last N starts (list, newest first)
-- Queue i's n-th key (1: bell, 2: dead-letter list, 3: dead-letter counter, 4: tenant set,
-- 5: parked lines, 6: parked count).
local function qkey(i, n) return KEYS[9 + 6 * (i - 1) + n] end
for j = FIRST + 4 * queues, #ARGV do unhold(UNHOLD, ARGV[j]) end

local dead, malformed = 0, 0  -- dead-lettered; and dropped too (one fetch reads at most 100 such)

-- The lists of the queue named `base` (in full), one per priority step, in the order read.
local function lists_of(base)
  local lists = {}
  for s = 1, #steps do lists[s] = steps[s] == '0' and base or base .. sep .. steps[s] end
  return lists
end

-- {millicores, bytes, gpus} as strings from "<m> <b> <g>", or nil.
local function parse_charge(text)
  if type(text) ~= 'string' then return nil end
  local m, b, g = string.match(text, '^(%d+) (%d+) (%d+)$')
  return m and {m, b, g} or nil
end

local function is_tenant(name)
  return type(name) == 'string' and #name <= 64 and string.match(name, '^[%w][%w%._%-]*$') ~= nil
end

local clock  -- Redis's time in microseconds, read at the first rate limit met
local function now_us()
  if not clock then
    local t = redis.call('TIME')
    clock = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return clock
end
local rate_wait  -- the soonest next start of a rate limit that kept a message waiting (microseconds from now)

-- A message's limits (on a resource class, a message without limits or charge headers has
-- its task's, from TASK_LIMITS; not on the intake, which only forwards): the ids of its
-- concurrency limits, its rate limits ({id, microseconds between starts}), whether one of them
-- has no room now (a running count at its most, a next start still to come: rate_wait notes
-- when), and the first rate limit it waits for ({id, its next start}), if any.
local task_limits = {}  -- TASK_LIMITS read by this fetch, by task name
local function limits_of(headers, on_class)
  local ids, rates, full, waits_for = {}, {}, false, nil
  local limits, task = headers[limits_header], headers['task']
  if limits == nil and on_class and headers[charge_header] == nil and type(task) == 'string' then
    if task_limits[task] == nil then
      local ok, decoded = pcall(cjson.decode, redis.call('HGET', TASK_LIMITS, task) or '[]')
      task_limits[task] = ok and decoded or {}
    end
    limits = task_limits[task]
  end
  if type(limits) ~= 'table' then return ids, rates, full end
  for _, limit in ipairs(limits) do
    if type(limit) == 'table' and type(limit[1]) == 'string' then
      local most, every = tonumber(limit[2]) or 0, tonumber(limit[3]) or 0
      if most > 0 then
        ids[#ids + 1] = limit[1]
        if (tonumber(redis.call('HGET', RUNNING, limit[1])) or 0) >= most then full = true end
      end
      if every > 0 then
        local spacing = math.ceil(every * 1000000 - 0.001)
        local most_starts = math.max(1, math.floor(tonumber(limit[4]) or 1))
        local window = math.ceil((tonumber(limit[5]) or every) * 1000000 - 0.001)
        rates[#rates + 1] = {limit[1], spacing, most_starts, window}
        local next_start = (tonumber(redis.call('GET', rate_prefix .. limit[1])) or 0) - spacing / 2
        local oldest = tonumber(redis.call('LINDEX', rate_prefix .. limit[1] .. STARTS, most_starts - 1))
        if oldest and oldest + window > next_start then next_start = oldest + window end
        if next_start > now_us() then
          full = true
          waits_for = waits_for or {limit[1], next_start}
          if not rate_wait or next_start - now_us() < rate_wait then rate_wait = next_start - now_us() end
        end
      end
    end
  end
  return ids, rates, full, waits_for
end

local function seconds(us) return string.format('%.6f', us / 1000000) end

-- Park a message of `line` (`at` behind its head) of queue i that waits for rate limit
-- waits_for = {id, next start}, with its tenant's other such messages of that line.
local function park(i, line, raw, at, tenant, waits_for)
  if at == 0 then redis.call('RPOP', line) else redis.call('LREM', line, -1, raw) end
  local member = tenant .. '\t' .. line .. '\t' .. waits_for[1]
  redis.call('LPUSH', qkey(i, 5) .. '\t' .. member, raw)
  redis.call('ZADD', qkey(i, 5), seconds(waits_for[2]), member)
  redis.call('LPUSH', qkey(i, 6), '1')
end

-- Queue i's parked lines whose time has come: each one's oldest message back at the head of its
-- line (one whose entry does not name its line: at the head of the queue's own, nothing is lost).
-- The line is looked at again at its limit's next start once one is taken (start_rates), or in
-- a second.
local function unpark(i)
  local index = qkey(i, 5)
  local first = redis.call('ZRANGE', index, 0, 0, 'WITHSCORES')  -- none parked (as a rule): one command, no clock
  if #first == 0 or tonumber(first[2]) * 1000000 > now_us() then return end
  local due = redis.call('ZRANGEBYSCORE', index, '-inf', seconds(now_us()), 'LIMIT', 0, PARK_CHECK)
  for _, member in ipairs(due) do
    local parked = index .. '\t' .. member
    local raw = redis.call('RPOP', parked)
    local tenant, line = string.match(member, '^([^\t]*)\t([^\t]+)\t')
    if raw then
      redis.call('RPUSH', line or prefix .. ARGV[FIRST + 4 * (i - 1) + 1], raw)
      redis.call('RPOP', qkey(i, 6))
      if line and is_tenant(tenant) and tenant ~= default_tenant then redis.call('SADD', qkey(i, 4), tenant) end
    end
    if redis.call('LLEN', parked) == 0 then
      redis.call('ZREM', index, member)
    else
      redis.call('ZADD', index, seconds(now_us() + 1000000), member)
    end
  end
end

-- The soonest time a parked line of queue i is due, in microseconds from now (nil: none parked).
local function parked_wait(i)
  local first = redis.call('ZRANGE', qkey(i, 5), 0, 0, 'WITHSCORES')
  if #first == 0 then return nil end
  return math.max(0, tonumber(first[2]) * 1000000 - now_us())
end

-- Start a taken message's rate limits: each one's schedule moves a spacing on from where it was,
-- or from now if that is later (the key: its next start on schedule; one may come half a
-- spacing early, so a worker up to that late loses the limit nothing: GCRA), and this start
-- joins the last N; the messages of its line (queue i's `line`, `tenant`'s) parked on it are
-- due at its next start.
local function start_rates(rates, i, line, tenant)
  for _, rate in ipairs(rates) do
    local id, every, most_starts, window = rate[1], rate[2], rate[3], rate[4]
    local key, starts = rate_prefix .. id, rate_prefix .. id .. STARTS
    local scheduled = math.max(tonumber(redis.call('GET', key)) or 0, now_us()) + every
    redis.call('SET', key, string.format('%.0f', scheduled), 'PX', math.ceil((scheduled - now_us()) / 1000) + 1)
    redis.call('LPUSH', starts, string.format('%.0f', now_us()))
    redis.call('LTRIM', starts, 0, most_starts - 1)
    redis.call('PEXPIRE', starts, math.ceil(window / 1000) + 1)
    local due = scheduled - every / 2
    local oldest = tonumber(redis.call('LINDEX', starts, most_starts - 1))
    if oldest and oldest + window > due then due = oldest + window end
    redis.call('ZADD', qkey(i, 5), 'XX', seconds(due), tenant .. '\t' .. line .. '\t' .. id)
    redis.call('ZADD', RATES, string.format('%.6f', now_us() / 1000000), id .. '\t' .. (every / 1000000))
  end
  if #rates > 0 then redis.call('ZREMRANGEBYSCORE', RATES, '-inf', now_us() / 1000000 - RATE_SEEN) end
end

-- The next well-formed message of `list` of queue `i` (its head, or `depth` deep), with its tag,
-- exchange, routing key, headers and limits (limits_of); a malformed one on the way goes to
-- the dead letters. A message that waits for a rate limit is parked (as `tenant`'s), one that
-- waits for a concurrency limit stays where it is, and the one behind is read, up to SCAN such:
-- nil and true when all those read were such.
local function pop(i, list, deep, tenant)
  local a = FIRST + 4 * (i - 1)
  local at, skipped, passed = deep and depth or 0, false, 0  -- how many messages behind the head; passed or parked
  while malformed < 100 do
    local raw = redis.call('LINDEX', list, -1 - at)
    if not raw then return nil, skipped end
    local tag, exchange, routing_key, headers = envelope(raw)  -- or nil and the reason
    local ids, rates, full, waits_for = {}, {}, false, nil
    if tag then ids, rates, full, waits_for = limits_of(headers, ARGV[a + 2] ~= '') end
    if tag and full then
      if waits_for and ARGV[a] ~= '1' then park(i, list, raw, at, tenant, waits_for) else at = at + 1 end
      skipped, passed = true, passed + 1
      if passed >= SCAN then return nil, true end
    else
      if at == 0 then redis.call('RPOP', list) else redis.call('LREM', list, -1, raw) end  -- the first equal from the head: that one
      if tag then return raw, tag, exchange, routing_key, headers, {ids, rates, list} end
      if ARGV[a] ~= '1' then  -- a no-ack consumer's (replies) is dropped, as kombu's would be
        local header = cjson.encode({reason = exchange, queue = ARGV[a + 1], at = tonumber(now)})
        redis.call('LPUSH', qkey(i, 2), header .. '\n' .. raw)
        redis.call('LTRIM', qkey(i, 2), 0, cap - 1)
        redis.call('INCR', qkey(i, 3))
        dead = dead + 1
      end
      malformed = malformed + 1
    end
  end
  return nil, skipped
end

-- Record a taken message as held (with its tenant's charge, on a resource class, and its
-- concurrency limits' counts), start its rate limits and spend a bell token.
local function hold(i, raw, tag, exchange, routing_key, tenant, charge, limits)
  if not woken then redis.call('RPOP', qkey(i, 1)) end
  redis.call('LTRIM', qkey(i, 1), 0, bell_cap - 1)
  start_rates(limits[2], i, limits[3], tenant)
  if ARGV[FIRST + 4 * (i - 1)] == '1' then return end
  redis.call('ZADD', INDEX, now, tag)
  redis.call('HSET', UNACKED, tag, '[' .. raw .. ',' .. cjson.encode(exchange) .. ',' .. cjson.encode(routing_key) .. ']')
  if charge then hold_charge(CHARGES, USAGE, tag, ARGV[FIRST + 4 * (i - 1) + 1], tenant, charge) end
  hold_limits(HELD_LIMITS, RUNNING, tag, limits[1])
end

-- A queue that is not a resource class (no slot), a no-ack one, or a deep read: its own lists in order.
local function take_plain(i, deep)
  local a = FIRST + 4 * (i - 1)
  for _, list in ipairs(lists_of(prefix .. ARGV[a + 1])) do
    local raw, tag, exchange, routing_key, headers, limits = pop(i, list, deep, default_tenant)
    if raw then
      hold(i, raw, tag, exchange, routing_key, default_tenant, parse_charge(ARGV[a + 2]), limits)
      return raw, tag, headers
    end
  end
  return nil
end

-- The list of a tenant's `lists` (one per priority step, in order) to take from next: the first
-- that is not empty, unless the head of a later one has waited past the bound (the longest-
-- waiting such head's list, then); nil when all are empty.
local function next_list(lists)
  local first, overdue, oldest
  for _, list in ipairs(lists) do
    if redis.call('LLEN', list) > 0 then
      if not first then
        first = list
        if max_wait <= 0 then return first end
      else
        local ok, message = pcall(cjson.decode, redis.call('LINDEX', list, -1))
        local headers = ok and type(message) == 'table' and message['headers']
        local sent = type(headers) == 'table' and tonumber(headers[sent_header])
        if sent and tonumber(now) - sent > max_wait and (not oldest or sent < oldest) then
          overdue, oldest = list, sent
        end
      end
    end
  end
  return overdue or first
end

-- A resource class: the tenant with the lowest weighted dominant share first (see the top).
local function take_fair(i)
  local a = FIRST + 4 * (i - 1)
  local queue, slot, tenants = ARGV[a + 1], parse_charge(ARGV[a + 2]), qkey(i, 4)
  local shares = {}
  for name, weight, c, m, g in string.gmatch(ARGV[a + 3], '(%S+) (%S+) (%S+) (%S+) (%S+)') do
    shares[name] = {tonumber(weight), tonumber(c), tonumber(m), tonumber(g)}
  end
  local function used(tenant)
    local fields = {}
    for k = 1, 3 do fields[k] = usage_field(queue, tenant, AXES[k]) end
    local values = redis.call('HMGET', USAGE, fields[1], fields[2], fields[3])
    return {tonumber(values[1]) or 0, tonumber(values[2]) or 0, tonumber(values[3]) or 0}
  end
  local blocked = {}
  for _ = 1, 200 do  -- each round takes a message, or moves, blocks or buries one
    local names = redis.call('SMEMBERS', tenants)
    names[#names + 1] = default_tenant
    local best, best_share, best_list
    for _, name in ipairs(names) do
      if not blocked[name] then
        local base = prefix .. queue
        if name ~= default_tenant then base = base .. tenant_sep .. name end
        local first = next_list(lists_of(base))
        if first then
          local use, share = used(name), 0
          for k = 1, 3 do
            local size = tonumber(slot[k])
            if size > 0 and use[k] / size > share then share = use[k] / size end
          end
          share = share / ((shares[name] or {})[1] or 1)
          if not best or share < best_share or (share == best_share and name < best) then
            best, best_share, best_list = name, share, first
          end
        elseif name ~= default_tenant then
          redis.call('SREM', tenants, name)  -- listed again by the next push to its queue
        end
      end
    end
    if not best then return nil end
    local raw, tag, exchange, routing_key, headers, limits = pop(i, best_list, false, best)
    if not raw and tag then
      blocked[best] = true  -- every message read of its line waits for a limit
    elseif raw then
      local named = headers[tenant_header]
      local step = string.match(best_list, sep .. '(%d+)$')
      if best == default_tenant and named ~= default_tenant and is_tenant(named) then
        local home = prefix .. queue .. tenant_sep .. named
        redis.call('RPUSH', step and home .. sep .. step or home, raw)  -- at the head of its tenant's line
        redis.call('SADD', tenants, named)
      else
        local charge = parse_charge(headers[charge_header]) or slot
        local use, fits = used(best), true
        local quota = shares[best] or {}
        for k = 1, 3 do  -- one that could never fit is taken, for the worker to fail it (OverQuota)
          local cap, need = quota[k + 1], tonumber(charge[k])
          if cap and need <= cap and use[k] + need > cap then fits = false end
        end
        if fits then
          hold(i, raw, tag, exchange, routing_key, best, charge, limits)
          return raw, tag, headers
        end
        redis.call('RPUSH', best_list, raw)  -- back at the head: it waits for its tenant's usage to fall
        blocked[best] = true
      end
    elseif malformed >= 100 then
      return nil
    end
  end
  return nil
end

for i = 1, queues do
  local a = FIRST + 4 * (i - 1)
  local raw, tag, headers
  if ARGV[a] ~= '1' then unpark(i) end
  if depth > 0 and ARGV[a + 1] == deep_queue then
    raw, tag, headers = take_plain(i, true)
  elseif ARGV[a] == '1' or ARGV[a + 2] == '' then
    raw, tag, headers = take_plain(i, false)
  else
    raw, tag, headers = take_fair(i)
  end
  if raw then
    local id, revoked = headers['id'], 0
    if ARGV[a] ~= '1' and type(id) == 'string' then
      local until_ = tonumber(redis.call('ZSCORE', REVOKED, id))
      if until_ and until_ > tonumber(now) then revoked = 1 end
    end
    return {dead, i, raw, tag, revoked}
  end
  if malformed >= 100 then return {dead} end
end
for i = 1, queues do
  local due = parked_wait(i)
  if due and (not rate_wait or due < rate_wait) then rate_wait = due end
end
if rate_wait then return {dead, math.ceil(rate_wait)} end
return {dead}
