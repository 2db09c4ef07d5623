-- Create trees that do not exist yet, each with its expiry, atomically (a repeated create changes
-- nothing).  One call creates one tree on a Redis Cluster and a whole allocation's chunk on one node.
-- KEYS: the trees' meta keys.  ARGV: ttl, then one JSON list holding, per tree in KEYS order, the flat
-- list of its field/value strings (one argument: thousands of small ones cost the client more than
-- the whole allocation's arithmetic).  Returns the number of trees created.
local ttl, trees = tonumber(ARGV[1]), cjson.decode(ARGV[2])
local created = 0
for i, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 0 then
    redis.call('HSET', key, unpack(trees[i]))
    redis.call('EXPIRE', key, ttl)
    created = created + 1
  end
end
return created
