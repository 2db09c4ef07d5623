-- Record a Stage 2 decision, if the caller still holds the claim on it (a lapsed claim may have been
-- taken over by another replica, whose decision then wins: the budget is never promised twice).
-- KEYS: meta, instructions, predictions
-- ARGV: round, token, instructions (JSON list of [instruction_id, node_id, count]),
--       predictions (JSON object node_id -> Ṽ at decision time), returned units, fallback units, now, ttl,
--       the tree's continuation budget from now on (its draw from a shared reserve; -1: unchanged)
-- Returns JSON {ok = 0/1 (the claim held and the decision is recorded), completed = 0/1}
local meta_key, instr_key, pred_key = KEYS[1], KEYS[2], KEYS[3]
local round, token = tonumber(ARGV[1]), ARGV[2]
local instructions, predictions = cjson.decode(ARGV[3]), cjson.decode(ARGV[4])
local returned, fallback, now, ttl = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local budget = tonumber(ARGV[9])

local held = redis.call('HMGET', meta_key, 'decision_round', 'decision_token')
if (tonumber(held[1]) or 0) ~= round or held[2] ~= token then
  return cjson.encode({ok = 0, completed = 0})
end
if budget >= 0 then redis.call('HSET', meta_key, 'expansion_budget', budget) end
local promised = 0
for _, item in ipairs(instructions) do
  promised = promised + item[3]
  redis.call('HSET', instr_key, item[1],
             cjson.encode({node = item[2], count = item[3], started = 0, round = round, at = now}))
end
for node_id, value in pairs(predictions) do redis.call('HSET', pred_key, node_id, value) end
local total_promised = redis.call('HINCRBY', meta_key, 'promised', promised)
local total_returned = redis.call('HINCRBY', meta_key, 'returned', returned)
local left = budget_left(tonumber(redis.call('HGET', meta_key, 'expansion_budget')) or 0, total_promised, total_returned)
redis.call('HSET', meta_key, 'left', left)
redis.call('HINCRBY', meta_key, 'fallback', fallback)
redis.call('HSET', meta_key, 'round', round, 'decision_round', 0, 'decision_token', '', 'updated_at', now)
local completed = 0
if promised == 0 then
  -- Nothing to branch (no candidates, or the budget was returned): nothing is outstanding, so the tree
  -- is settled, and the life cycle decides what it becomes.
  local m = redis.call('HMGET', meta_key, 'rounds', 'bare_leaves')
  local status = settled_status(round, tonumber(m[1]) or 0, left, tonumber(m[2]) or 0, false)
  if is_finished(status) then
    completed = 1
    redis.call('HSET', meta_key, 'status', status, 'finished_at', now)
  end
end
for _, key in ipairs(KEYS) do redis.call('EXPIRE', key, ttl) end
return cjson.encode({ok = 1, completed = completed})
