-- Helpers shared by the two sweep verbs (sweep.lua: lease verdicts; rescue.lua: RQ's
-- intermediate list). The loader pastes this file where a script says
-- `-- @include _sweep.lua`, after `-- @include _epoch.lua`.
--
-- record(member, verdict, stalled, max_stalled, lease_epoch, dry)
--   Adds one verdict to the reply as one line "<verdict> <stalled> <max_stalled> <member>
--   <lease_epoch>" (see reply below), and counts it for the per-queue counters unless it is
--   a dry run or a deferral. A member or lease_epoch holding a space, a newline or '%' (no
--   job id or run_id does; a foreign entry may) is written percent-encoded, so the fields
--   split cleanly on spaces and the lines on newlines.
-- count_verdicts(stats_key)
--   Adds the verdicts of this call to the per-queue counters, one HINCRBY per verdict.
-- reply(run_id, uptime, now, primary, more, left_leases, left_stock, left_legacy)
--   The reply every sweep verb returns: {run_id, uptime, now, role, primary_age,
--   replicas_online, replicas_expected, first_seen_as_primary, more, left_leases,
--   left_stock, left_legacy, n, records}: the n records are one string, one line each
--   (one reply element per call: the client splits one string instead of reading n).
-- requeue(prefix, queue_key, job_key, job_id, intermediate, later, ...)
--   Status queued, pushed at the front of queue_key (<prefix>:queue:<queue>), the queue
--   registered in <prefix>:queues; with `intermediate` true, its entry in <queue_key>:intermediate
--   is removed too (a started job has none: the grant, or RQ's own start, removed it). With
--   `later` true the push is gathered (see gather) instead of sent now. `...` are more fields
--   of the job to write in the same HSET.
-- gather(command, key, member) / gather_del(key) / send_gathered()
--   Writes of one loop that name one key each (ZREM, SREM, LPUSH) or many keys (DEL), kept
--   and sent by send_gathered() as one command per key (at most 1,000 members each), in the
--   order they were gathered: the writes of one command per member in a fraction of the
--   commands. Only for writes that nothing read before send_gathered() depends on.

local records = {}
local tally = {}
local registered = {}

-- A field of a record as written: percent-encoded when it holds ' ', '\n' or '%' (plain
-- finds: a pattern with a character class costs more than the rest of the record).
local function field(s)
  if not (string.find(s, ' ', 1, true) or string.find(s, '\n', 1, true) or string.find(s, '%', 1, true)) then
    return s
  end
  return (string.gsub(s, '[ \n%%]', function(c) return string.format('%%%02X', string.byte(c)) end))
end

local function record(member, verdict, stalled, max_stalled, lease_epoch, dry)
  records[#records + 1] = verdict .. ' ' .. (stalled or 0) .. ' ' .. (max_stalled or 0) .. ' ' .. field(member) .. ' '
                          .. field(lease_epoch or '')
  if not dry and verdict ~= 'deferred' then tally[verdict] = (tally[verdict] or 0) + 1 end
end

local function count_verdicts(stats_key)
  for verdict, count in pairs(tally) do redis.call('HINCRBY', stats_key, verdict, count) end
end

-- This server's primary epoch (recorded unless dry), and whether a sweep here may judge:
-- only on a primary that is not isolated (see primary_epoch in _epoch.lua).
local function judging_primary(run_id, uptime, now, prefix, dry)
  local primary = primary_epoch(run_id, uptime, now, prefix .. ':epoch:primaries', not dry)
  return primary, primary.role == 'master' and not primary.isolated
end

local function reply(run_id, uptime, now, primary, more, left_leases, left_stock, left_legacy)
  local head = {run_id, tostring(uptime), tostring(now), primary.role, tostring(primary.age), primary.online,
                primary.expected, tostring(primary.first), more, left_leases, left_stock, left_legacy, #records,
                table.concat(records, '\n')}
  return head
end

local gathered = {ZREM = {}, SREM = {}, LPUSH = {}}
local gathered_keys = {ZREM = {}, SREM = {}, LPUSH = {}}
local gathered_dels = {}

local function gather(command, key, member)
  local members = gathered[command][key]
  if not members then
    members = {}
    gathered[command][key] = members
    local keys = gathered_keys[command]
    keys[#keys + 1] = key
  end
  members[#members + 1] = member
end

local function gather_del(key)
  gathered_dels[#gathered_dels + 1] = key
end

-- One command per 1,000 members: `unpack` puts every argument on Lua's stack.
local function send_chunks(command, key, members)
  for i = 1, #members, 1000 do
    local last = math.min(i + 999, #members)
    if key then redis.call(command, key, unpack(members, i, last)) else redis.call(command, unpack(members, i, last)) end
  end
end

local function send_gathered()
  for _, command in ipairs({'ZREM', 'SREM', 'LPUSH'}) do
    for _, key in ipairs(gathered_keys[command]) do send_chunks(command, key, gathered[command][key]) end
    gathered[command], gathered_keys[command] = {}, {}
  end
  if #gathered_dels > 0 then send_chunks('DEL', nil, gathered_dels) end
  gathered_dels = {}
end

local function requeue(prefix, queue_key, job_key, job_id, intermediate, later, ...)
  redis.call('HSET', job_key, 'status', 'queued', 'started_at', '', ...)
  if intermediate then redis.call('LREM', queue_key .. ':intermediate', 0, job_id) end
  if later then gather('LPUSH', queue_key, job_id) else redis.call('LPUSH', queue_key, job_id) end
  if not registered[queue_key] then
    redis.call('SADD', prefix .. ':queues', queue_key)
    registered[queue_key] = true
  end
end
