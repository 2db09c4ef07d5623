-- Record one tree's draw from its allocation's shared continuation reserve, computed by the caller from
-- the state it read (the rule is Reserve.draw, trace_service.allocation.reserve, and only there): the
-- draw stands if the reserve is as the caller read it (its version) and the tree has not drawn yet.
-- KEYS: the reserve hash.  ARGV: tree_id, the version read, drawn, left, pending, expected_left,
-- expected_taken (after the draw), ttl.
-- Returns {status, drawn}: status 1 recorded now, 0 the tree drew before (drawn is that draw), -1 the
-- reserve is gone (expired), -2 another draw came first (read again and retry).
local key, field = KEYS[1], 'd:' .. ARGV[1]
if redis.call('EXISTS', key) == 0 then return {-1, 0} end
local before = redis.call('HGET', key, field)
if before then return {0, tonumber(before)} end
if (tonumber(redis.call('HGET', key, 'version')) or 0) ~= tonumber(ARGV[2]) then return {-2, 0} end
redis.call('HSET', key, field, ARGV[3], 'left', ARGV[4], 'pending', ARGV[5], 'expected_left', ARGV[6],
           'expected_taken', ARGV[7])
redis.call('HINCRBY', key, 'version', 1)
redis.call('EXPIRE', key, tonumber(ARGV[8]))
return {1, tonumber(ARGV[3])}
