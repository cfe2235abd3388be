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
-- KEYS[1]  the confirmation key   (<prefix>:epoch:confirm)
-- ARGV[1]  milliseconds the key lives
--
-- Returns {"<run_id>:<master_replid>", replicas connected now}. Errors with EPOCH_UNAVAILABLE when the server yields
-- no valid run_id (nothing is written then).
--
-- In Python the reply is read by rq_epoch/protocol/durable.py (Confirmation.server).

-- @include _epoch.lua

local run_id, _, err = current_epoch()
if err then return redis.error_reply(err) end
local replication = rcall('INFO', 'replication')
local replid = string.match(info_value(replication, 'master_replid') or '', '^%w*')
local connected = tonumber(string.match(info_value(replication, 'connected_slaves') or '', '^%d+')) or 0
rcall('SET', KEYS[1], '1', 'PX', tonumber(ARGV[1]))
return {run_id .. ':' .. replid, connected}
