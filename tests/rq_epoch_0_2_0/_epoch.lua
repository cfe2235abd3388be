-- Helpers shared by every rq-epoch script. The loader pastes this file where a
-- script says `-- @include _epoch.lua`.
--
-- current_epoch() -> run_id, uptime_in_seconds   (or nil, nil, error text)
--   Reads the run_id of the server process running this script, from INFO server,
--   and checks its shape: exactly 40 characters of 0-9a-f. Never cached anywhere.
-- server_now() -> seconds since the Unix epoch, from the server clock (TIME).

local function current_epoch()
  local ok, info = pcall(redis.call, 'INFO', 'server')
  if not ok then
    local reason = info
    if type(info) == 'table' then reason = info.err end
    return nil, nil, 'EPOCH_UNAVAILABLE INFO server was refused (the server user needs the ACL rule +info): '
      .. tostring(reason)
  end
  local run_id = string.match(info, 'run_id:([^\r\n]*)')
  if run_id == nil or string.len(run_id) ~= 40 or string.find(run_id, '[^0-9a-f]') then
    return nil, nil, 'EPOCH_UNAVAILABLE INFO server has no valid run_id: ' .. tostring(run_id)
  end
  local uptime = tonumber(string.match(info, 'uptime_in_seconds:(%d+)')) or 0
  return run_id, uptime, nil
end

local function server_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
