-- Give a lease up if its holder is the caller (once it lapsed, another may hold it now).
-- KEYS: the lease.  ARGV: owner.  Returns 1 if it was released.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
