-- Run one write command on a key and (re)set the key's expiry in the same step, so that no key is ever
-- left without one (arq's rule: every key expires).
-- KEYS: the key.  ARGV: ttl, the command's name, its arguments after the key.  Returns the command's reply.
local reply = redis.call(ARGV[2], KEYS[1], unpack(ARGV, 3))
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[1]))
return reply
