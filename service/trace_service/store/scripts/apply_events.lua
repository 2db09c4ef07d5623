-- Apply one tree's batch of finished turns atomically.
-- KEYS: meta, nodes, events, instructions, predictions (all under the tree's hash tag)
-- ARGV: events (JSON list of [event_id, node_id, parent_id, text, features, done, reward, instruction_id,
--       success (1: the reward is a success)]; "" stands for absent), now (seconds), ttl (seconds),
--       decision lease (seconds), a fresh token naming this caller's claim on a Stage 2 decision, the
--       most turns of one rollout
-- Returns {summary, ...}: summary is JSON {results = [[code, message], ...] (codes: RESULT), job,
-- status, decision (round this caller must decide, or 0), token, completed (0/1), started = [instruction
-- ids that became fully started], bare_leaves, cont_leaves (leaves this batch added)}.  What follows it
-- is what the summary announces: with a decision, the tree as that decision must see it (meta, nodes,
-- instructions, predictions as flat field/value lists, which saves the claimant a round trip); with
-- completed = 1, the meta hash (for its accounting); otherwise nothing.
local meta_key, nodes_key, events_key, instr_key, pred_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local events = cjson.decode(ARGV[1])
local now, ttl, lease = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local claim_token, max_depth = ARGV[5], tonumber(ARGV[6])

local results, started = {}, {}
if redis.call('EXISTS', meta_key) == 0 then
  for i = 1, #events do results[i] = {RESULT.UNKNOWN_TREE, 'unknown tree'} end
  return {cjson.encode({results = results, job = '', status = '', decision = 0, token = '', completed = 0,
                        started = started, bare_leaves = 0, cont_leaves = 0})}
end

-- Counters start absent (a new tree stores only its spec): absent reads as 0.
local function num(value) return tonumber(value) or 0 end

-- Only the fields used here (the hash also holds the prompt text, which this script never needs).
local fields = {'job', 'status', 'settles_to', 'rollouts', 'round', 'promised', 'decision_round',
                'decision_until', 'bare_started', 'bare_leaves', 'bare_successes', 'cont_started',
                'cont_leaves', 'successes', 'turns'}
local m = {}
local raw = redis.call('HMGET', meta_key, unpack(fields))
for i, name in ipairs(fields) do m[name] = raw[i] or nil end
local status = m.status
local rollouts = num(m.rollouts)
local counters = {
  bare_started = num(m.bare_started), bare_leaves = num(m.bare_leaves),
  bare_successes = num(m.bare_successes), cont_started = num(m.cont_started),
  cont_leaves = num(m.cont_leaves), successes = num(m.successes), turns = num(m.turns),
}
local node_cache, instr_cache = {}, {}

-- A JSON record of a hash, read once per call (false: absent); later changes go through the cache.
local function cached(key, cache, id)
  if cache[id] == nil then
    local v = redis.call('HGET', key, id)
    cache[id] = v and cjson.decode(v) or false
  end
  return cache[id]
end
local function load_node(id) return cached(nodes_key, node_cache, id) end
local function load_instruction(id) return cached(instr_key, instr_cache, id) end

for i = 1, #events do
  local e = events[i]
  local event_id, node_id, parent_id = e[1], e[2], e[3]
  local text, features, done, reward, instruction_id, success = e[4], e[5], e[6] == 1, e[7], e[8], e[9] == 1
  local signature = parent_id .. '\31' .. tostring(done) .. '\31' .. reward .. '\31' .. instruction_id
  local existing = load_node(node_id)
  if redis.call('SISMEMBER', events_key, event_id) == 1 then
    results[i] = {RESULT.DUPLICATE, 'duplicate event'}
  elseif existing then
    if existing.signature == signature and existing.text == text and existing.features == features then
      redis.call('SADD', events_key, event_id)
      results[i] = {RESULT.DUPLICATE, 'node ' .. node_id .. ' was already reported'}
    else
      results[i] = {RESULT.CONFLICT, 'node_id ' .. node_id .. ' was already reported with different content'}
    end
  elseif FINISHED[status] then
    results[i] = {RESULT.TREE_FINISHED, 'tree is ' .. status .. ' and takes no more turns'}
  else
    local parent, instruction, origin, depth = false, false, '', 1
    local code, message = RESULT.ACCEPTED, ''
    if parent_id == '' then
      if instruction_id ~= '' then
        code, message = RESULT.INVALID, 'a continuation starts from its instruction node, not from the prompt'
      elseif counters.bare_started >= rollouts then
        code, message = RESULT.CONFLICT, 'all ' .. rollouts .. ' bare rollouts of this tree have already started'
      end
    else
      parent = load_node(parent_id)
      if not parent then
        code, message = RESULT.CONFLICT, 'unknown parent ' .. parent_id .. ' (report a parent before its child)'
      elseif parent.done then
        code, message = RESULT.INVALID, 'parent ' .. parent_id .. ' ended its rollout and cannot have children'
      elseif parent.depth + 1 >= max_depth and not done then
        -- Refused, not cut: the worker can still end the rollout here, so its tree can finish.
        code, message = RESULT.INVALID, 'a rollout has at most ' .. max_depth .. ' turns: turn ' .. max_depth ..
                             ' must end it (done=true with its reward)'
      elseif instruction_id ~= '' then
        instruction = load_instruction(instruction_id)
        if not instruction then
          code, message = RESULT.INVALID, 'unknown instruction ' .. instruction_id
        elseif instruction.node ~= parent_id then
          code, message = RESULT.INVALID, 'instruction ' .. instruction_id .. ' starts from node ' .. instruction.node
        elseif instruction.started >= instruction.count then
          code, message = RESULT.CONFLICT, 'all ' .. instruction.count .. ' continuations of instruction ' .. instruction_id .. ' have already started'
        end
      elseif parent.children > 0 then
        code, message = RESULT.CONFLICT, 'node ' .. parent_id .. ' already has a next turn; branching needs an instruction'
      end
    end
    if code == RESULT.ACCEPTED then
      if parent then
        depth = parent.depth + 1
        if instruction then
          origin = instruction_id
          instruction.started = instruction.started + 1
          counters.cont_started = counters.cont_started + 1
          if instruction.started == instruction.count then started[#started + 1] = instruction_id end
          redis.call('HSET', instr_key, instruction_id, cjson.encode(instruction))
        else
          origin = parent.origin
          parent.children = parent.children + 1
          redis.call('HSET', nodes_key, parent_id, cjson.encode(parent))
        end
      else
        counters.bare_started = counters.bare_started + 1
      end
      local node = {parent = parent_id, depth = depth, origin = origin, done = done, children = 0,
                    signature = signature, text = text, features = features, instruction = instruction_id,
                    reward = reward, reported_at = now}
      if done then
        if success then counters.successes = counters.successes + 1 end
        if origin == '' then
          counters.bare_leaves = counters.bare_leaves + 1
          if success then counters.bare_successes = counters.bare_successes + 1 end
        else
          counters.cont_leaves = counters.cont_leaves + 1
        end
      end
      counters.turns = counters.turns + 1
      node_cache[node_id] = node
      redis.call('HSET', nodes_key, node_id, cjson.encode(node))
      redis.call('SADD', events_key, event_id)
      results[i] = {RESULT.ACCEPTED, ''}
    else
      results[i] = {code, message}
    end
  end
end

-- Life cycle: once settled, the tree becomes what its books last said (trace_service.allocation.books);
-- one caller claims each Stage 2 decision under a lease (another takes it over if the lease lapses).
local decision, token, completed = 0, '', 0
local pending = num(m.decision_round)
local settled = counters.bare_leaves == rollouts and counters.cont_leaves == num(m.promised)
if not FINISHED[status] and settled and not (pending > 0 and num(m.decision_until) > now) then
  -- (a live claim means another caller is deciding this round right now)
  status = m.settles_to
  if status == STATUS.EXPANDING then
    decision = pending > 0 and pending or num(m.round) + 1
    token = claim_token
    redis.call('HSET', meta_key, 'decision_round', decision, 'decision_token', token,
               'decision_until', now + lease, 'status', status)
  else
    completed = 1
    redis.call('HSET', meta_key, 'status', status, 'finished_at', now)
  end
end
redis.call('HSET', meta_key,
  'bare_started', counters.bare_started, 'bare_leaves', counters.bare_leaves,
  'bare_successes', counters.bare_successes, 'cont_started', counters.cont_started,
  'cont_leaves', counters.cont_leaves, 'successes', counters.successes, 'turns', counters.turns,
  'updated_at', now)
for _, key in ipairs(KEYS) do redis.call('EXPIRE', key, ttl) end
local summary = cjson.encode({results = results, job = m.job, status = status, decision = decision,
                              token = token, completed = completed, started = started,
                              bare_leaves = counters.bare_leaves - num(m.bare_leaves),
                              cont_leaves = counters.cont_leaves - num(m.cont_leaves)})
if decision > 0 then
  return {summary, redis.call('HGETALL', meta_key), redis.call('HGETALL', nodes_key),
          redis.call('HGETALL', instr_key), redis.call('HGETALL', pred_key)}
end
if completed == 1 then return {summary, redis.call('HGETALL', meta_key)} end
return {summary}
