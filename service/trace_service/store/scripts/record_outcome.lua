-- Add one step's bare-rollout group to a prompt's outcome history.
-- KEYS: the job's prompt-outcome hash.  ARGV: prompt_id, successes, trials, ttl.
-- The value is "successes,trials,streak"; streak counts the latest groups in a row with one outcome only.
local key, prompt_id = KEYS[1], ARGV[1]
local successes, trials, ttl = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
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
