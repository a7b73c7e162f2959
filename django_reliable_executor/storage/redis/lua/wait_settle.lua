-- wait_settle: tasks of other shards that a durable wait_for of task ARGV[3] awaits ended
-- between their link (dep_link.lua) and its suspend (suspend.lua): their message found it
-- still RUNNING. Settled now as their message would have (see settle_dependent).
-- ARGV[4..] the ended tasks' ids. Returns nothing.
for i = 4, #ARGV do
  settle_dependent(ARGV[3], ARGV[i], 'COMPLETED')
end
