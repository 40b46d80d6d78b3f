"""The data plane: what frontends, workers, the usage ingester and the batch runner say to each
other through Redis (Valkey), and nothing else.

No views, no Django request objects, and no app of the platform is imported here. Every
key of a deployment carries the deployment name as its hash tag, so one deployment's keys live
in one Redis Cluster slot and the scripts that touch several stay atomic there; a tenant's
limits carry the tenant in the same way.

- keys: every key, channel and consumer-group name; nothing outside it builds a key.
- types: the wire types (jobs, events, usage events) and their encoding.
- scripts, lua/: the Lua scripts, read once.
- frontdoor: a frontend's side of a deployment's queue (enqueue, cancel, follow, whereabouts);
  the queues and their fair order are described there.
- leases: a worker's side (claim, heartbeat, handoffs); leases and prefix affinity there.
- finish: reply events and the exactly-once finish of a request.
- reaper: lapsed leases and overdue queued jobs.
- usage: the usage streams the ingesters read.
- snapshots: what control-plane code reads of a queue, synchronously; autoscale: the
  workers a deployment needs, from a snapshot, with its hysteresis kept in Redis.
- quotas: per-tenant limits; replies: one reader per deployment for followed reply streams;
  changes: control-plane change notices; redis_client, background, metrics, tracing: the
  plumbing (log redaction, which knows the API keys' shape, is config.log_redaction's).
"""
