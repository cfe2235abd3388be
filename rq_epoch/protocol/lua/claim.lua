-- claim: take dead letters whose Python side effects (failure result, on_failure
-- callback, dependents) have not run yet, so that exactly one sweeper runs them.
--
-- The sweep script makes a dead verdict durable at once (job failed, in RQ's
-- FailedJobRegistry) and adds "<queue>|<job_id>" to the finishing set with score 0.
-- A claim sets the score to TIME + claim TTL; a sweeper that dies while finishing
-- leaves a claim that expires, and the next sweep by anyone finishes the job.
--
-- KEYS[1]  finishing sorted set  (<prefix>:epoch:finishing)
-- ARGV[1]  most entries to claim
-- ARGV[2]  claim TTL in seconds
-- ARGV[3]  optional: only claim this one member
--
-- Returns the claimed members.
--
-- In Python the reply is read by rq_epoch/verbs.py (claim: a DeadLetterClaim per member).

-- @include _epoch.lua

local finishing_key = KEYS[1]

local now = server_now()
local until_ = now + tonumber(ARGV[2])
local members
if ARGV[3] and ARGV[3] ~= '' then
  local score = rcall('ZSCORE', finishing_key, ARGV[3])
  if score and tonumber(score) <= now then members = {ARGV[3]} else members = {} end
else
  members = rcall('ZRANGEBYSCORE', finishing_key, '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
end
for _, member in ipairs(members) do
  rcall('ZADD', finishing_key, 'XX', until_, member)
end
return members
