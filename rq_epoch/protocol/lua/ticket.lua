-- ticket: grant a worker the sweeps of its queues that nobody did lately.
--
-- Every worker sweeps its queues every sweep interval; with many workers on one queue
-- that is one sweep of the queue per worker per interval, all but one of which find
-- nothing new. A worker asks for tickets first, in one call for all its queues, and
-- sweeps only the queues it was granted: the fleet sweeps each queue about once per
-- interval, whatever the number of workers. Time is the server's (TIME), so the
-- workers' clocks are never compared. The cron sweep (`rq-epoch sweep`) takes no ticket:
-- it judges whenever it is asked.
--
-- KEYS[1]  the tickets hash (<prefix>:epoch:tickets): field "at:<queue>" the server time
--          in milliseconds of the queue's last ticket, "count:<queue>" how many tickets
--          the queue was granted
-- ARGV[1]  minimum age in milliseconds of a queue's last ticket for a new one
-- ARGV[2]  RQ key prefix ("rq"): the script also notes that this server is alive as primary
--          (note_alive in _epoch.lua, at most once a second per server), so an idle fleet
--          keeps the record of life fresh, which lets a death whose lease ran out before a
--          restart be counted after it. A server that yields no valid run_id is not noted
--          (the sweep itself reports that).
-- ARGV[3..n+2]  the queue names
--
-- A last ticket later than now (the primary changed to one whose clock is behind) does
-- not hold the queue back: a ticket is granted.
--
-- KEYS[2]  optional: the sweep turns of the caller's set of queues
--          (<prefix>:epoch:sweepturns:<set>): when it was granted nothing, it asks again at
--          its turn (next_turn in _watch.lua), one gap (a sweep interval) after the last turn
--          given, so that one worker of the set asks per gap however many there are (a worker
--          alone on one queue waits in RQ's BLMOVE until then), and the sweeper of a queue
--          that died is replaced within about an interval and a gap
-- with KEYS[2]: ARGV[n+3] the gap between two turns in ms, ARGV[n+4] the caller's last turn
--          (server ms) or 0
--
-- Returns {now_ms, g1, ..., gn}: the server time in milliseconds, then 1 for each queue
-- whose ticket the caller was granted (its "at:" field is now now_ms), else 0; with KEYS[2],
-- then {turn, wait}: the caller's turn (server ms) and the ms until it, both 0 when it was
-- granted a ticket.

-- @include _epoch.lua
-- @include _watch.lua

local tickets_key, turns_key = KEYS[1], KEYS[2]
local min_age = tonumber(ARGV[1])
local prefix = ARGV[2]
local last_name = #ARGV
local gap, kept
if turns_key then
  last_name = #ARGV - 2
  gap, kept = tonumber(ARGV[#ARGV - 1]), tonumber(ARGV[#ARGV])
end
local now = server_ms()

local run_id, uptime = current_epoch()
if run_id then note_alive(prefix, run_id, uptime, now / 1000) end

-- The last ticket of every queue in one read.
local fields = {}
for i = 3, last_name do fields[#fields + 1] = 'at:' .. ARGV[i] end
local lasts = rcall('HMGET', tickets_key, unpack(fields))

local reply = {now}
local granted = false
for i = 3, last_name do
  local name = ARGV[i]
  local last = tonumber(lasts[i - 2])
  if last == nil or now - last >= min_age or last > now then
    rcall('HSET', tickets_key, 'at:' .. name, now)
    rcall('HINCRBY', tickets_key, 'count:' .. name, 1)
    reply[#reply + 1] = 1
    granted = true
  else
    reply[#reply + 1] = 0
  end
end
if turns_key then
  local turn, wait = 0, 0
  if not granted then turn, wait = next_turn(turns_key, kept, gap, now, rcall('GET', turns_key)) end
  reply[#reply + 1] = turn
  reply[#reply + 1] = wait
end
return reply
