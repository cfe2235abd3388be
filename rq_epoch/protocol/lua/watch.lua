-- watch: which idle worker watches a set of queues for the others.
--
-- Idle workers on the same queues share one watcher (see _watch.lua): the only one that
-- keeps the server's client tracking armed on the queues, so that an enqueue wakes it
-- and no other. The others wait with BLPOP on the baton list (a blocking pop wakes
-- exactly one waiter, the one blocked longest). The take script claims the caller's place
-- when it finds no job, and hands the watch on when it moves one; this script is the
-- watcher's refresh while it waits, and the leave of a worker that stops.
--
-- KEYS[1]  the watch key   (<prefix>:epoch:watch:<set>, a string: the watcher's token)
-- KEYS[2]  the baton list  (<prefix>:epoch:baton:<set>, at most one token)
-- ARGV[1]  "claim" or "leave"
-- ARGV[2]  the caller's token (its worker name)
-- ARGV[3]  TTL of the watch key and of a token on the baton list, in milliseconds
-- ARGV[4]  RQ key prefix ("rq"): the watcher's claim also notes that this server is alive
--          as primary (note_alive in _epoch.lua, at most once a second per server)
--
-- claim: the caller becomes the watcher when nobody is, or stays the watcher, its TTL
--        refreshed.
-- leave: the caller gives up the watch, if it holds it, and a token is pushed so that
--        one waiter wakes and claims it.
--
-- Returns 2 when the caller is the watcher (claim: now; leave: it was), 0 otherwise.

-- @include _epoch.lua
-- @include _watch.lua

local watch_key, baton_key = KEYS[1], KEYS[2]
local action, token, ttl, prefix = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]

if action == 'claim' then
  return claim_watch(watch_key, rcall('GET', watch_key), token, ttl, prefix)
end
if action == 'leave' then
  if rcall('GET', watch_key) ~= token then return NEITHER end
  hand_on_watch(watch_key, baton_key, token, ttl)
  return WATCHER
end
return redis.error_reply('watch: unknown action ' .. tostring(action))
