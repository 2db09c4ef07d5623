-- Lease up to `max` queued instructions whose previous lease (if any) has run out.
-- KEYS: the job's instruction queue (sorted set: member "tree_id|instruction_id", score = free again at).
-- ARGV: now, lease seconds, max, ttl.  Returns a flat list [member, previous score, ...].
local queue = KEYS[1]
local now, lease, max, ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local due = redis.call('ZRANGEBYSCORE', queue, '-inf', now, 'WITHSCORES', 'LIMIT', 0, max)
for i = 1, #due, 2 do redis.call('ZADD', queue, now + lease, due[i]) end
if #due > 0 then redis.call('EXPIRE', queue, ttl) end
return due
