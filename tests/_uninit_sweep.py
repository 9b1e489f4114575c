"""Every method of every class of the active twin, on objects whose ``__init__`` never ran.

Run as a script (tests/test_uninitialised_objects.py does, in its own interpreter so that
a crash fails the test instead of ending the session): ``_uninit_sweep.py MODE`` with MODE
``new`` (``cls.__new__(cls)``, where the class allows it) or ``subclass`` (a Python
subclass whose ``__init__`` does not call the base's).  Each method is called with a fixed
set of argument tuples, valid-looking and not, and each settable attribute is assigned a few
values; exceptions are expected, a signal is not.
Prints ``done`` at the end.
"""

from __future__ import annotations

import inspect
import itertools
import sys

from kvcy import _fast
from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
from kvcy.kv_offload.base import ReqContext

MODE = sys.argv[1]
init_none_hash(get_hash_fn_by_name("sha256"))
kv = _fast.kv_cache
REQUEST = kv.Request("r0", list(range(20)), block_hasher=get_request_block_hasher(4, get_hash_fn_by_name("sha256")))
BLOCK = kv.KVCacheBlock(3)
BLOCKS = kv.KVCacheBlocks(([BLOCK],))
ARGS = [(), (1,), (0,), (-1,), (None,), (1, -1), ([],), ([BLOCK],), (BLOCK,), (BLOCKS,), (b"abcd",),
        (REQUEST,), (REQUEST, 8), (REQUEST, 8, 0), (REQUEST, 8, 0, BLOCKS), ("r0",), ("r0", 8), ("r0", 8, 0),
        (REQUEST.block_hashes, 8), (REQUEST.block_hashes, 8, [0]), (8, 8), (ReqContext(req_id="r"),),
        ([b"abcdefgh"], ReqContext(req_id="r"))]
VALUES = (0, 4, -1, None, "x", 2**63, [], (BLOCK,), BLOCKS, REQUEST)
DUNDERS = ("__len__", "__iter__", "__repr__", "__getitem__", "__contains__", "__add__", "__eq__")


def instance(cls):
    if MODE == "new":
        return cls.__new__(cls)
    sub = type("Sub", (cls,), {"__init__": lambda self, *args, **kwargs: None})
    return sub(1)


def classes():
    for twin in (_fast.kv_cache, _fast.offload, _fast.kv_index, _fast.hashing):
        for name, cls in sorted(vars(twin).items()):
            if inspect.isclass(cls) and cls.__module__.startswith("kvcy._fast"):
                yield name, cls


for name, cls in classes():
    try:
        obj = instance(cls)
    except TypeError:
        continue            # refused (a class that cannot be made without arguments, or is final)
    for attr in sorted(dir(cls)):
        if attr.startswith("__") and attr not in DUNDERS:
            continue
        for args in ARGS:
            try:
                got = getattr(obj, attr)
                if not callable(got):
                    break
                out = got(*args)
                if hasattr(out, "__next__"):
                    list(itertools.islice(out, 3))
            except Exception:
                pass
        try:
            repr(obj)
        except Exception:
            pass
    # Every settable attribute (checked setters such as a coordinator's retention_interval
    # included) takes a few values, valid-looking and not, on the object that never ran __init__.
    for attr in sorted(dir(cls)):
        if attr.startswith("__") or not inspect.isdatadescriptor(inspect.getattr_static(cls, attr, None)):
            continue
        for value in VALUES:
            try:
                setattr(obj, attr, value)
            except Exception:
                pass
    try:
        repr(obj)
    except Exception:
        pass
print("done")
