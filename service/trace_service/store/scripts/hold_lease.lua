-- Take or renew the lease on training a job's predictor, atomically, and only while the job exists
-- (its steps index, KEYS[1], is there).  KEYS: the job's steps index, the lease.  ARGV: owner, lease
-- in milliseconds.  Returns 1 while the owner holds the lease, else 0.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', tonumber(ARGV[2])) then
  return 1
end
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[2]))
  return 1
end
return 0
