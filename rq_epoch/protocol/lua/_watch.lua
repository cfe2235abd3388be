-- Helpers of the watch of a set of queues, shared by watch.lua and take.lua. The loader
-- pastes this file where a script says `-- @include _watch.lua` (after _epoch.lua).
--
-- Idle workers on the same queues share one watcher: the only one that keeps the server's
-- client tracking armed on the queues, so that an enqueue wakes it and no other. It holds
-- the watch key (a string: its token, with a TTL it refreshes while it waits). Every other
-- idle worker waits with BLPOP on the baton list until its turn, then takes again, which
-- claims the watch if its key expired (the watcher died). (A waiter woken by a token claims
-- the watch the take handed on with a plain SET NX, the same write as claim_watch's when
-- nobody holds the key: rq_epoch/protocol/verbs.py, claim_free_watch.) The turns are given out one
-- gap apart, in server time: one waiter wakes per gap, however many wait, and a watcher
-- that died is replaced within its key's TTL and one gap (two, when the waiter whose turn
-- came first died with it).
--
-- claim_watch(watch_key, watcher, token, ttl, prefix) -> WATCHER or NEITHER
--   `watcher` is the watch key's value as the caller read it (false: nobody holds it).
--   The caller becomes (or stays) the watcher when nobody else is: the key is set to its
--   token for `ttl` milliseconds. With `prefix` (the watcher's refresh, watch.lua), the
--   server is also noted alive as primary (note_alive in _epoch.lua, at most once a second
--   per server; a server that yields no valid run_id is not noted), so that an idle fleet
--   keeps the record of life as fresh as a busy one; the take's claim leaves that to the
--   refresh that follows it within a third of the TTL, and spares a job's path INFO.
-- hand_on_watch(watch_key, baton_key, token, ttl) -> whether a waiter was woken
--   Called when the caller took a job: the watch passes to another idle worker. When the
--   caller held the watch, its key is deleted; when the caller held it or nobody did, one
--   token is pushed on the baton list, so the waiter blocked longest wakes and claims it
--   (SET NX: the key is free).
--   When another worker watches, nothing changes.
-- next_turn(turns_key, kept, gap, now, last) -> turn, wait   (server time in ms; ms to wait)
--   `now` is the server's time in ms (server_ms) and `last` the turns key's value, as the
--   caller read them (each caller reads them with what else it reads).
--   The caller's turn to take again: `kept`, the turn it was given last, while that has
--   not come (a waiter keeps its place in the line through RQ's loop), else the next free
--   one, `gap` ms after the last turn given out (or after now). The turns key expires one
--   gap after the last turn given. A kept turn later than the last one given is not one
--   of this server's line (a failover, a restart): a new one is given.

local WATCHER, NEITHER = 2, 0

-- The server's time (TIME) in whole milliseconds.
local function server_ms()
  local time = rcall('TIME')
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

-- Wake one waiter (the one blocked longest): one token, never more, gone after the TTL.
-- (The token is pushed first: when one was already waiting, the list is cut back to it.)
local function wake_one(baton_key, token, ttl)
  if rcall('RPUSH', baton_key, token) > 1 then
    rcall('LTRIM', baton_key, 0, 0)
  end
  rcall('PEXPIRE', baton_key, ttl)
end

local function claim_watch(watch_key, watcher, token, ttl, prefix)
  if watcher and watcher ~= token then return NEITHER end
  rcall('SET', watch_key, token, 'PX', ttl)
  if prefix then
    local run_id, uptime = current_epoch()
    if run_id then note_alive(prefix, run_id, uptime, server_now()) end
  end
  return WATCHER
end

local function hand_on_watch(watch_key, baton_key, token, ttl)
  local watcher = rcall('GET', watch_key)
  if watcher and watcher ~= token then return false end
  if watcher then rcall('DEL', watch_key) end
  wake_one(baton_key, token, ttl)
  return true
end

local function next_turn(turns_key, kept, gap, now, last)
  last = tonumber(last) or 0
  if kept > now and kept <= last then return kept, kept - now end
  local turn = math.max(now, last) + gap
  rcall('SET', turns_key, turn, 'PX', turn - now + gap)
  return turn, turn - now
end
