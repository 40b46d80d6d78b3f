"""The data plane: what frontends, workers, the usage ingester and the batch runner say to each
other through Redis (Valkey), and nothing else.

Wire types, key names, the Lua scripts and the queue roles live here. No views, no Django
request objects; nothing outside this package builds a Redis key.
"""
