-- Write a key of a job's predictor only while the job exists (its steps index, KEYS[1], is there), with
-- the key's expiry in the same step: a job deleted meanwhile is never written back.
-- KEYS: the job's steps index, the key.  ARGV: ttl, the command's name, its arguments after the key.
-- Returns 0 when the job is gone, else 1.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call(ARGV[2], KEYS[2], unpack(ARGV, 3))
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[1]))
return 1
