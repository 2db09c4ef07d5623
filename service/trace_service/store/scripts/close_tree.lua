-- Close a tree early (the trainer's call).  KEYS: meta.  ARGV: now, ttl.
-- Returns the status before the call ('' for an unknown tree); finished trees stay as they are.
local meta_key = KEYS[1]
local status = redis.call('HGET', meta_key, 'status')
if not status then return '' end
if not FINISHED[status] then
  redis.call('HSET', meta_key, 'status', STATUS.CLOSED, 'decision_round', 0, 'decision_token', '',
             'finished_at', tonumber(ARGV[1]))
end
return status
