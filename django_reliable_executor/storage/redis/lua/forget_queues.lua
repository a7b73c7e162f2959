-- forget_queues: drop these queues from the indexes if they hold no task in any status (the
-- master's sweep of names left behind, e.g. by a version that never forgot a queue).
-- ARGV[3..] queue names. Returns how many were forgotten.
local forgotten = 0
for i = 3, #ARGV do
  if forget_if_empty(ARGV[i]) then
    forgotten = forgotten + 1
  end
end
return forgotten
