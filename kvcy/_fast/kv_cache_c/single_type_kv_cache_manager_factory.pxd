# kv_cache_c/single_type_kv_cache_manager_factory.pxd: nothing to declare (single_type_kv_cache_manager_factory.pyx holds Python-level
# functions and the spec -> manager map only); here so every concept has its .pyx/.pxd pair.
# Included by kvcy/_fast/_kv_cache_c.pxd.
