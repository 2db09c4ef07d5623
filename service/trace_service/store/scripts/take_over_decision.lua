-- Take over a Stage 2 decision whose claim lapsed (its replica died or stalled).
-- KEYS: meta.  ARGV: now, lease, token.  Returns the round now claimed by the caller, or 0.
local meta_key = KEYS[1]
local now, lease, token = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local held = redis.call('HMGET', meta_key, 'decision_round', 'decision_until', 'status')
local round = tonumber(held[1]) or 0
if round == 0 or FINISHED[held[3]] then return 0 end
if (tonumber(held[2]) or 0) > now then return 0 end
redis.call('HSET', meta_key, 'decision_token', token, 'decision_until', now + lease)
return round
