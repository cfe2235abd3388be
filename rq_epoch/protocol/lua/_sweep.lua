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
-- count_of(text, least, default)
--   The whole number a job field holds, when it is one from `least` to 2^31; else `default`.
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
-- gather(command, key, member) / send_gathered()
--   Writes of one loop that name one key each (ZREM, SREM, LPUSH) or many keys (DEL: keys
--   appended to `gathered_dels`), kept and sent by send_gathered() as one command per key (at
--   most 1,000 members each; the keys in the order they were first gathered, each key's
--   members in the order they were gathered): the writes of one command per member in a
--   fraction of the commands. Only for writes that nothing read before send_gathered()
--   depends on. A caller that gathers for every lease appends to `gathered[key] or
--   gathered_for(command, key)` itself (a call less per member).
-- members_of(list) -> list, joined
--   Notes whether any member of a list read from a sorted set needs percent-encoding in a
--   record (checked once for the whole list); record then writes the others as they are.

local records = {}
local tally = {}
local registered = {}

-- A field of a record as written: percent-encoded when it holds ' ', '\n' or '%' (plain
-- finds: a pattern with a character class costs more than the rest of the record).
local find = string.find
local function field(s)
  if not (find(s, ' ', 1, true) or find(s, '\n', 1, true) or find(s, '%', 1, true)) then
    return s
  end
  return (string.gsub(s, '[ \n%%]', function(c) return string.format('%%%02X', string.byte(c)) end))
end

-- Whether every member of the list being judged needs no encoding (members_of): record then
-- writes members as they are, without three finds per member.
local plain_members = false

-- list, after noting whether any member of it needs encoding: one concat and three plain
-- finds for the whole list. Returns the list and its members joined (nothing between them).
local function members_of(list)
  local joined = table.concat(list)
  plain_members = not (find(joined, ' ', 1, true) or find(joined, '\n', 1, true) or find(joined, '%', 1, true))
  return list, joined
end

-- memo[value], made by make(value) the first time a call asks for it (a batch holds a few
-- distinct stamps and counts, so each is checked, parsed or formatted once per call).
local function once(memo, value, make)
  local made = memo[value]
  if made == nil then
    made = make(value)
    memo[value] = made
  end
  return made
end

-- The lease_epoch field as written.
local epoch_fields = {}
local function epoch_field(s) return once(epoch_fields, s, field) end

-- A job field written by hand may hold anything ('2.5', 'nan', '1e300'): its whole number
-- from 0 to 2^31, or false.
local function whole_number(text)
  local n = tonumber(text)
  if n == nil or n ~= n or n < 0 or n > 2147483648 or n % 1 ~= 0 then return false end
  return n
end

local read_counts = {}
local function count_of(text, least, default)
  if not text then return default end
  local n = once(read_counts, text, whole_number)
  if not n or n < least then return default end
  return n
end

-- A count as text (Lua formats a number with sprintf each time it is joined to a string).
local count_texts = {}
local function count_text(n) return once(count_texts, n, tostring) end

local function record(member, verdict, stalled, max_stalled, lease_epoch, dry)
  stalled, max_stalled, lease_epoch = stalled or 0, max_stalled or 0, lease_epoch or ''
  -- The memo tables are read here first: a call only for a text not formatted yet.
  records[#records + 1] = verdict .. ' ' .. (count_texts[stalled] or count_text(stalled)) .. ' '
                          .. (count_texts[max_stalled] or count_text(max_stalled)) .. ' '
                          .. (plain_members and member or field(member)) .. ' '
                          .. (epoch_fields[lease_epoch] or epoch_field(lease_epoch))
  if not dry and verdict ~= 'deferred' then tally[verdict] = (tally[verdict] or 0) + 1 end
end

local function count_verdicts(stats_key)
  for verdict, count in pairs(tally) do rcall('HINCRBY', stats_key, verdict, count) end
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

-- Per key: its command and the members gathered for it (a key is only ever written with
-- one command), and the keys in the order they were first gathered.
local gathered, gathered_command, gathered_keys, gathered_dels = {}, {}, {}, {}

-- The list of members gathered for key, made (and key's command noted) on first use.
local function gathered_for(command, key)
  local members = gathered[key]
  if not members then
    members = {}
    gathered[key] = members
    gathered_command[key] = command
    gathered_keys[#gathered_keys + 1] = key
  end
  return members
end

local function gather(command, key, member)
  local members = gathered[key] or gathered_for(command, key)
  members[#members + 1] = member
end

-- One command per 1,000 members: `unpack` puts every argument on Lua's stack.
local function send_chunks(command, key, members)
  for i = 1, #members, 1000 do
    local last = math.min(i + 999, #members)
    if key then rcall(command, key, unpack(members, i, last)) else rcall(command, unpack(members, i, last)) end
  end
end

local function send_gathered()
  for _, key in ipairs(gathered_keys) do send_chunks(gathered_command[key], key, gathered[key]) end
  if #gathered_dels > 0 then send_chunks('DEL', nil, gathered_dels) end
  gathered, gathered_command, gathered_keys, gathered_dels = {}, {}, {}, {}
end

local function requeue(prefix, queue_key, job_key, job_id, intermediate, later, ...)
  rcall('HSET', job_key, 'status', 'queued', 'started_at', '', ...)
  if intermediate then rcall('LREM', queue_key .. ':intermediate', 0, job_id) end
  if later then
    local pushes = gathered[queue_key] or gathered_for('LPUSH', queue_key)
    pushes[#pushes + 1] = job_id
  else
    rcall('LPUSH', queue_key, job_id)
  end
  if not registered[queue_key] then
    rcall('SADD', prefix .. ':queues', queue_key)
    registered[queue_key] = true
  end
end
