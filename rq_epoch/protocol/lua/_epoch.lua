-- Helpers shared by every rq-epoch script. The loader pastes this file where a
-- script says `-- @include _epoch.lua`.
--
-- current_epoch() -> run_id, uptime_in_seconds   (or nil, nil, error text)
--   Reads the run_id of the server process running this script, from INFO server,
--   and checks its shape: exactly 40 characters of 0-9a-f. Never cached anywhere.
-- run_id_of(info) -> run_id   (or nil, the text that stood in its place)
--   The run_id line of INFO server text, when it has that shape.
-- server_now() -> seconds since the Unix epoch, from the server clock (TIME).
--
-- rcall / rpcall are redis.call / redis.pcall, kept in locals as every script here calls
-- them (a local is read without looking up the global table).
--
-- INFO text is searched with plain finds of whole line starts: a pattern search tries a
-- match at every position of the text, which made the parsing cost more than the INFO.

local rcall, rpcall = redis.call, redis.pcall

local function run_id_of(info)
  local at = string.find(info, '\nrun_id:', 1, true)
  if not at then return nil, nil end
  local run_id = string.match(info, '^[^\r\n]*', at + 8)
  if string.len(run_id) ~= 40 or string.find(run_id, '[^0-9a-f]') then return nil, run_id end
  return run_id
end

local function current_epoch()
  local ok, info = pcall(rcall, 'INFO', 'server')
  if not ok then
    local reason = info
    if type(info) == 'table' then reason = info.err end
    return nil, nil, 'EPOCH_UNAVAILABLE INFO server was refused (the server user needs the ACL rule +info): '
      .. tostring(reason)
  end
  local run_id, found = run_id_of(info)
  if run_id == nil then
    return nil, nil, 'EPOCH_UNAVAILABLE INFO server has no valid run_id: ' .. tostring(found)
  end
  local uptime = 0
  local at = string.find(info, '\nuptime_in_seconds:', 1, true)
  if at then uptime = tonumber(string.match(info, '^%d+', at + 19)) or 0 end
  return run_id, uptime, nil
end

