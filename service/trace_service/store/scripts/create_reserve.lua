-- Create an allocation's shared continuation reserve (trace_service.allocation.reserve), once: a retry
-- never resets a reserve that trees have drawn from.
-- KEYS: the reserve hash.  ARGV: left, pending, expected_left, expected_taken, ttl.
-- Returns 1 if created now, 0 if it existed.
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'left', ARGV[1], 'pending', ARGV[2], 'expected_left', ARGV[3],
           'expected_taken', ARGV[4])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[5]))
return 1
