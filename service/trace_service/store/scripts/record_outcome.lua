-- Count one finished tree, once: its bare-rollout group joins its prompt's outcome history, its figures
-- its step's totals, and its group record the job's list of recent groups of its arm.
-- KEYS: the job's prompt-outcome hash, the job's set of trees already counted, the job's step totals,
-- the job's list of recent groups of the tree's arm (control or policy).
-- ARGV: prompt_id, successes, trials, ttl, tree_id, step, the group record, the most group records
-- kept, then figure name and value pairs.
-- Returns 1 if counted now, 0 if counted before.
-- The value is "successes,trials,streak"; streak counts the latest groups in a row with one outcome only.
local key, counted_key, totals_key, groups_key, prompt_id = KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1]
local successes, trials, ttl = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local group, kept = ARGV[7], tonumber(ARGV[8])
if redis.call('SADD', counted_key, ARGV[5]) == 0 then return 0 end
redis.call('EXPIRE', counted_key, ttl)
for i = 9, #ARGV, 2 do redis.call('HINCRBY', totals_key, ARGV[6] .. ':' .. ARGV[i], ARGV[i + 1]) end
redis.call('EXPIRE', totals_key, ttl)
redis.call('LPUSH', groups_key, group)
redis.call('LTRIM', groups_key, 0, kept - 1)
redis.call('EXPIRE', groups_key, ttl)
local s, n, streak = 0, 0, 0
local before = redis.call('HGET', key, prompt_id)
if before then
  local parts = {}
  for part in string.gmatch(before, '[^,]+') do parts[#parts + 1] = tonumber(part) end
  s, n, streak = parts[1], parts[2], parts[3]
end
if trials > 0 then
  if successes == 0 or successes == trials then streak = streak + 1 else streak = 0 end
end
redis.call('HSET', key, prompt_id, (s + successes) .. ',' .. (n + trials) .. ',' .. streak)
redis.call('EXPIRE', key, ttl)
return 1
