-- Read the buckets without taking from them: what a response that admitted nothing reports.
local rpm, tpm = tonumber(ARGV[2]), tonumber(ARGV[3])
local req, tok = level(KEYS[1], rpm), level(KEYS[2], tpm)
return {math.floor(req), math.floor(tok), math.ceil((rpm - req) * 60000 / rpm),
        math.ceil((tpm - tok) * 60000 / tpm)}
