"""Reading the KV events of N publishers into a routing index.

``EventSubscriber`` opens one ZeroMQ SUB socket per publisher (sequence numbers count per
publisher, so each socket says whose message it read) and, where the publisher has one, a DEALER
socket on its replay endpoint.  Each decoded ``KVEventBatch`` goes to
``index.apply_batch(instance, batch)`` in sequence order; the index is anything with
``apply_batch`` and ``remove_instance`` (``kvcy.kv_index.KVIndex``).

Per publisher it keeps an ``InstanceState``:

- a gap (a live sequence number above the next one expected, a late join included) is filled
  from the replay socket, waiting at most ``replay_timeout`` seconds; numbers the replay cannot
  supply (past the publisher's buffer, dropped by its full queue, no replay socket) are counted
  in ``lost`` and skipped;
- a live sequence number at or below the previous live one means the publisher restarted: the
  instance is forgotten (``index.remove_instance``) and rebuilt from the new stream.  So does a
  replay that holds other bytes under the number of the last batch applied: after a gap, and
  for the first batch after the SUB socket lost its connection (a ZeroMQ socket monitor tells),
  the replay is asked from that batch on to check it, since a restarted publisher may have
  published up to or past this subscriber's place before it is heard again (ZeroMQ reconnects
  take a while);
- a message that does not decode (wrong frame count, a sequence frame that is not 8 bytes, a
  truncated, foreign or too deeply nested payload, a timestamp that is not a finite number) is
  counted in ``malformed`` and skipped; so is a live number more than ``MAX_SEQ_JUMP`` past the
  next one expected (no publisher gets there: taken as a gap it would count ~2**64 batches lost
  and stall the stream), and a replay answer numbered outside what was asked (below the start,
  or past the live number that caused the request other than as the next of a consecutive run);
- what a subscriber buffers is bounded: ZeroMQ drops a message over ``max_message_size`` (and
  the connection that sent it, which is then made again), and one replay answer keeps at most
  ``max_replay_bytes`` of payload (the rest is dropped as if the answer had timed out, and its
  numbers count lost);
- with ``silent_after`` set, an instance that sent nothing for that many seconds is forgotten
  and counted in ``silences``; when it speaks again it is treated as a newcomer (its history is
  replayed from its first batch still buffered).

Lag: when a batch is applied, ``lag = time.time() - batch.ts``, the seconds between the
publisher stamping the batch (vLLM stamps it when the scheduler step emits the events) and the
index holding it; it includes the publisher's queue, the transport and this subscriber's
backlog, and across machines it carries their clock difference.

Limits of the protocol: a restarted publisher is recognised by its numbers going back or, through
its replay socket, by its batch under the last number applied; without a replay socket (or once
that batch has left the publisher's buffer) a restart that published past this subscriber's place
looks like a gap, and one whose first message heard is exactly the next number looks like the
same stream going on.  ``silent_after`` shorter than a restart takes bounds the damage.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from kvcy.kv_events.events import AllBlocksCleared, KVEventBatch
from kvcy.kv_events.publisher import END_SEQ, import_zmq

__all__ = ["EventSubscriber", "InstanceState"]

logger = logging.getLogger("kvcy.kv_events")

_COUNTERS = ("batches_applied", "events_applied", "gaps", "replayed", "lost", "malformed", "restarts",
             "silences", "clears")


@dataclasses.dataclass
class InstanceState:
    """What a subscriber knows of one publisher (an instance of the index).

    Attributes:
        last_seq: the last sequence number applied; None before the first and after forgetting.
        live_seq: the last sequence number read on the live (SUB) socket.
        last_ts: the publisher's timestamp of the last batch applied.
        lag: seconds from ``last_ts`` to when that batch was applied (see the module doc).
        max_lag: the largest ``lag`` seen.
        last_received: ``time.monotonic()`` when a message last came in, None once forgotten.
        batches_applied, events_applied: what reached the index.
        gaps: holes seen in the sequence numbers (a late join counts once).
        replayed: batches applied from the replay socket.
        lost: sequence numbers never applied (not replayable).
        malformed: messages skipped because they did not decode, were numbered where no batch
            can be (see the module doc), or the index refused them.
        restarts: times the publisher restarted: its numbers went back, or its replay held
            another batch under the last number applied (instance forgotten each time).
        silences: times the instance was forgotten for saying nothing for ``silent_after``.
        clears: ``AllBlocksCleared`` events applied.
    """

    instance: str
    endpoint: str
    replay_endpoint: str | None
    last_seq: int | None = None
    live_seq: int | None = None
    last_ts: float | None = None
    lag: float | None = None
    max_lag: float = 0.0
    last_received: float | None = None
    batches_applied: int = 0
    events_applied: int = 0
    gaps: int = 0
    replayed: int = 0
    lost: int = 0
    malformed: int = 0
    restarts: int = 0
    silences: int = 0
    clears: int = 0


class _Link:
    """One publisher: its state and its sockets."""

    __slots__ = ("dealer", "last_payload", "monitor", "state", "sub", "suspect")

    def __init__(self, state: InstanceState, sub: Any) -> None:
        self.state = state
        self.sub = sub
        self.dealer: Any = None
        #: ZeroMQ's events of ``sub``: a lost connection is made again, and (with a replay
        #: socket) makes the next batch ``suspect``, checked against the replay (the publisher
        #: may have restarted).
        self.monitor: Any = None
        self.suspect = False
        #: The encoded batch numbered ``state.last_seq``, as it came: a replay that brings back
        #: other bytes under that number comes from a publisher that restarted.
        self.last_payload: bytes | None = None


class EventSubscriber:
    """Applies the KV-event batches of N publishers to an index, recovering lost batches.

    Drive it with ``poll`` / ``run_for`` from your own loop, or ``start`` a background thread
    (then hold ``lock`` while reading the index or the states). Close it (``close`` or a
    ``with`` block) to release its sockets and stop its thread.

    Args:
        index: receives ``apply_batch(instance, batch)`` and ``remove_instance(instance)``.
        publishers: instance name -> endpoint, or -> (endpoint, replay endpoint or None).
        topic: the topic prefix to subscribe to ("" for all).
        silent_after: forget an instance silent for this many seconds (None: never).
        replay_timeout: seconds to wait for a replay answer before counting the batches lost.
        rcvhwm: the SUB sockets' receive high-water mark (past it ZeroMQ drops, and replay
            recovers).
        context: the ZeroMQ context (``zmq.Context.instance()`` when None). Each publisher
            takes up to four of its sockets (SUB, the connection monitor's two, a replay
            DEALER): for hundreds of publishers raise its ``zmq.MAX_SOCKETS`` (1023 by default).
        clock: the wall clock lag is measured with (``time.time``).
        max_message_size: the largest message, in bytes, the sockets accept (ZeroMQ's
            ``MAXMSGSIZE``: a larger one is dropped with the connection that sent it, which
            then reconnects); None for no limit.  64 MiB by default, hundreds of times a
            scheduler step's events.
        max_replay_bytes: the most payload bytes one replay answer is buffered with before it
            is applied (256 MiB by default); the rest of a larger answer is dropped.

    Raises:
        ValueError, TypeError: a bad setting or publisher entry (no socket is left open).
    """

    #: Messages read from one socket per ``poll`` pass, so one busy publisher cannot starve
    #: the others.
    MAX_BATCHES_PER_POLL: int = 1000
    #: How far past the next expected number a batch may be (once one was applied) and still
    #: count as a gap: 2**32 batches take a publisher years; beyond, it is malformed.
    MAX_SEQ_JUMP: int = 1 << 32

    def __init__(
        self,
        index: Any,
        publishers: Mapping[str, str | tuple[str, str | None]] | None = None,
        *,
        topic: str = "",
        silent_after: float | None = None,
        replay_timeout: float = 1.0,
        rcvhwm: int = 100_000,
        context: Any = None,
        clock: Callable[[], float] = time.time,
        max_message_size: int | None = 64 << 20,
        max_replay_bytes: int = 256 << 20,
    ) -> None:
        for method in ("apply_batch", "remove_instance"):
            if not callable(getattr(index, method, None)):
                raise TypeError(f"index must have a {method}() method, got {type(index).__name__}")
        if not isinstance(topic, str):
            raise TypeError(f"topic must be a str, got {type(topic).__name__}")
        if silent_after is not None and not silent_after > 0:
            raise ValueError(f"silent_after must be None or > 0, got {silent_after!r}")
        if not replay_timeout >= 0:
            raise ValueError(f"replay_timeout must be >= 0, got {replay_timeout!r}")
        if not isinstance(rcvhwm, int) or isinstance(rcvhwm, bool) or rcvhwm < 0:
            raise ValueError(f"rcvhwm must be an int >= 0, got {rcvhwm!r}")
        if max_message_size is not None and (not isinstance(max_message_size, int) or isinstance(max_message_size, bool)
                                             or max_message_size < 1):
            raise ValueError(f"max_message_size must be None or an int >= 1, got {max_message_size!r}")
        if not isinstance(max_replay_bytes, int) or isinstance(max_replay_bytes, bool) or max_replay_bytes < 1:
            raise ValueError(f"max_replay_bytes must be an int >= 1, got {max_replay_bytes!r}")
        zmq = import_zmq()
        self._zmq = zmq
        self._ctx = context if context is not None else zmq.Context.instance()
        self.index = index
        self.topic = topic
        self.silent_after = silent_after
        self.replay_timeout = float(replay_timeout)
        self.rcvhwm = rcvhwm
        self.max_message_size = max_message_size
        self.max_replay_bytes = max_replay_bytes
        self._clock = clock
        self._decoder = msgspec.msgpack.Decoder(KVEventBatch)
        self._links: dict[str, _Link] = {}
        self._poller = zmq.Poller()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        #: Held while a batch is applied or an instance forgotten; hold it to read the index
        #: while the background thread runs.
        self.lock = threading.RLock()
        try:
            for instance, where in (publishers or {}).items():
                if isinstance(where, tuple):
                    self.add_publisher(instance, *where)
                else:
                    self.add_publisher(instance, where)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ publishers
    def add_publisher(self, instance: str, endpoint: str, replay_endpoint: str | None = None) -> None:
        """Connect to one more publisher, known in the index as ``instance``.

        Raises:
            TypeError: ``instance`` or an endpoint is not a str.
            ValueError: ``instance`` is known already.
            RuntimeError: the background thread runs.
        """
        self._check_not_running()
        if not isinstance(instance, str):
            raise TypeError(f"instance must be a str, got {type(instance).__name__}")
        if not isinstance(endpoint, str) or not (replay_endpoint is None or isinstance(replay_endpoint, str)):
            raise TypeError("endpoint must be a str and replay_endpoint a str or None")
        if instance in self._links:
            raise ValueError(f"instance {instance!r} is subscribed already")
        zmq = self._zmq
        sub = self._ctx.socket(zmq.SUB)
        try:
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.RCVHWM, self.rcvhwm)
            sub.setsockopt(zmq.MAXMSGSIZE, -1 if self.max_message_size is None else self.max_message_size)
            sub.setsockopt(zmq.SUBSCRIBE, self.topic.encode("utf-8"))
            sub.connect(endpoint)
        except BaseException:
            sub.close(linger=0)
            raise
        link = _Link(InstanceState(instance, endpoint, replay_endpoint), sub)
        try:
            link.monitor = sub.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        except BaseException:
            sub.close(linger=0)
            raise
        self._poller.register(link.monitor, zmq.POLLIN)
        self._links[instance] = link
        self._poller.register(sub, zmq.POLLIN)

    def remove_publisher(self, instance: str) -> None:
        """Disconnect from ``instance`` and forget it in the index.

        Raises:
            KeyError: ``instance`` is not subscribed.
            RuntimeError: the background thread runs.
        """
        self._check_not_running()
        link = self._links.pop(instance)
        self._unregister(link)
        self._close_link(link)
        with self.lock:
            self.index.remove_instance(instance)

    @property
    def states(self) -> dict[str, InstanceState]:
        """A snapshot of every publisher's state, by instance name."""
        with self.lock:
            return {name: dataclasses.replace(link.state) for name, link in self._links.items()}

    def progress(self) -> dict[str, tuple[int | None, float | None]]:
        """Each publisher's ``(last_seq, lag)``, by instance name: what :attr:`states` tells of
        them without copying every state (for a router that samples them at every decision)."""
        with self.lock:
            return {name: (link.state.last_seq, link.state.lag) for name, link in self._links.items()}

    @property
    def stats(self) -> dict[str, float | int]:
        """The counters of ``InstanceState`` summed over the publishers, ``max_lag`` (seconds)
        and ``instances`` (publishers subscribed)."""
        with self.lock:
            states = [link.state for link in self._links.values()]
            out: dict[str, float | int] = {name: sum(getattr(s, name) for s in states) for name in _COUNTERS}
            out["max_lag"] = max((s.max_lag for s in states), default=0.0)
            out["instances"] = len(states)
        return out

    # ------------------------------------------------------------------ driving
    def poll(self, timeout: float = 0.0) -> int:
        """Wait up to ``timeout`` seconds for messages, apply what has come, check silences.

        Returns:
            The number of batches applied (replayed ones included).

        Raises:
            RuntimeError: called from another thread while the background thread runs.
        """
        if self._thread is not None and threading.current_thread() is not self._thread:
            raise RuntimeError("the subscriber's background thread polls; stop() it first")
        applied = 0
        zmq = self._zmq
        if self._links:
            ready = dict(self._poller.poll(max(0, int(timeout * 1000))))
            for link in self._links.values():  # a lost connection first, then what came after it
                if link.monitor is not None and link.monitor in ready:
                    self._read_monitor(link)
            for name, link in list(self._links.items()):
                if link.sub not in ready:
                    continue
                for _ in range(self.MAX_BATCHES_PER_POLL):
                    try:
                        frames = link.sub.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    applied += self._on_message(link, frames)
        elif timeout > 0:
            self._stop.wait(timeout)
        self._check_silences()
        return applied

    def sync(self) -> int:
        """Ask every replay socket for all it holds past what was applied, and apply it.

        A subscriber that joins late gets the publishers' buffered history now rather than at
        their next batch. Returns the batches applied.

        Raises:
            RuntimeError: the background thread runs.
        """
        self._check_not_running()
        applied = 0
        for link in self._links.values():
            last = link.state.last_seq
            applied += self._replay(link, 0 if last is None else last + 1)
        return applied

    def run_for(self, seconds: float) -> int:
        """``poll`` for ``seconds`` (monotonic clock); returns the batches applied."""
        deadline = time.monotonic() + seconds
        applied = 0
        while (left := deadline - time.monotonic()) > 0:
            applied += self.poll(min(left, 0.05))
        return applied

    def start(self) -> None:
        """Poll in a background thread until ``stop`` or ``close``.

        Raises:
            RuntimeError: it runs already.
        """
        self._check_not_running()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="kvcy-kv-events-subscriber", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the background thread (waits for it; at most a replay timeout)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join()

    def close(self) -> None:
        """Stop the thread and close every socket (the index keeps what it holds)."""
        self.stop()
        for link in self._links.values():
            self._unregister(link)
            self._close_link(link)
        self._links.clear()

    def __enter__(self) -> EventSubscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll(0.05)
            except Exception:  # keep serving the other publishers
                logger.exception("KV-event subscriber: poll failed")
                self._stop.wait(0.05)

    def _check_not_running(self) -> None:
        if self._thread is not None:
            raise RuntimeError("stop() the subscriber's thread first")

    def _decode(self, state: InstanceState, frames: list[bytes]) -> tuple[int, Any, bytes] | None:
        """(sequence number, batch, payload) from a message's frames, or None (counted) if malformed."""
        if len(frames) != 3 or len(frames[1]) != 8:
            state.malformed += 1
            return None
        batch = self._decode_payload(state, frames[2])
        if batch is None:
            return None
        return int.from_bytes(frames[1], "big"), batch, frames[2]

    def _decode_payload(self, state: InstanceState, payload: bytes) -> Any:
        """The batch a payload holds, or None (counted malformed).  Any failure to decode is the
        sender's fault, a nesting too deep for the decoder (RecursionError) included; and a
        timestamp that is not finite would make the lag meaningless."""
        try:
            batch = self._decoder.decode(payload)
        except Exception:
            state.malformed += 1
            return None
        if not math.isfinite(batch.ts):
            state.malformed += 1
            return None
        return batch

    def _on_message(self, link: _Link, frames: list[bytes]) -> int:
        state = link.state
        state.last_received = time.monotonic()
        decoded = self._decode(state, frames)
        if decoded is None:
            return 0
        seq, batch, payload = decoded
        if state.last_seq is not None and seq - state.last_seq > self.MAX_SEQ_JUMP:
            state.malformed += 1
            return 0
        applied = 0
        if state.live_seq is not None and seq <= state.live_seq:
            state.restarts += 1
            self._forget(state)
        state.live_seq = seq
        expected = 0 if state.last_seq is None else state.last_seq + 1
        if seq > expected:
            state.gaps += 1
            applied += self._replay(link, expected)
        elif link.suspect and state.last_seq is not None:
            # The first batch since the connection was lost follows on: check the publisher
            # still holds the last batch applied (a restarted one may have reached this number).
            applied += self._replay(link, expected)
        link.suspect = False
        if state.last_seq is None or seq > state.last_seq:  # else: replay applied it already
            applied += self._apply(link, seq, batch, payload)
        return applied

    def _replay(self, link: _Link, start: int) -> int:
        """Ask ``link``'s replay socket for batches from ``start`` on and apply them in order.

        When ``start`` follows the last batch applied, the request starts one earlier, at that
        batch: if the publisher holds other bytes under its number, the publisher restarted
        (and has published past where this subscriber was, or the live stream would have shown
        the numbers going back): the instance is forgotten and rebuilt from the replay.
        """
        state = link.state
        if state.replay_endpoint is None:
            return 0
        check = start - 1 if state.last_seq is not None and start == state.last_seq + 1 \
            and link.last_payload is not None else None
        ask = start if check is None else check
        got, finished = self._ask_replay(link, ask)
        if finished and check is not None \
                and any(seq == check and payload != link.last_payload for seq, payload in got):
            logger.warning("KV-event publisher %s restarted: its batch %d is not the one applied",
                           state.instance, check)
            live = state.live_seq
            state.restarts += 1
            self._forget(state)
            state.live_seq = live
            return self._replay(link, 0)
        return self._apply_replayed(link, got, ask, start)

    def _replay_dealer(self, link: _Link) -> Any:
        """``link``'s socket to its publisher's replay endpoint, made on first use."""
        zmq = self._zmq
        if link.dealer is None:
            link.dealer = self._ctx.socket(zmq.DEALER)
            link.dealer.setsockopt(zmq.LINGER, 0)
            link.dealer.setsockopt(zmq.RCVHWM, 0)  # a whole replay buffer may come back at once
            link.dealer.setsockopt(zmq.MAXMSGSIZE, -1 if self.max_message_size is None else self.max_message_size)
            link.dealer.connect(link.state.replay_endpoint)
        return link.dealer

    def _ask_replay(self, link: _Link, ask: int) -> tuple[list[tuple[int, bytes]], bool]:
        """Ask for the batches from ``ask`` on and collect the answer until its end marker, the
        timeout or ``max_replay_bytes``.

        Returns:
            The ``(number, payload)`` pairs received, kept undecoded until applied (decoded
            batches take several times their bytes, and the answer's size is bounded in bytes),
            and whether the end marker came.
        """
        state = link.state
        zmq = self._zmq
        dealer = self._replay_dealer(link)
        got: list[tuple[int, bytes]] = []
        size = 0
        finished = False
        try:
            dealer.send_multipart((b"", ask.to_bytes(8, "big")), zmq.NOBLOCK)
            deadline = time.monotonic() + self.replay_timeout
            while (left := deadline - time.monotonic()) > 0 and dealer.poll(int(left * 1000) + 1):
                frames = dealer.recv_multipart()
                if frames[:1] != [b""]:
                    state.malformed += 1
                    continue
                if len(frames) == 4 and frames[2] == END_SEQ:
                    finished = True
                    break
                if len(frames) != 4 or len(frames[2]) != 8:
                    state.malformed += 1
                    continue
                size += len(frames[3])
                if size > self.max_replay_bytes:
                    logger.warning("KV-event replay from %s passed %d bytes: the rest is dropped",
                                   state.replay_endpoint, self.max_replay_bytes)
                    break
                got.append((int.from_bytes(frames[2], "big"), frames[3]))
        except zmq.Again:
            pass
        if not finished:
            # A late answer must not end the next replay early: start over with a new socket.
            dealer.close(linger=0)
            link.dealer = None
            logger.warning("KV-event replay from %s got no end marker within %.2f s",
                           state.replay_endpoint, self.replay_timeout)
        return got, finished

    def _apply_replayed(self, link: _Link, got: list[tuple[int, bytes]], ask: int, start: int) -> int:
        """Apply, in order, the replayed batches from ``start`` on that this subscriber lacks.

        What was asked: numbers from ``ask`` up to the live one that caused the request (the
        publisher's buffer holds it), then any consecutive run past it (published since).
        Anything else is no answer to this request: refused and counted malformed.
        """
        state = link.state
        upper = state.live_seq
        reach = upper
        applied = refused = 0
        for seq, payload in sorted(got, key=lambda item: item[0]):
            if seq < ask or (reach is not None and seq > reach + 1) or (
                    state.last_seq is not None and seq - state.last_seq > self.MAX_SEQ_JUMP):
                refused += 1
                continue
            if reach is not None:
                reach = max(reach, seq)
            if seq >= start and (state.last_seq is None or seq > state.last_seq):
                batch = self._decode_payload(state, payload)
                if batch is None:
                    continue
                applied += self._apply(link, seq, batch, payload)
                state.replayed += 1
        if refused:
            state.malformed += refused
            logger.warning("KV-event replay from %s: %d answer(s) numbered outside what was asked, refused",
                           state.replay_endpoint, refused)
        return applied

    def _apply(self, link: _Link, seq: int, batch: Any, payload: bytes) -> int:
        state = link.state
        link.last_payload = payload
        expected = 0 if state.last_seq is None else state.last_seq + 1
        with self.lock:
            try:
                self.index.apply_batch(state.instance, batch)
            except (ValueError, TypeError):
                logger.exception("KV-event batch %d of %s refused by the index", seq, state.instance)
                state.malformed += 1
                applied = 0
            else:
                state.batches_applied += 1
                state.events_applied += len(batch.events)
                # The decoder makes events of the three exact classes: counting their types in C is
                # exact and a few times cheaper than a generator of isinstance calls per event.
                state.clears += [*map(type, batch.events)].count(AllBlocksCleared)
                state.last_ts = batch.ts
                state.lag = self._clock() - batch.ts
                state.max_lag = max(state.max_lag, state.lag)
                applied = 1
            state.lost += seq - expected
            state.last_seq = seq
        return applied

    def _forget(self, state: InstanceState) -> None:
        with self.lock:
            self.index.remove_instance(state.instance)
            state.last_seq = state.live_seq = None
        link = self._links.get(state.instance)
        if link is not None:
            link.last_payload = None
            link.suspect = False

    def _check_silences(self) -> None:
        if self.silent_after is None:
            return
        now = time.monotonic()
        for link in self._links.values():
            state = link.state
            if state.last_received is not None and now - state.last_received > self.silent_after:
                state.silences += 1
                state.last_received = None
                self._forget(state)

    def _read_monitor(self, link: _Link) -> None:
        from zmq.utils.monitor import recv_monitor_message

        zmq = self._zmq
        while True:
            try:
                event = recv_monitor_message(link.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if event["event"] == zmq.EVENT_DISCONNECTED:
                link.suspect = link.state.replay_endpoint is not None
                # ZeroMQ does not reconnect after a protocol error, a message over
                # MAXMSGSIZE included: connect again, or this publisher is never heard again.
                try:
                    link.sub.disconnect(link.state.endpoint)
                except zmq.ZMQError:
                    pass
                link.sub.connect(link.state.endpoint)

    def _unregister(self, link: _Link) -> None:
        self._poller.unregister(link.sub)
        if link.monitor is not None:
            self._poller.unregister(link.monitor)

    @staticmethod
    def _close_link(link: _Link) -> None:
        if link.monitor is not None:
            link.sub.disable_monitor()
            link.monitor.close(linger=0)
            link.monitor = None
        link.sub.close(linger=0)
        if link.dealer is not None:
            link.dealer.close(linger=0)
            link.dealer = None
