-- One tree's draw from its allocation's shared continuation reserve, once per tree: a retry (another
-- replica taking the decision over) gets the same draw.  The rule is Reserve.draw
-- (trace_service.allocation.reserve), which the store's tests hold this script to.
-- KEYS: the reserve hash.  ARGV: tree_id, share, mixed chance, agrees (0/1), can branch (0/1), ttl.
-- Returns the continuations drawn; the tree's own share when the reserve is gone (expired).
local key, field = KEYS[1], 'd:' .. ARGV[1]
local share, chance = tonumber(ARGV[2]), tonumber(ARGV[3])
local agrees, can_branch, ttl = ARGV[4] == '1', ARGV[5] == '1', tonumber(ARGV[6])
if redis.call('EXISTS', key) == 0 then return share end
local before = redis.call('HGET', key, field)
if before then return tonumber(before) end
local r = redis.call('HMGET', key, 'left', 'pending', 'expected_left', 'expected_taken')
local left, pending = tonumber(r[1]), tonumber(r[2])
local expected_left, expected_taken = tonumber(r[3]), tonumber(r[4])
share = math.min(share, pending)  -- (never more than is still reserved for the undecided trees)
local surplus = left - pending
pending = pending - share
if pending > 0 then
  expected_left = math.max(expected_left - share * chance, 0)
  expected_taken = math.max(expected_taken - share * (1 - chance), 0)
else
  expected_left, expected_taken = 0, 0
end
local drawn = 0
if agrees and can_branch then
  local weight = share + expected_taken
  local fair = surplus
  if weight > 0 then fair = math.floor((surplus + expected_left) * share / weight) end
  drawn = share + math.min(surplus, fair)
elseif can_branch and pending == 0 then
  drawn = left  -- the last tree to decide: what nobody else could spend
end
redis.call('HSET', key, field, drawn, 'left', left - drawn, 'pending', pending,
           'expected_left', string.format('%.17g', expected_left),
           'expected_taken', string.format('%.17g', expected_taken))
redis.call('EXPIRE', key, ttl)
return drawn
