"""The worker-side transfer API: handlers that move blocks, and the worker that routes jobs to them.

A *job* is one batch of block copies from one medium to another, described
by a ``(src_spec, dst_spec)`` pair of
:class:`~kvcy.kv_offload.base.LoadStoreSpec` (a :data:`TransferSpec`).  An
:class:`OffloadingHandler` runs jobs of one direction asynchronously and
reports them through :meth:`~OffloadingHandler.get_finished`; the
:class:`OffloadingWorker` owns the handlers of every direction and routes each
job by the types of its two specs.

Names: vLLM's seed-era worker (``vllm.v1.kv_offload.worker.worker``) has
``TransferSpec``, ``OffloadingHandler`` (``transfer_async(job_id, spec)``,
``get_finished()``, ``wait(job_ids)``) and an ``OffloadingWorker`` with
``register_handler(src_cls, dst_cls, handler)``.  vLLM 0.33.0 moved
``TransferResult`` and an ``OffloadingWorker`` with ``submit_store`` /
``submit_load`` into ``vllm.v1.kv_offload.base``; the worker here offers both
call styles.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass

from kvcy.kv_offload.base import GPULoadStoreSpec, LoadStoreSpec

__all__ = ["OffloadingHandler", "OffloadingWorker", "TransferResult", "TransferSpec", "check_job_id"]

logger = logging.getLogger(__name__)

#: One job: where the blocks come from and where they go.
TransferSpec = tuple[LoadStoreSpec, LoadStoreSpec]


@dataclass
class TransferResult:
    """A finished job: its id, whether it succeeded, and (when known) its bytes and seconds."""

    job_id: int
    success: bool
    transfer_size: int | None = None
    transfer_time: float | None = None


def check_job_id(job_id: object) -> int:
    """``job_id`` if it is an int (not a bool).

    Raises:
        TypeError: anything else.
    """
    if isinstance(job_id, bool) or not isinstance(job_id, int):
        raise TypeError(f"job_id must be an int, got {type(job_id).__name__}")
    return job_id


def unpack_transfer_spec(spec: object) -> TransferSpec:
    """``spec`` as a ``(src_spec, dst_spec)`` pair of LoadStoreSpec.

    Raises:
        TypeError: not a pair of LoadStoreSpec.
    """
    if not isinstance(spec, tuple) or len(spec) != 2:
        raise TypeError(f"a transfer spec must be a (src_spec, dst_spec) tuple, got {type(spec).__name__}")
    src, dst = spec
    for side, s in (("src", src), ("dst", dst)):
        if not isinstance(s, LoadStoreSpec):
            raise TypeError(f"the transfer's {side} spec must be a LoadStoreSpec, got {type(s).__name__}")
    return src, dst


def job_id_set(job_ids: Iterable[int]) -> set[int]:
    """``job_ids`` as a set of ints (TypeError otherwise)."""
    if isinstance(job_ids, (str, bytes)) or not isinstance(job_ids, Iterable):
        raise TypeError(f"job_ids must be an iterable of ints, got {type(job_ids).__name__}")
    return {check_job_id(j) for j in job_ids}


class OffloadingHandler(ABC):
    """Runs transfer jobs of one direction (e.g. GPU -> CPU) without blocking the caller.

    Jobs are finished in submission order.  A job id may not be reused until
    :meth:`get_finished` has reported it.
    """

    @abstractmethod
    def transfer_async(self, job_id: int, spec: TransferSpec) -> bool:
        """Start a job; returns whether it was submitted.

        Args:
            job_id: caller-chosen id, reported back by :meth:`get_finished`.
            spec: ``(src_spec, dst_spec)``.
        """

    @abstractmethod
    def get_finished(self) -> list[TransferResult]:
        """Jobs finished since the last call, in submission order (each reported once)."""

    @abstractmethod
    def wait(self, job_ids: set[int]) -> None:
        """Block until the given jobs are done (ids this handler does not hold are ignored)."""

    def shutdown(self) -> None:
        """Finish in-flight jobs and release resources; the handler takes no further jobs."""
        return


class OffloadingWorker:
    """Routes transfer jobs to the handler registered for their (source, destination) spec types.

    Register one handler per direction with :meth:`register_handler`; submit
    jobs with :meth:`transfer_async` (seed-era vLLM) or
    :meth:`submit_store` / :meth:`submit_load` (vLLM 0.33.0); collect them
    with :meth:`get_finished`.  A spec type routes to the handler registered
    for it or for its nearest registered base class.
    """

    def __init__(self) -> None:
        self._routes: dict[tuple[type, type], OffloadingHandler] = {}
        self._handlers: list[OffloadingHandler] = []
        self._in_flight: set[int] = set()

    def _add_handler(self, handler: OffloadingHandler) -> None:
        if not isinstance(handler, OffloadingHandler):
            raise TypeError(f"handler must be an OffloadingHandler, got {type(handler).__name__}")
        if all(h is not handler for h in self._handlers):
            self._handlers.append(handler)

    def register_handler(
        self, src_cls: type[LoadStoreSpec], dst_cls: type[LoadStoreSpec], handler: OffloadingHandler
    ) -> None:
        """Send jobs from ``src_cls`` specs to ``dst_cls`` specs to ``handler``.

        Raises:
            TypeError: the classes are not LoadStoreSpec types, or handler is
                not an OffloadingHandler.
            ValueError: the pair already has a handler.
        """
        for side, cls in (("src_cls", src_cls), ("dst_cls", dst_cls)):
            if not (isinstance(cls, type) and issubclass(cls, LoadStoreSpec)):
                raise TypeError(f"{side} must be a LoadStoreSpec subclass, got {cls!r}")
        if (src_cls, dst_cls) in self._routes:
            raise ValueError(f"a handler for {src_cls.__name__} -> {dst_cls.__name__} is already registered")
        self._add_handler(handler)
        self._routes[(src_cls, dst_cls)] = handler

    def _route(self, src: LoadStoreSpec, dst: LoadStoreSpec) -> OffloadingHandler:
        for s in type(src).__mro__:
            for d in type(dst).__mro__:
                handler = self._routes.get((s, d))
                if handler is not None:
                    return handler
        raise ValueError(f"no handler is registered for transfers {type(src).__name__} -> {type(dst).__name__}")

    def _submit(self, handler: OffloadingHandler, job_id: int, spec: TransferSpec) -> bool:
        if job_id in self._in_flight:
            raise ValueError(f"job {job_id} is still in flight; a job id can be reused once it is reported finished")
        ok = handler.transfer_async(job_id, spec)
        if ok:
            self._in_flight.add(job_id)
        else:
            logger.warning("offloading job %d was not submitted", job_id)
        return ok

    def transfer_async(self, job_id: int, spec: TransferSpec) -> bool:
        """Submit a job to the handler of its spec types; returns whether it was submitted.

        Raises:
            TypeError: a bad job id or spec.
            ValueError: no handler for the spec types, a job id still in
                flight, or what the handler refuses.
        """
        check_job_id(job_id)
        src, dst = unpack_transfer_spec(spec)
        return self._submit(self._route(src, dst), job_id, (src, dst))

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        """GPU -> offloaded medium (vLLM 0.33.0 name); see :meth:`transfer_async`."""
        if not isinstance(src_spec, GPULoadStoreSpec):
            raise TypeError(f"submit_store: src_spec must be a GPULoadStoreSpec, got {type(src_spec).__name__}")
        return self.transfer_async(job_id, (src_spec, dst_spec))

    def submit_load(
        self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec, expedited: bool = False
    ) -> bool:
        """Offloaded medium -> GPU (vLLM 0.33.0 name); see :meth:`transfer_async`.

        ``expedited`` asks for a load that does not queue behind regular
        loads; this router has one handler per direction and ignores it
        (:class:`~kvcy.kv_offload.worker.cpu_gpu.CPUOffloadingWorker` honours it).
        """
        if not isinstance(dst_spec, GPULoadStoreSpec):
            raise TypeError(f"submit_load: dst_spec must be a GPULoadStoreSpec, got {type(dst_spec).__name__}")
        return self.transfer_async(job_id, (src_spec, dst_spec))

    def get_finished(self) -> list[TransferResult]:
        """Finished jobs of every handler, each reported once."""
        results: list[TransferResult] = []
        for handler in self._handlers:
            results.extend(handler.get_finished())
        for r in results:
            self._in_flight.discard(r.job_id)
        return results

    def wait(self, job_ids: set[int]) -> None:
        """Block until the given jobs are done; unknown ids are ignored."""
        ids = job_id_set(job_ids)
        for handler in self._handlers:
            handler.wait(ids)

    def shutdown(self) -> None:
        """Shut every handler down (in-flight jobs are finished, not reported)."""
        for handler in self._handlers:
            handler.shutdown()
        self._in_flight.clear()
