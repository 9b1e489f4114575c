"""The fleet replay's ZeroMQ transport: one publisher per instance on the loopback interface, one subscriber.

Each instance's :class:`~kvcy.kv_events.ZmqEventPublisher` binds a PUB socket
and a replay (ROUTER) socket on ``127.0.0.1`` with system-chosen ports; the
router's :class:`~kvcy.kv_events.EventSubscriber` connects to all of them and
applies what has arrived to the index before each routing decision
(:meth:`ZmqTransport.drain`).  The publishers encode and send from their
own threads, so the index sees a batch some time after the instance published
it: the lag the report gives (wall-clock seconds from the batch's timestamp
to when it was applied, sampled at each routing decision) and the batches
still in flight when a request is routed.  At the end :meth:`ZmqTransport.finish`
waits (boundedly) until every published batch was applied, so the index ends
as the instances are; if time runs out first, the report says so (``complete``:
False, with a warning) rather than passing an index that lags for a final one.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from kvcy.sim.scheduler import nearest_rank

__all__ = ["ZmqTransport"]

logger = logging.getLogger("kvcy.sim")


class ZmqTransport:
    """Publishers for ``names`` (one per instance) and a subscriber applying to ``index``.

    Args:
        index: the routing index (``apply_batch`` / ``remove_instance``).
        names: the instances' names in the index, in instance order.
        finish_timeout: seconds :meth:`finish` waits for the last batches.

    Raises:
        ImportError: pyzmq is not installed.
    """

    def __init__(self, index: Any, names: list[str], *, finish_timeout: float = 30.0) -> None:
        import zmq

        from kvcy.kv_events import EventSubscriber, ZmqEventPublisher

        self.names = names
        self.finish_timeout = finish_timeout
        self._ctx = zmq.Context()
        # Per instance: a PUB and a ROUTER (the publisher), a SUB, its monitor's two sockets and a
        # DEALER (the subscriber); ZeroMQ's default of 1023 sockets per context stops near 200.
        self._ctx.set(zmq.MAX_SOCKETS, 8 * len(names) + 64)
        self.publishers: list[Any] = []
        self.subscriber: Any = None
        self.published = [0] * len(names)
        self.num_events = 0
        self.lags: list[float] = []
        self.in_flight_sum = 0
        self.drains = 0
        #: Whether :meth:`finish` saw every published batch applied (None before it ran).
        self.complete: bool | None = None
        self._last_stats: dict[str, Any] = {}
        self._dropped: list[int] = []
        try:
            for _ in names:
                self.publishers.append(ZmqEventPublisher(
                    endpoint="tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0", topic="kv-events",
                    context=self._ctx,
                ))
            self.subscriber = EventSubscriber(
                index, {name: (p.endpoint, p.replay_endpoint) for name, p in zip(names, self.publishers)},
                topic="kv-events", context=self._ctx,
            )
            self._settle()
        except BaseException:
            self.close()
            raise

    def _settle(self, timeout: float | None = None) -> None:
        """Wait until every subscription is live (a ZeroMQ SUB socket misses what is sent before it joined).

        One empty probe batch per publisher, until the subscriber has seen one
        from each (a probe it missed is recovered by replay anyway).  The wait
        allowed grows with the fleet (5 s and 50 ms per instance): hundreds of
        publisher threads on a busy 2-core machine take seconds to all be heard.
        """
        from kvcy.kv_events import KVEventBatch

        if timeout is None:
            timeout = 5.0 + 0.05 * len(self.publishers)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i, pub in enumerate(self.publishers):
                pub.publish(KVEventBatch(ts=time.time(), events=[]))
                self.published[i] += 1
            self.subscriber.poll(0.05)
            if all(last_seq is not None for last_seq, _ in self.subscriber.progress().values()):
                return
        raise RuntimeError("the fleet's event subscriber did not connect to every publisher within "
                           f"{timeout:g} s")

    def publish(self, i: int, batch: Any) -> None:
        self.published[i] += 1
        self.num_events += len(batch.events)
        self.publishers[i].publish(batch)

    def drain(self) -> None:
        """Apply what has arrived; sample the lag and the batches still in flight."""
        sub = self.subscriber
        sub.poll(0.0)
        progress = sub.progress()  # not sub.states: that copies every state, at every decision
        self.drains += 1
        for name, n in zip(self.names, self.published):
            last_seq, lag = progress[name]
            applied = -1 if last_seq is None else last_seq
            self.in_flight_sum += max(0, n - 1 - applied)
            if lag is not None:
                self.lags.append(lag)

    def finish(self) -> bool:
        """Wait until every published batch has been applied (at most ``finish_timeout`` seconds).

        Returns:
            Whether they all were (also kept in :attr:`complete`; a warning says when not).
        """
        deadline = time.monotonic() + self.finish_timeout
        while True:
            self.subscriber.poll(0.02)
            progress = self.subscriber.progress()
            behind = {name: n - 1 - (-1 if progress[name][0] is None else progress[name][0])
                      for name, n in zip(self.names, self.published)}
            if not any(behind.values()):
                self.complete = True
                return True
            if time.monotonic() >= deadline:
                break
        logger.warning("fleet replay: the index did not catch up within %g s (batches not applied: %s)",
                       self.finish_timeout, {name: n for name, n in behind.items() if n})
        self.complete = False
        return False

    def close(self) -> None:
        """Close the sockets and stop the threads (the counters are kept for :meth:`stats`)."""
        self._dropped = [p.dropped_batches for p in self.publishers] or self._dropped
        if self.subscriber is not None:
            self._last_stats = dict(self.subscriber.stats)
            self.subscriber.close()
            self.subscriber = None
        stuck = False
        for pub in self.publishers:
            pub.shutdown()
            stuck = stuck or pub._thread.is_alive()
        self.publishers = []
        if stuck:  # pragma: no cover - shutdown waits for the thread; terminating would hang on its sockets
            logger.warning("fleet replay: a publisher thread did not stop; its ZeroMQ context is left open")
        else:
            self._ctx.term()

    def stats(self) -> dict[str, Any]:
        lags = sorted(self.lags)
        sub = self._last_stats
        return {
            "transport": "zmq",
            "complete": self.complete,
            "batches_published": sum(self.published),
            "events_published": self.num_events,
            "batches_applied": sub.get("batches_applied", 0),
            "batches_dropped": sum(self._dropped),
            "batches_replayed": sub.get("replayed", 0),
            "batches_lost": sub.get("lost", 0),
            "gaps": sub.get("gaps", 0),
            "malformed": sub.get("malformed", 0),
            "lag_ms_p50": 1e3 * nearest_rank(lags, 50),
            "lag_ms_p99": 1e3 * nearest_rank(lags, 99),
            "lag_ms_max": 1e3 * float(sub.get("max_lag", 0.0)),
            "in_flight_at_routing_mean": self.in_flight_sum / self.drains if self.drains else 0.0,
        }
