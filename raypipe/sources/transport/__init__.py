"""How a dataset's bytes are reached: its root on a local disk or in an object store (``paths``), remote
reads with requests in flight and retries (``remote``, ``request_pool``), single GETs (``single_get``),
and the node-local cache of remote objects (``cache`` and its config, segments and readers' view)."""
