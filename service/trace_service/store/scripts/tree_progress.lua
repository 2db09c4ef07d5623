-- Where each tree stands, for the sweeper: status, decision round and claim deadline of every meta key
-- in KEYS, flattened in KEYS order ('' for an absent field or tree).  Single Redis node only: the keys
-- belong to different trees, hence to different slots of a Cluster.
local progress = {}
for _, key in ipairs(KEYS) do
  local fields = redis.call('HMGET', key, 'status', 'decision_round', 'decision_until')
  for i = 1, 3 do progress[#progress + 1] = fields[i] or '' end
end
return progress
