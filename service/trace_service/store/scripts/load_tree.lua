-- A whole tree in one call: its meta, nodes, instructions and predictions hashes, each as a flat
-- field/value list (empty lists when the tree does not exist).
-- KEYS: meta, nodes, instructions, predictions (all under the tree's hash tag).
return {redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[2]), redis.call('HGETALL', KEYS[3]),
        redis.call('HGETALL', KEYS[4])}
