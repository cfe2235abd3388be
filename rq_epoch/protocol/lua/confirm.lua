-- confirm: write the confirmation key, and name the server process and its term as primary.
--
-- A durable worker or producer (RQ_EPOCH_DURABLE_REPLICAS) sends this script, then WAIT
-- (and WAITAOF), in one round trip on one connection. WAIT confirms the writes made on the
-- connection that sends it, up to its last one: this script's write, which the replication
-- stream carries after every write the server applied before it (see
-- rq_epoch/protocol/durable.py).
--
-- The reply names the server that will confirm: its run_id (a new process at every start)
-- and its master_replid (new at every promotion). A confirmation that names another server
-- than the write it should cover confirms nothing about that write: the connection reached
-- another primary in between (a failover; redis-py's Sentinel pool reconnects by itself).
--
-- It also says whether a primary without replicas may be taken for one that has none at all:
-- not when it was promoted (it was a replica: its old primary is on its way back as its
-- replica, or another failover is near) less than ARGV[2] seconds ago, by the record of when
-- each process began serving as primary (primary_epoch in _epoch.lua, which this call keeps
-- as the sweep does).
--
-- KEYS[1]  the confirmation key            (<prefix>:epoch:confirm)
-- KEYS[2]  primary epochs, first seen       (<prefix>:epoch:primaries)
-- ARGV[1]  milliseconds the key lives
-- ARGV[2]  seconds after a promotion during which a primary without replicas is not settled
--
-- Returns {"<run_id>:<master_replid>", replicas connected now, settled (1 or 0)}. Errors with EPOCH_UNAVAILABLE when the server yields
-- no valid run_id (nothing is written then).
--
-- In Python the reply is read by rq_epoch/protocol/durable.py (Confirmation.server).

-- @include _epoch.lua

local run_id, uptime, err = current_epoch()
if err then return redis.error_reply(err) end
rcall('SET', KEYS[1], '1', 'PX', tonumber(ARGV[1]))
local replication = rcall('INFO', 'replication')
local replid = string.match(info_value(replication, 'master_replid') or '', '^%w*')
local connected = tonumber(string.match(info_value(replication, 'connected_slaves') or '', '^%d+')) or 0
local settled = 1
local promoted = (tonumber(string.match(info_value(replication, 'second_repl_offset') or '', '^-?%d+')) or -1) >= 0
if promoted and connected == 0 then
  local state = primary_epoch(run_id, uptime, server_now(), KEYS[2], true)
  if state.age < tonumber(ARGV[2]) then settled = 0 end
end
return {run_id .. ':' .. replid, connected, settled}
