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
-- ARGV[2..n+1]  the queue names
--
-- A last ticket later than now (the primary changed to one whose clock is behind) does
-- not hold the queue back: a ticket is granted.
--
-- Returns {now_ms, g1, ..., gn}: the server time in milliseconds, then 1 for each queue
-- whose ticket the caller was granted (its "at:" field is now now_ms), else 0.

local rcall = redis.call  -- read from a local, not the global table

local tickets_key = KEYS[1]
local min_age = tonumber(ARGV[1])
local time = rcall('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

local reply = {now}
for i = 2, #ARGV do
  local name = ARGV[i]
  local last = tonumber(rcall('HGET', tickets_key, 'at:' .. name))
  if last == nil or now - last >= min_age or last > now then
    rcall('HSET', tickets_key, 'at:' .. name, now)
    rcall('HINCRBY', tickets_key, 'count:' .. name, 1)
    reply[#reply + 1] = 1
  else
    reply[#reply + 1] = 0
  end
end
return reply
