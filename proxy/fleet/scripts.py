"""The Lua scripts that make each shared transition atomic on Redis.

A script runs alone on the server: the version compare, the write and the change-feed entry
happen together or not at all, so no other replica's transition can fall between reading the
version and writing the record.
"""

TRANSITION = """
-- KEYS[1] the record's hash, KEYS[2] the change feed (a stream)
-- ARGV: expected version, kind, id, record JSON ('' = deleted), events JSON, origin replica,
--       key TTL in ms (0 = none), feed MAXLEN, [when an operator made this change; '': no operator]
-- Besides the record ('r') at its version ('v'), the hash keeps when an operator last changed it
-- ('a', the latest such time); every reply and feed entry carries it.
-- A new version is the server's time in microseconds (or one more than the last, if that is
-- later): versions then never go back, not even for a key deleted or a Redis restarted empty, so
-- a replica that saw the old versions takes the new ones for newer.
local v = tonumber(redis.call('HGET', KEYS[1], 'v') or '0')
local acted = redis.call('HGET', KEYS[1], 'a') or ''
if v ~= tonumber(ARGV[1]) then
  return {0, v, redis.call('HGET', KEYS[1], 'r') or '', acted}
end
local now = redis.call('TIME')
v = string.format('%d', math.max(v + 1, tonumber(now[1]) * 1000000 + tonumber(now[2])))
local by_operator = ARGV[9] or ''
if by_operator ~= '' and (acted == '' or tonumber(by_operator) > tonumber(acted)) then
  acted = by_operator
  redis.call('HSET', KEYS[1], 'a', acted)
end
redis.call('HSET', KEYS[1], 'v', v, 'r', ARGV[4])
local ttl = tonumber(ARGV[7])
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[1], ttl)
else
  redis.call('PERSIST', KEYS[1])
end
local id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[8], '*',
  'k', ARGV[2], 'i', ARGV[3], 'v', v, 'r', ARGV[4], 'e', ARGV[5], 'o', ARGV[6], 'a', acted)
return {1, v, id, acted}
"""
"""Apply a transition only if the record is still at the version the caller decided on. Either way
the reply ends with when an operator last changed the record. (The version travels as a decimal
string: Lua's own number-to-text conversion keeps 14 digits of its 16.)"""

TAKE_PROBE = """
-- KEYS[1] the probe lease; ARGV: owner, lease in ms
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, 0}
end
local left = redis.call('PTTL', KEYS[1])
if left == -1 then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {2, 0}
end
return {0, left}
"""
"""Take the fleet's probe lease: {1, 0} taken; {2, 0} taken over a key that could never expire
(another writer's SET without PX: no lease, or no replica would ever probe again); {0, ms} held
by another replica for that long yet."""

RELEASE_PROBE = """
-- KEYS[1] the probe lease, KEYS[2] the change feed; ARGV: owner, provider, origin, feed MAXLEN
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'k', 'p', 'i', ARGV[2], 'o', ARGV[3])
  return 1
end
return 0
"""
"""Give the fleet's probe lease back, only if we still own it, and tell the fleet it is free."""

RENEW_PROBE = """
-- KEYS[1] the probe lease; ARGV: owner, lease in ms
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
"""Start an owned probe lease over (the probe made progress)."""
