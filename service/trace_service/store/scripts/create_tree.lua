-- Create a tree if it does not exist yet, with its expiry, atomically (a repeated create changes nothing).
-- KEYS: meta.  ARGV: ttl, then field, value pairs.  Returns 1 if created, 0 if the tree already existed.
local meta_key = KEYS[1]
if redis.call('EXISTS', meta_key) == 1 then return 0 end
redis.call('HSET', meta_key, unpack(ARGV, 2))
redis.call('EXPIRE', meta_key, tonumber(ARGV[1]))
return 1
