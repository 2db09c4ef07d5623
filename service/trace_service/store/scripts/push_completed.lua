-- Queue a completed tree for predictor training: push it, keep the newest ARGV[2] entries, refresh
-- the expiry.  KEYS: the completed-trees list.  ARGV: tree_id, cap, ttl.
redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('LTRIM', KEYS[1], 0, tonumber(ARGV[2]) - 1)
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
return 1
