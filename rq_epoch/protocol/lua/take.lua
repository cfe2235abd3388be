-- take: move the first job of a worker's queues, in its dequeue order, into that
-- queue's intermediate list.
--
-- A worker on several queues would pop with BLPOP (RQ's choice): between the pop and
-- the grant of a lease, the job would be in no list at all, and a worker that died (or
-- a connection that dropped) in between would lose it. This script takes the job in one
-- atomic step into RQ's intermediate list of its queue (<queue key>:intermediate), the
-- list the sweep already rescues: a job there that is still "queued" and has no live
-- lease after one lease length is requeued uncounted (verdict exempt). The grant removes
-- the entry once the lease exists.
--
-- KEYS[1..n]     the queue lists, in the worker's dequeue order (<prefix>:queue:<name>)
-- KEYS[n+1..2n]  their intermediate lists, in the same order (<queue key>:intermediate)
--
-- It reads nothing but the queues it pops, and never blocks: the worker waits for a job
-- elsewhere (see rq_epoch/take.py) and calls this script when one may be there.
--
-- Returns {i, job_id} when the job was taken from KEYS[i]; {0} when every queue was
-- empty.

local rcall = redis.call  -- read from a local, not the global table

local n = #KEYS / 2

for i = 1, n do
  local job_id = rcall('LPOP', KEYS[i])
  if job_id then
    rcall('RPUSH', KEYS[n + i], job_id)
    return {i, job_id}
  end
end
return {0}
