-- watch: one idle worker per set of queues watches them for the others.
--
-- Idle workers on the same queues share one watcher: the only one that keeps the
-- server's client tracking armed on the queues, so that an enqueue wakes it and no other.
-- The others wait with BLPOP on the baton list (a blocking pop wakes exactly one waiter).
-- A watcher that took a job hands the watch on: it gives up the watch key and pushes one
-- token onto the baton list, so exactly one waiter wakes, claims the watch and arms it.
-- A watcher that dies stops refreshing its key; the key expires, and the first waiter
-- whose BLPOP times out claims it. The watcher refreshes its key a few times per TTL, so
-- its refresh also notes that the server is alive (see ARGV[4]).
--
-- KEYS[1]  the watch key   (<prefix>:epoch:watch:<set>, a string: the watcher's token)
-- KEYS[2]  the baton list  (<prefix>:epoch:baton:<set>, at most one token)
-- ARGV[1]  "claim" or "pass"
-- ARGV[2]  the caller's token (its worker name)
-- ARGV[3]  TTL of the watch key and of the baton, in milliseconds
-- ARGV[4]  optional: RQ key prefix ("rq"); with it, a claim also notes that this server
--          is alive as primary (note_alive in _epoch.lua, at most once a second per
--          server), so that an idle fleet keeps the record of life as fresh as a busy one.
--          A server that yields no valid run_id is not noted.
--
-- claim: the caller becomes the watcher when nobody is (SET NX PX), or stays the
--        watcher and refreshes its TTL when it is already.
-- pass:  when the caller is the watcher, the watch key is deleted and one token is
--        pushed onto the baton list (none when a token already waits there), which
--        expires after the TTL when no waiter pops it.
--
-- Returns 1 when the caller is the watcher (claim: now; pass: it was, and handed on),
-- 0 otherwise.

-- @include _epoch.lua

local watch_key, baton_key = KEYS[1], KEYS[2]
local action, token, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])

local holder = rcall('GET', watch_key)
if action == 'claim' then
  if ARGV[4] then
    local run_id, uptime = current_epoch()
    if run_id then note_alive(ARGV[4], run_id, uptime, server_now()) end
  end
  if holder == token then
    rcall('PEXPIRE', watch_key, ttl)
    return 1
  end
  if holder then
    return 0
  end
  rcall('SET', watch_key, token, 'PX', ttl)
  return 1
end
if action == 'pass' then
  if holder ~= token then
    return 0
  end
  rcall('DEL', watch_key)
  if rcall('LLEN', baton_key) == 0 then
    rcall('RPUSH', baton_key, token)
  end
  rcall('PEXPIRE', baton_key, ttl)
  return 1
end
return redis.error_reply('watch: unknown action ' .. tostring(action))
