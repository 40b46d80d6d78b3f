-- Take one request from the requests-per-minute bucket, or refuse with status 1; report both
-- buckets as the admission script does.
local rpm, tpm = tonumber(ARGV[2]), tonumber(ARGV[3])
local req, tok = level(KEYS[1], rpm), level(KEYS[2], tpm)
local reset_tokens = math.ceil((tpm - tok) * 60000 / tpm)
if req < 1 then
  return {1, 0, math.floor(tok), math.ceil((1 - req) * 60000 / rpm), reset_tokens}
end
redis.call('HSET', KEYS[1], 'level', req - 1, 'ts', now)
redis.call('PEXPIRE', KEYS[1], 120000)
return {0, math.floor(req - 1), math.floor(tok), math.ceil((rpm - req + 1) * 60000 / rpm),
        reset_tokens}
