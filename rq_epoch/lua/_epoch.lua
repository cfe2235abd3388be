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
  local field = run_id .. ':' .. string.match(info_value(info, 'master_replid') or '', '^%w*')
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
