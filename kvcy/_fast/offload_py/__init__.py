"""The pure-Python twin of the CPU offloading tier, one concept per module.

The compiled twin (``kvcy/_fast/offload_c/``) has one ``.pyx`` per concept with
the same stems.  Nothing imports these modules but ``kvcy._fast._offload_py``,
which assembles them into the twin module the selector loads.

* ``_common``: the API constants, owner ids, argument checks, load/store specs;
* ``policies_base_request_order``: ``order_request_keys``;
* ``policies_base_chunk_status``: ``ChunkStatus``;
* ``policies_base``: ``CachePolicy`` and the policies' argument checks;
* ``policies_lru``: ``LRUCachePolicy``;
* ``policies_arc``: ``ARCCachePolicy``;
* ``manager_access_record``: a request's access record on its ReqContext;
* ``manager``: ``CPUOffloadingManager``;
* ``offloading_connector``: ``ReplayConnector`` and ``ConnectorRequest``, the replay's
  offloading connector (``kvcy replay --cpu-offload``).
"""