local function server_now()
  local t = rcall('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

-- primary_epoch(run_id, uptime, now, key, write) -> state
--   How long this server process has been serving the dataset as primary, and whether
--   it can show that a replica has what it writes. Reads INFO replication.
--
--   The moment a process began serving as primary is recorded in the hash `key`
--   (<prefix>:epoch:primaries), field "<run_id>:<master_replid>" (the replication id
--   changes at every promotion, so a process that was demoted and promoted again gets a
--   new entry), value "<first seen as primary, server TIME> <most replicas seen online>".
--   The first script that sees the pair as primary writes it (when `write` is true), so
--   every sweeper agrees on it without a client clock, and it can only be later than the
--   real promotion: in doubt, a longer grace. At most 8 entries are kept.
--
--   state.role      'master', 'slave', ... (INFO replication role)
--   state.replid    master_replid, the replication id of this term (for a primary only)
--   state.age       seconds this process has been primary: min(uptime, now - first seen);
--                   0 when this call is the first to see it (or a dry run cannot record it)
--   state.first     server time first seen as primary (0 when not recorded)
--   state.online    replicas connected now, in state online, with lag <= 10 s
--   state.expected  most replicas seen online while this process has been primary
--   state.isolated  true when replicas were seen in this epoch and none is online now: a
--                   demoted or cut-off primary, whose writes no replica will keep
--   state.returning true when this process was primary before, under another replication
--                   id (demoted, then promoted again): a lease stamped with its run_id may
--                   date from that earlier term, so during the grace it waits like one
--                   stamped by another process

-- The value of the INFO line "<name>:<value>" (a plain find of the line start), or nil.
local function info_value(info, name)
  local at = string.find(info, '\n' .. name .. ':', 1, true)
  if not at then return nil end
  return string.match(info, '^[^\r\n]*', at + #name + 2)
end

-- Replicas connected now, in state online, with lag <= 10 s: the "slave<n>:" lines.
local function replicas_online(info)
  local online, at = 0, 1
  for _ = 1, 1000 do
    at = string.find(info, '\nslave', at, true)
    if not at then break end
    at = at + 6
    local line = string.match(info, '^%d+:([^\r\n]*)', at)
    if line and string.find(line, 'state=online', 1, true) then
      local lag_at = string.find(line, 'lag=', 1, true)
      local lag = lag_at and tonumber(string.match(line, '^%d+', lag_at + 4)) or 0
      if lag <= 10 then online = online + 1 end
    end
  end
  return online
end

local function primary_epoch(run_id, uptime, now, key, write)
  local info = rcall('INFO', 'replication')
  local state = {role = string.match(info_value(info, 'role') or '', '^%w*'), age = 0, first = 0, online = 0,
                 expected = 0, isolated = false, returning = false}
  if state.role ~= 'master' then return state end
  local online = replicas_online(info)
  state.replid = string.match(info_value(info, 'master_replid') or '', '^%w*')
  local field = run_id .. ':' .. state.replid
  -- The whole hash at once (at most 8 entries): this epoch's entry, and the others' names.
  local entries = rcall('HGETALL', key)
  local entry = nil
  for i = 1, #entries, 2 do
    if entries[i] == field then entry = entries[i + 1] end
  end
  local first, expected, forgotten = nil, 0, nil
  if entry then
    first, expected = string.match(entry, '^(%S+) (%d+)$')
    first, expected = tonumber(first), tonumber(expected) or 0
  end
  if write and (first == nil or online > expected) then
    if online > expected then expected = online end
    local new = first == nil
    if new then first = now end
    rcall('HSET', key, field, string.format('%.6f %d', first, expected))
    if new and #entries / 2 + (entry and 0 or 1) > 8 then
      -- Forget the oldest epochs; only the current one is ever read.
      local oldest, oldest_at = nil, nil
      for i = 1, #entries, 2 do
        local at = tonumber(string.match(entries[i + 1], '^(%S+)')) or 0
        if entries[i] ~= field and (oldest_at == nil or at < oldest_at) then oldest, oldest_at = entries[i], at end
      end
      if oldest then
        rcall('HDEL', key, oldest)
        forgotten = oldest
      end
    end
  end
  state.online, state.expected = online, expected
  state.isolated = expected > 0 and online == 0
  local own = run_id .. ':'
  for i = 1, #entries, 2 do
    local other = entries[i]
    if other ~= field and other ~= forgotten and string.sub(other, 1, #own) == own then state.returning = true end
  end
  if first then
    state.first = first
    local age = now - first
    if age > uptime then age = uptime end
    if age < 0 then age = 0 end
    state.age = age
  end
  return state
end

-- note_alive(prefix, run_id, uptime, now, primary)
--   Records that this server process is alive and serving as primary, at `now` (its own
--   TIME): the hash <prefix>:epoch:alive, field run_id, value
--   "<last seen> <master_replid> <first seen in that term>". The sweep reads it to count a
--   lease stamped by this process that another process judges after a restart or failover
--   (seen_alive below). Written at most once per ALIVE_EVERY seconds per server: the stored
--   time is compared first (one HGET), and only when it is due are INFO replication and
--   the primaries record read. Nothing is written by a server that is not a primary, or a
--   primary that is cut off from the replicas it had in its epoch (primary.isolated: a
--   demoted primary that the sentinels did not convert yet, whose writes none will keep).
--   A new replication id (the process was demoted and promoted again) or a clock that
--   went back starts the term afresh: "first" is then this note's time, so a deadline that
--   fell between two terms is never taken for one seen in the later term.
--   `primary` is the caller's primary_epoch state when it has one (the sweep), else nil.
--   At most ALIVE_KEEP processes are remembered; a new one forgets the least recently seen.
local ALIVE_EVERY = 1
local ALIVE_KEEP = 8

-- "<last> <replid> <first>" -> last, replid, first (nil when the value has another shape).
local function alive_fields(value)
  if not value then return nil end
  local last, replid, first = string.match(value, '^(%S+) (%w*) (%S+)$')
  last, first = tonumber(last), tonumber(first)
  if not last or not first then return nil end
  return last, replid, first
end

local function note_alive(prefix, run_id, uptime, now, primary)
  local key = prefix .. ':epoch:alive'
  local value = rcall('HGET', key, run_id)
  local last, replid, first = alive_fields(value)
  if last and now >= last and now < last + ALIVE_EVERY then return end
  if primary == nil then primary = primary_epoch(run_id, uptime, now, prefix .. ':epoch:primaries', false) end
  if primary.role ~= 'master' or primary.isolated then return end
  local term = primary.replid
  if last == nil or replid ~= term or now < last then first = now end
  rcall('HSET', key, run_id, string.format('%.6f %s %.6f', now, term, first))
  if not value and rcall('HLEN', key) > ALIVE_KEEP then
    local entries, oldest, oldest_at = rcall('HGETALL', key), nil, nil
    for i = 1, #entries, 2 do
      local at = alive_fields(entries[i + 1]) or 0
      if entries[i] ~= run_id and (oldest_at == nil or at < oldest_at) then oldest, oldest_at = entries[i], at end
    end
    if oldest then rcall('HDEL', key, oldest) end
  end
end

-- seen_alive(prefix, stamp) -> last, first   (or nil when the process has no record)
--   When the process `stamp` was last seen serving as primary, and when its term began,
--   by its own clock (see note_alive).
local function seen_alive(prefix, stamp)
  local last, _, first = alive_fields(rcall('HGET', prefix .. ':epoch:alive', stamp))
  return last, first
end

-- ALIVE_MARGIN: seconds by which "last seen" must pass a deadline (against rounding; both
-- are the same process's TIME, written with six decimals).
local ALIVE_MARGIN = 0.01

-- died_under(deadline, last, first) -> whether a lease whose deadline is `deadline` ran out
--   while its process was serving as primary, as far as its record shows: the deadline
--   falls within the recorded term, by more than ALIVE_MARGIN before its last sign of life.
local function died_under(deadline, last, first)
  return deadline ~= nil and last ~= nil and first <= deadline and deadline + ALIVE_MARGIN < last
end
