"""raypipe's workers: what runs a rank's chunks, behind one interface (``protocol.Workers``).

Ray tasks on any node (``ray_tasks``), worker processes of this machine writing into shared memory
(``local``, ``worker_process``, ``slabs``), and such processes on every eligible node streaming their
images over TCP after a handshake (``node``, ``peer_auth``); ``handover`` passes a finished slab to a
trainer process as a descriptor.
"""
