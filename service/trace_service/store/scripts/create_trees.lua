-- Create trees that do not exist yet, each with its expiry, atomically (a repeated create changes
-- nothing).  One call creates one tree on a Redis Cluster and a whole allocation's chunk on one node.
-- KEYS: the trees' meta keys.  ARGV: ttl, fields per tree f, then f field/value pairs per tree in KEYS
-- order.  Returns the number of trees created.
local ttl, width = tonumber(ARGV[1]), 2 * tonumber(ARGV[2])
local created = 0
for i, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 0 then
    local first = 3 + (i - 1) * width
    redis.call('HSET', key, unpack(ARGV, first, first + width - 1))
    redis.call('EXPIRE', key, ttl)
    created = created + 1
  end
end
return created
