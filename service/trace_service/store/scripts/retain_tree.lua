-- Retention by need: mark a finished tree as read by its trainer or learned from by its job's
-- predictor (ARGV[1]: 'read' or 'learned'); once it carries both marks, every key of the tree expires
-- within ARGV[2] seconds (a key that expires sooner keeps its expiry).  A tree not finished, still in
-- flight, is left as it is: retention never cuts a tree short.
-- KEYS: meta, then the tree's other keys.  Returns 1 when the tree now expires within the window.
local meta_key = KEYS[1]
local status = redis.call('HGET', meta_key, 'status')
if not status or not FINISHED[status] then return 0 end
if ARGV[1] == 'read' then
  redis.call('HSET', meta_key, 'retain_read', 1)
else
  redis.call('HSET', meta_key, 'retain_learned', 1)
end
local marks = redis.call('HMGET', meta_key, 'retain_read', 'retain_learned')
if marks[1] ~= '1' or marks[2] ~= '1' then return 0 end
local window = tonumber(ARGV[2])
for _, key in ipairs(KEYS) do
  local left = redis.call('TTL', key)
  if left == -1 or left > window then redis.call('EXPIRE', key, window) end
end
return 1
