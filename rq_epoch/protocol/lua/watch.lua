-- watch: which idle worker watches a set of queues for the others, and which stands by.
--
-- Idle workers on the same queues share one watcher: the only one that keeps the
-- server's client tracking armed on the queues, so that an enqueue wakes it and no other.
-- The others wait with BLPOP on the baton list (a blocking pop wakes exactly one waiter,
-- the one blocked longest). A watcher that took a job leaves: it gives up the watch key
-- and pushes one token onto the baton list, so exactly one waiter wakes and claims the
-- watch.
--
-- A watcher that dies stops refreshing its key, and the key expires. One waiter, the
-- deputy, notices: it blocks for a short time only, and claims again each time its BLPOP
-- times out, so it takes the watch over soon after the key expired. Every other waiter
-- sleeps (a long BLPOP): an idle fleet costs the server what the watcher and the deputy
-- do, however many wait. The watcher keeps the deputy's place filled: when its refresh
-- finds no deputy, it pushes a token, and the waiter that pops it claims the place.
--
-- KEYS[1]  the watch key   (<prefix>:epoch:watch:<set>, a string: the watcher's token)
-- KEYS[2]  the deputy key  (<prefix>:epoch:deputy:<set>, a string: the deputy's token)
-- KEYS[3]  the baton list  (<prefix>:epoch:baton:<set>, at most one token)
-- ARGV[1]  "claim" or "leave"
-- ARGV[2]  the caller's token (its worker name)
-- ARGV[3]  TTL of the watch key and of a token on the baton list, in milliseconds; the
--          deputy key lives twice as long (the deputy refreshes it once per TTL)
-- ARGV[4]  RQ key prefix ("rq"): the watcher's claim also notes that this server is alive
--          as primary (note_alive in _epoch.lua, at most once a second per server), so
--          that an idle fleet keeps the record of life as fresh as a busy one. A server
--          that yields no valid run_id is not noted.
--
-- claim: the caller becomes the watcher when nobody is (a deputy that does gives its
--        place up, and a token is pushed for the next deputy), or stays the watcher, its
--        TTL refreshed; otherwise it becomes or stays the deputy when nobody else is.
-- leave: the caller gives up its place (watch or deputy's), and a token is pushed so
--        that one waiter wakes and claims it.
--
-- Returns 2 when the caller is the watcher (claim: now; leave: it was), 1 when it is (was)
-- the deputy, 0 otherwise.

-- @include _epoch.lua

local WATCHER, DEPUTY, NEITHER = 2, 1, 0

local watch_key, deputy_key, baton_key = KEYS[1], KEYS[2], KEYS[3]
local action, token, ttl, prefix = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]

-- Wake one waiter (the one blocked longest): one token, never more, gone after the TTL.
local function wake_one()
  if rcall('LLEN', baton_key) == 0 then
    rcall('RPUSH', baton_key, token)
  end
  rcall('PEXPIRE', baton_key, ttl)
end

local watcher = rcall('GET', watch_key)
local deputy = rcall('GET', deputy_key)

if action == 'claim' then
  if watcher == token or not watcher then
    rcall('SET', watch_key, token, 'PX', ttl)
    if deputy == token then
      rcall('DEL', deputy_key)
      deputy = false
    end
    if not deputy then wake_one() end
    local run_id, uptime = current_epoch()
    if run_id then note_alive(prefix, run_id, uptime, server_now()) end
    return WATCHER
  end
  if deputy == token or not deputy then
    rcall('SET', deputy_key, token, 'PX', 2 * ttl)
    return DEPUTY
  end
  return NEITHER
end
if action == 'leave' then
  if watcher == token then
    rcall('DEL', watch_key)
    wake_one()
    return WATCHER
  end
  if deputy == token then
    rcall('DEL', deputy_key)
    wake_one()
    return DEPUTY
  end
  return NEITHER
end
return redis.error_reply('watch: unknown action ' .. tostring(action))
