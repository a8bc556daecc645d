-- Reliable fetch: take the next message off a worker's queue lists and record it as held, in one
-- atomic step, so a message is always in Redis: in a queue, in kombu's unacked hash, or in a
-- dead-letter list. (kombu's BRPOP removes it first and records it from Python afterwards.)
--
-- KEYS[1] kombu's unacked hash, KEYS[2] its unacked index (sorted set by delivery time), then
-- four keys per queue list, in the order to try them: the list, its queue's bell, its queue's
-- dead-letter list, its queue's dead-letter counter.
-- ARGV[1] now (seconds), ARGV[2] "1" when a bell ring woke this fetch (its token is spent),
-- ARGV[3] the dead-letter list cap, ARGV[4] the bell cap, ARGV[5] a queue whose lists are read
-- ARGV[6] messages deep ("0": at the head, as always; more: a packed worker backfilling past
-- messages it has no room for, see sluice.workers.packing), then two per list: "1" for a no-ack
-- consumer (the message is only popped, as kombu does for no_ack) or "0", and the list's queue
-- name; then the delivery tags of messages the worker has acknowledged since its last fetch,
-- removed from the unacked hash and index first (kombu's ack, carried by the fetch: a round
-- trip fewer per task).
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
-- Returns {dead} when nothing could be taken, else {dead, list number (1-based), raw, tag}.

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
  return tag, exchange, routing_key
end

local now, woken, cap, bell_cap = ARGV[1], ARGV[2] == '1', tonumber(ARGV[3]), tonumber(ARGV[4])
local deep_queue, depth = ARGV[5], tonumber(ARGV[6])
local lists = (#KEYS - 2) / 4
for j = 7 + 2 * lists, #ARGV do
  redis.call('ZREM', KEYS[2], ARGV[j])
  redis.call('HDEL', KEYS[1], ARGV[j])
end
local dead, malformed = 0, 0  -- dead-lettered; and dropped too (one fetch reads at most 100 such)
for i = 1, lists do
  local list, bell, dead_list, dead_count = KEYS[4 * i - 1], KEYS[4 * i], KEYS[4 * i + 1], KEYS[4 * i + 2]
  local deep = depth > 0 and ARGV[6 + 2 * i] == deep_queue
  while true do
    local raw
    if deep then
      raw = redis.call('LINDEX', list, -1 - depth)
      if raw then redis.call('LREM', list, -1, raw) end  -- the first equal from the head of the queue: that one
    else
      raw = redis.call('RPOP', list)
    end
    if not raw then break end
    local tag, exchange, routing_key = envelope(raw)  -- or nil and the reason
    if tag then
      if not woken then redis.call('RPOP', bell) end
      redis.call('LTRIM', bell, 0, bell_cap - 1)
      if ARGV[5 + 2 * i] ~= '1' then
        redis.call('ZADD', KEYS[2], now, tag)
        redis.call('HSET', KEYS[1], tag,
          '[' .. raw .. ',' .. cjson.encode(exchange) .. ',' .. cjson.encode(routing_key) .. ']')
      end
      return {dead, i, raw, tag}
    end
    if ARGV[5 + 2 * i] ~= '1' then  -- a no-ack consumer's (replies) is dropped, as kombu's would be
      local reason = exchange
      local header = cjson.encode({reason = reason, queue = ARGV[6 + 2 * i], at = tonumber(now)})
      redis.call('LPUSH', dead_list, header .. '\n' .. raw)
      redis.call('LTRIM', dead_list, 0, cap - 1)
      redis.call('INCR', dead_count)
      dead = dead + 1
    end
    malformed = malformed + 1
    if malformed >= 100 then return {dead} end
  end
end
return {dead}
