-- batch_open: store a new, open batch (no member yet, not sealed); see _batches.lua.
-- ARGV[3] batch id, ARGV[4] its callbacks as JSON (for reading), ARGV[5] on_complete's
-- TASK_ARGS values as a JSON array ('' = none), ARGV[6] on_success's likewise, ARGV[7] the
-- batch's generation (its members carry it, see _batches.lua); sharded, ARGV[8] and ARGV[9]
-- the shard of each callback's queue ('' = this one), kept as och/osh.
-- Returns 1 (opened) or 0 (the id is taken).
--
-- P batches: ZSET of every batch id, scored by creation (listing).
local bkey = batch_key(ARGV[3])
if redis.call('EXISTS', bkey) == 1 then
  return 0
end
redis.call('HSET', bkey, 'c', NOW, 'n', 0, 'ok', 0, 'ko', 0, 'cx', 0, 'sl', '0', 'cb', ARGV[4],
  'g', ARGV[7])
if ARGV[5] ~= '' then
  redis.call('HSET', bkey, 'oc', ARGV[5])
end
if ARGV[6] ~= '' then
  redis.call('HSET', bkey, 'os', ARGV[6])
end
if ARGV[8] and ARGV[8] ~= '' then
  redis.call('HSET', bkey, 'och', ARGV[8])
end
if ARGV[9] and ARGV[9] ~= '' then
  redis.call('HSET', bkey, 'osh', ARGV[9])
end
redis.call('ZADD', P .. 'batches', NOW, ARGV[3])
return 1
