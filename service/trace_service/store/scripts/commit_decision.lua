-- Record a Stage 2 decision, if the caller still holds the claim on it (a lapsed claim may have been
-- taken over by another replica, whose decision then wins: the budget is never promised twice).  The
-- books are computed by the caller (trace_service.allocation.books); this script checks the claim and
-- writes them.
-- KEYS: meta, instructions, predictions
-- ARGV: round, token, instructions (JSON list of [instruction_id, node_id, count]),
--       predictions (JSON object node_id -> Ṽ at decision time), returned units, fallback units, now, ttl,
--       the tree's continuation budget from now on (its draw from a shared reserve; -1: unchanged),
--       the tree's status now, what it becomes once settled
-- Returns JSON {ok = 0/1 (the claim held and the decision is recorded), completed = 0/1}
local meta_key, instr_key, pred_key = KEYS[1], KEYS[2], KEYS[3]
local round, token = tonumber(ARGV[1]), ARGV[2]
local instructions, predictions = cjson.decode(ARGV[3]), cjson.decode(ARGV[4])
local returned, fallback, now, ttl = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local budget, status, settles = tonumber(ARGV[9]), ARGV[10], ARGV[11]

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
redis.call('HINCRBY', meta_key, 'promised', promised)
redis.call('HINCRBY', meta_key, 'returned', returned)
redis.call('HINCRBY', meta_key, 'fallback', fallback)
redis.call('HSET', meta_key, 'round', round, 'decision_round', 0, 'decision_token', '', 'settles_to', settles,
           'updated_at', now)
local completed = 0
if FINISHED[status] then
  completed = 1
  redis.call('HSET', meta_key, 'status', status, 'finished_at', now)
end
for _, key in ipairs(KEYS) do redis.call('EXPIRE', key, ttl) end
return cjson.encode({ok = 1, completed = completed})
