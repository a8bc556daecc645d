-- Move one message from a list to another, rewritten, atomically: remove ARGV[1] from KEYS[1]
-- and append ARGV[2] to KEYS[2]. Nothing happens (0) if a consumer took the message meanwhile.
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then
  redis.call('RPUSH', KEYS[2], ARGV[2])
  return 1
end
return 0
