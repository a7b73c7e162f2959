-- outbox_apply: apply messages of another shard's outbox (see `send` in _common.lua) on this
-- shard, their target, in the order given; each changes state once however often it comes
-- (outbox.py removes a message from its outbox only after this returned, so a crash between
-- sends it again):
-- - dep {id, d, s}: dependency d (of shard f) ended s; dependent id settles as with a local
--   dependency (settle_dependent), which changes a dependent only while it awaits d. A
--   dependent not stored yet (its submitter registered the edge with dep_link.lua and is on
--   its way here) finds the outcome in P xdone:<id> when submit.lua stores it.
-- - member {b, id, c, g, bg}: batch member id (created c, of batch generation bg) is now in
--   group g (move_member); the number m of its last applied message, per member, is kept in
--   P bx:<b> (a member's messages come from one shard, numbered in order), so an older or
--   repeated one is skipped.
-- - purged {b, id, g}: member id (in group g) of batch b was purged: it leaves the member
--   index (its P bx:<b> entry stays, so that no older message counts it again).
-- - fire {b, v}: store batch b's callback from its store_task values v, unless its id exists.
-- ARGV[3..] the messages (JSON). Returns how many messages this shard's own outbox holds
-- now (applying may send on: a cancel cascading, a batch finishing), so the deliverer reads
-- it next only then.
--
-- P xdone:<id>: HASH dependency id -> "<m> <status>", expiring after XDONE_TTL seconds.
-- P bx:<batch>: HASH member id -> the number of its last applied message; deleted with the
-- batch (batch_purge.lua).
local XDONE_TTL = 86400
for i = 3, #ARGV do
  local msg = cjson.decode(ARGV[i])
  local m = tonumber(msg.m)
  if msg.k == 'dep' then
    if redis.call('EXISTS', tkey(msg.id)) == 1 then
      if settle_dependent(msg.id, msg.d, msg.s) then
        settle_dependents(msg.id, 'CANCELLED')
      end
    else
      local xkey = P .. 'xdone:' .. msg.id
      local seen = redis.call('HGET', xkey, msg.d)
      if not seen or tonumber(string.match(seen, '^(%d+)')) < m then
        redis.call('HSET', xkey, msg.d, msg.m .. ' ' .. msg.s)
        redis.call('EXPIRE', xkey, XDONE_TTL)
        end
    end
  elseif msg.k == 'member' then
    local applied = P .. 'bx:' .. msg.b
    local last = redis.call('HGET', applied, msg.id)
    if (not last or tonumber(last) < m) and redis.call('EXISTS', batch_key(msg.b)) == 1 then
      redis.call('HSET', applied, msg.id, msg.m)
      move_member(msg.b, msg.id, msg.c, msg.g, false, msg.bg)
    end
  elseif msg.k == 'purged' then
    redis.call('ZREM', members_key(msg.b, msg.g), msg.id)
  elseif msg.k == 'fire' then
    if redis.call('EXISTS', tkey(msg.v[1])) == 0 then
      store_callback(msg.v, msg.b)
    end
  end
end
return redis.call('LLEN', P .. 'outbox')
