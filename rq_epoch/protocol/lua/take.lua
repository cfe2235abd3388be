-- take: move the first job of a worker's queues, in its dequeue order, into that
-- queue's intermediate list; and, for a worker that waits with the watch of its queues,
-- its place among the idle workers, in the same step.
--
-- A worker on several queues would pop with BLPOP (RQ's choice): between the pop and
-- the grant of a lease, the job would be in no list at all, and a worker that died (or
-- a connection that dropped) in between would lose it. This script takes the job in one
-- atomic step into RQ's intermediate list of its queue (<queue key>:intermediate), the
-- list the sweep already rescues: a job there that is still "queued" and has no live
-- lease after one lease length is requeued uncounted (verdict exempt). The grant removes
-- the entry once the lease exists.
--
-- A worker's take and its place among the idle workers of its queues (see _watch.lua)
-- always go together: a worker that finds no job waits next, and claims the watch when
-- nobody holds it; a worker that takes a job leaves the watch to another idle worker.
-- One script does both, so a job's path costs no separate call of the watch script.
-- The job the take moves is read in the same step (its hash, as RQ's fetch reads it), so
-- the worker does not ask for it in a round trip of its own.
--
-- KEYS[1..n]     the queue lists, in the worker's dequeue order (<prefix>:queue:<name>)
-- KEYS[n+1..2n]  their intermediate lists, in the same order (<queue key>:intermediate)
-- KEYS[2n+1]     optional: the watch key of the set of queues (<prefix>:epoch:watch:<set>)
-- KEYS[2n+2]     optional: its baton list                    (<prefix>:epoch:baton:<set>)
-- KEYS[2n+3]     optional: its turns                         (<prefix>:epoch:turns:<set>)
-- ARGV[1]        n, the number of queues
-- ARGV[2]        the prefix of RQ's job keys ("rq:job:"): the hash of the job moved is
--                read and returned; '' to read nothing
-- ARGV[3]        with the watch keys: the caller's token (its worker name)
-- ARGV[4]        with the watch keys: TTL of the watch key and of a baton token, in ms
-- ARGV[5]        with the watch keys: the gap between two waiters' turns, in ms
-- ARGV[6]        with the watch keys: the turn the caller was given last (server ms), or 0
--
-- The job key is not in KEYS: which job moves is known only once it is popped. RQ itself
-- does not run on Redis Cluster, and neither does this script.
--
-- With the watch keys: when a job is moved, the watch is handed on (hand_on_watch: a
-- waiter is woken when the caller held the watch or nobody did); when every queue is
-- empty, the caller claims the watch (claim_watch), and when another worker holds it,
-- the caller is given its turn to take again (next_turn).
--
-- It reads nothing but the queues it pops (and the watch), and never blocks: the worker
-- waits for a job elsewhere (see rq_epoch/worker/take.py) and calls this script when one
-- may be there.
--
-- Returns {i, job_id, woke, job} when the job was taken from KEYS[i] (woke: 1 when a waiter
-- was woken to take the watch over, else 0; job: the job hash as HGETALL gives it, field
-- and value alternating, empty when the hash is gone or ARGV[2] is ''); {0, '', role,
-- turn, wait} when every queue was empty (role: 2 when the caller now holds the watch,
-- else 0; turn and wait: the caller's turn in server ms and the ms until it, 0 for the
-- watcher or without the watch keys).

-- @include _epoch.lua
-- @include _watch.lua

local n = tonumber(ARGV[1])
local watch_key, baton_key, turns_key = KEYS[2 * n + 1], KEYS[2 * n + 2], KEYS[2 * n + 3]
local job_prefix = ARGV[2]
local token, ttl, gap, kept = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])

-- The first job of the first queue that has one, as {queue key, {job_id}}: LMPOP (Redis
-- 7, Valkey) looks at every queue in one command; a server without it (Redis 6.2) is
-- asked one queue at a time.
local lmpop = {'LMPOP', n}
for i = 1, n do lmpop[i + 2] = KEYS[i] end
lmpop[n + 3] = 'LEFT'
local popped = rpcall(unpack(lmpop))
if type(popped) == 'table' and popped.err then
  if not string.find(string.lower(popped.err), 'unknown', 1, true) then return popped end  -- WRONGTYPE...
  popped = false
  for i = 1, n do
    local job_id = rcall('LPOP', KEYS[i])
    if job_id then
      popped = {KEYS[i], {job_id}}
      break
    end
  end
end

if popped then
  local job_id = popped[2][1]
  for i = 1, n do
    if KEYS[i] == popped[1] then
      rcall('RPUSH', KEYS[n + i], job_id)
      local woke = 0
      if watch_key and hand_on_watch(watch_key, baton_key, token, ttl) then woke = 1 end
      local job = {}
      if job_prefix ~= '' then job = rcall('HGETALL', job_prefix .. job_id) end
      return {i, job_id, woke, job}
    end
  end
end
if watch_key then
  -- The watch and the last turn given out, in one read.
  local held = rcall('MGET', watch_key, turns_key)
  if claim_watch(watch_key, held[1], token, ttl, nil) == WATCHER then return {0, '', WATCHER, 0, 0} end
  local turn, wait = next_turn(turns_key, kept, gap, server_ms(), held[2])
  return {0, '', NEITHER, turn, wait}
end
return {0, '', NEITHER, 0, 0}
