-- batch_join: on the batch's shard (BATCH_HOME), count members just stored on another shard
-- (submit.lua there stored them with bt but counted them nowhere) in the batch's total and
-- member index, before the batch is sealed; a member whose ending arrived first (a message)
-- is counted already and left alone. See _batches.lua.
-- ARGV[3] batch id, ARGV[4..] pairs: member id, its created time. Returns nothing.
for i = 4, #ARGV, 2 do
  move_member(ARGV[3], ARGV[i], ARGV[i + 1], 'LIVE', true)
end
return 1
