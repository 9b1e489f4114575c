"""The free-block queue on its own: order, membership, ownership, against both twins.

The compiled queue keeps its blocks in an array indexed by position (removal
from the middle leaves a hole; the array grows, wraps around and squeezes
holes out), and a block only records the queue and position it was last put
at.  These tests drive the queue through what exercises that: removal
anywhere, batches at both ends, growth past the first array, blocks moving
between queues, blocks with duplicate or negative ids, and teardown.
"""

from __future__ import annotations

import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def ids(blocks):
    return [b.block_id for b in blocks]


def assert_queue_is(q, model, loose=()):
    """``q`` holds exactly ``model`` (identity, in order) and its links agree."""
    got = q.get_all_free_blocks()
    assert len(got) == len(model) and all(a is b for a, b in zip(got, model))
    assert q.num_free_blocks == len(q) == len(model)
    head, tail = q.fake_free_list_head, q.fake_free_list_tail
    chain = [head, *model, tail]
    assert head.prev_free_block is None and tail.next_free_block is None
    for before, block, after in zip(chain, chain[1:], chain[2:]):
        assert block.prev_free_block is before and block.next_free_block is after
    assert head.next_free_block is chain[1] and tail.prev_free_block is chain[-2]
    for block in loose:
        assert block.prev_free_block is None and block.next_free_block is None


SUPPRESS = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]


@settings(max_examples=80, deadline=None, suppress_health_check=SUPPRESS)
@given(data=st.data())
def test_queue_matches_a_list_model(impl, data):
    """Random operations on two queues sharing a set of blocks behave like two lists."""
    m = impl.kv_cache
    # Duplicate and negative ids on purpose: the queue must go by identity.
    blocks = [m.KVCacheBlock(i % 7 - 3) for i in range(40)]
    queues = [m.FreeKVCacheBlockQueue(blocks[:20]), m.FreeKVCacheBlockQueue([])]
    models = [list(blocks[:20]), []]
    fake_ends = [e for q in queues for e in (q.fake_free_list_head, q.fake_free_list_tail)]

    def queued(block):
        return any(block is b for model in models for b in model)

    for _ in range(data.draw(st.integers(1, 60), label="steps")):
        k = data.draw(st.integers(0, 1), label="queue")
        q, model = queues[k], models[k]
        op = data.draw(st.sampled_from(["popleft", "popleft_n", "remove", "append", "append_n", "prepend_n"]))
        if op == "popleft":
            if model:
                assert q.popleft() is model.pop(0)
            else:
                with pytest.raises(ValueError, match="No free blocks available"):
                    q.popleft()
        elif op == "popleft_n":
            n = data.draw(st.integers(0, len(model) + 2), label="n")
            if n <= len(model):
                got = q.popleft_n(n)
                assert len(got) == n and all(a is b for a, b in zip(got, model[:n]))
                del model[:n]
            else:
                with pytest.raises(AssertionError, match="Cannot pop"):  # (vLLM asserts)
                    q.popleft_n(n)
        elif op == "remove":
            # A block of this queue, or one in no queue (removing another
            # queue's block is a caller bug the twins treat differently).
            candidates = model + [b for b in blocks if not queued(b)] + fake_ends
            block = data.draw(st.sampled_from(candidates), label="block")
            if any(block is b for b in model):
                q.remove(block)
                model[:] = [b for b in model if b is not block]
            else:
                with pytest.raises(RuntimeError, match="invalid block"):
                    q.remove(block)
        elif op == "append":
            block = data.draw(st.sampled_from(blocks + fake_ends), label="block")
            if queued(block) or any(block is e for e in fake_ends):
                with pytest.raises(RuntimeError, match="already in the free queue"):
                    q.append(block)
            else:
                q.append(block)
                model.append(block)
        else:
            batch = data.draw(st.lists(st.sampled_from(blocks + fake_ends), max_size=12), label="batch")
            expected = None
            for i, block in enumerate(batch):
                if any(block is e for e in fake_ends):
                    # (the pure twin calls an empty queue's own fake tail a repeat)
                    expected = "already in the free queue|appears twice in one batch"
                elif queued(block):
                    expected = "already in the free queue"
                elif any(block is b for b in batch[:i]):
                    expected = "appears twice in one batch"
                if expected:
                    break
            if expected:
                with pytest.raises(RuntimeError, match=expected):
                    getattr(q, op)(batch)
            else:
                getattr(q, op)(batch)
                model[:] = model + batch if op == "append_n" else batch + model
        for q_, model_ in zip(queues, models):
            assert_queue_is(q_, model_, loose=[b for b in blocks if not queued(b)])


def test_rotation_through_a_large_queue(impl):
    """Popping at the head and refilling the tail, round and round, keeps the order."""
    m = impl.kv_cache
    blocks = [m.KVCacheBlock(i) for i in range(1000)]
    q = m.FreeKVCacheBlockQueue(blocks)
    expected = list(blocks)
    for step in range(40):
        n = 97 + step  # not a divisor of the queue or array size
        got = q.popleft_n(n)
        assert got == expected[:n]
        q.append_n(got)
        expected = expected[n:] + got
    q.remove(expected[500])  # a hole in the middle, then pops across it
    del expected[500]
    for _ in range(12):
        got = q.popleft_n(90)
        assert got == expected[:90]
        q.append_n(got)
        expected = expected[90:] + got
    assert_queue_is(q, expected)


def test_holes_are_skipped_and_squeezed_out(impl):
    """Many removals from the middle, then batches that need the room the holes take."""
    m = impl.kv_cache
    blocks = [m.KVCacheBlock(i) for i in range(96)]
    q = m.FreeKVCacheBlockQueue(blocks[:32])
    expected = list(blocks[:32])
    for b in blocks[1:31]:
        if b.block_id % 4:
            q.remove(b)
            expected.remove(b)
    assert_queue_is(q, expected)
    q.append_n(blocks[32:64])  # more than the free room unless the holes go
    q.prepend_n(blocks[64:96])  # and at the other end
    expected = blocks[64:96] + expected + blocks[32:64]
    assert_queue_is(q, expected)
    for b in expected[::3]:
        q.remove(b)
    expected = [b for i, b in enumerate(expected) if i % 3]
    assert q.popleft_n(len(expected)) == expected
    assert_queue_is(q, [], loose=blocks)


def test_block_moves_between_queues(impl):
    m = impl.kv_cache
    a, b, c = (m.KVCacheBlock(i) for i in range(3))
    q1 = m.FreeKVCacheBlockQueue([a, b, c])
    q2 = m.FreeKVCacheBlockQueue([])
    with pytest.raises(RuntimeError, match="already in the free queue"):
        q2.append(b)  # still in q1
    with pytest.raises(RuntimeError, match="already in the free queue"):
        q2.prepend_n([c])
    q1.remove(b)
    q2.append(b)
    assert_queue_is(q1, [a, c])
    assert_queue_is(q2, [b])
    moved = q1.popleft_n(2)
    assert_queue_is(q1, [], loose=[a, c])
    q2.prepend_n(moved)
    assert_queue_is(q2, [a, c, b])
    q1.append_n(q2.popleft_n(3))  # and back
    assert_queue_is(q1, [a, c, b])
    assert_queue_is(q2, [])
    with pytest.raises(RuntimeError, match="already in the free queue"):
        q2.append(q1.fake_free_list_head)  # another live queue's fake end


def test_duplicate_and_negative_block_ids(impl):
    """Block ids are the caller's business: equal or negative ids are distinct blocks."""
    m = impl.kv_cache
    blocks = [m.KVCacheBlock(i) for i in (5, 5, -3, -1, 5, -1)]
    q = m.FreeKVCacheBlockQueue(blocks)
    assert ids(q.get_all_free_blocks()) == [5, 5, -3, -1, 5, -1]
    q.remove(blocks[1])
    q.remove(blocks[3])
    assert_queue_is(q, [blocks[0], blocks[2], blocks[4], blocks[5]], loose=[blocks[1], blocks[3]])
    q.prepend_n([blocks[3], blocks[1]])
    assert q.popleft() is blocks[3] and q.popleft() is blocks[1]
    with pytest.raises(RuntimeError, match="appears twice"):
        q.prepend_n([blocks[1], blocks[3], blocks[1]])
    assert_queue_is(q, [blocks[0], blocks[2], blocks[4], blocks[5]], loose=[blocks[1], blocks[3]])


def test_block_subclasses_are_blocks(impl):
    m = impl.kv_cache

    class Tagged(m.KVCacheBlock):
        pass

    blocks = [Tagged(0), m.KVCacheBlock(1), Tagged(2)]
    q = m.FreeKVCacheBlockQueue(blocks)
    assert q.popleft_n(3) == blocks
    q.prepend_n(blocks)
    assert_queue_is(q, blocks)
    pool = m.BlockPool(4, enable_caching=True, hash_block_size=4)
    got = pool.get_new_blocks(1)
    pool.free_blocks(got)
    assert pool.get_num_free_blocks() == 3


# --------------------------------------------------------------------------- compiled twin only
@pytest.fixture
def cy(impl):
    if impl.name != "cython":
        pytest.skip("reference ownership and memory safety of the compiled queue")
    return impl.kv_cache


def refcounts(blocks):
    return [sys.getrefcount(b) for b in blocks]


def test_teardown_releases_every_reference(cy):
    blocks = [cy.KVCacheBlock(i) for i in range(50)]
    before = refcounts(blocks)
    q = cy.FreeKVCacheBlockQueue(blocks[:40])
    q.append_n(blocks[40:])
    q.remove(blocks[10])  # a hole
    q.remove(blocks[0])  # and one at the head
    held = q.popleft_n(5)  # handed to the caller
    assert refcounts(blocks)[12:40] == [r + 1 for r in before[12:40]]
    head = q.fake_free_list_head
    del q
    assert head.next_free_block is None
    assert all(b.prev_free_block is None and b.next_free_block is None for b in blocks)
    assert refcounts(blocks)[1:6] == [r + 1 for r in before[1:6]]  # the caller's list's
    assert refcounts(blocks)[6:] == before[6:]
    del held
    assert refcounts(blocks) == before
    q2 = cy.FreeKVCacheBlockQueue(blocks)  # the blocks can be queued again
    assert q2.get_all_free_blocks() == blocks


def test_failed_batches_and_frees_keep_reference_counts(cy):
    pool = cy.BlockPool(8, enable_caching=True, hash_block_size=4)
    blocks = pool.get_new_blocks(3)
    before = refcounts(pool.blocks)
    with pytest.raises(TypeError):
        pool.free_blocks([blocks[0], blocks[1], "x"])
    with pytest.raises(RuntimeError):
        pool.free_blocks([blocks[2], blocks[2]])
    q = cy.FreeKVCacheBlockQueue([])
    loose = cy.KVCacheBlock(100)  # free, in no queue: taken, then given back
    with pytest.raises(RuntimeError, match="already in the free queue"):
        q.append_n([loose, pool.free_block_queue.get_all_free_blocks()[0]])
    with pytest.raises(RuntimeError, match="only free blocks are queued"):
        q.append_n([loose, blocks[0]])
    assert q.num_free_blocks == 0 and sys.getrefcount(loose) == 2
    assert refcounts(pool.blocks) == before
    assert [b.ref_cnt for b in blocks] == [1, 1, 1]


def test_objects_lying_about_their_class_are_refused(cy):
    class Impostor:
        __class__ = property(lambda self: cy.KVCacheBlock)

    fake = Impostor()
    assert isinstance(fake, cy.KVCacheBlock)  # isinstance believes it; the queue must not
    q = cy.FreeKVCacheBlockQueue([cy.KVCacheBlock(0)])
    with pytest.raises(TypeError, match="KVCacheBlock"):
        q.append_n([fake])
    pool = cy.BlockPool(4, enable_caching=True, hash_block_size=4)
    got = pool.get_new_blocks(1)
    with pytest.raises(TypeError, match="KVCacheBlock"):
        pool.free_blocks([got[0], fake])
    assert got[0].ref_cnt == 1 and pool.get_num_free_blocks() == 2
    assert ids(q.get_all_free_blocks()) == [0]


def test_bad_arguments_raise_instead_of_crashing(cy):
    q = cy.FreeKVCacheBlockQueue([cy.KVCacheBlock(0), cy.KVCacheBlock(1)])
    for call in (q.append, q.remove, q.append_n, q.prepend_n, cy.FreeKVCacheBlockQueue):
        with pytest.raises(TypeError):
            call(None)
    other = cy.FreeKVCacheBlockQueue([cy.KVCacheBlock(2)])
    with pytest.raises(RuntimeError, match="invalid block"):
        q.remove(other.get_all_free_blocks()[0])  # another queue's block
    assert len(other) == 1 and len(q) == 2
    q.num_free_blocks = 5  # public, as in vLLM; the array is what counts
    with pytest.raises(RuntimeError, match="holds 2 blocks"):
        q.popleft_n(4)
    q.num_free_blocks = 2
    assert ids(q.popleft_n(2)) == [0, 1]


def test_reinitialising_a_queued_block_keeps_it_queued(cy):
    blocks = [cy.KVCacheBlock(i) for i in range(3)]
    q = cy.FreeKVCacheBlockQueue(blocks)
    blocks[1].__init__(7)
    assert_queue_is(q, blocks)
    assert ids(q.popleft_n(3)) == [0, 7, 2]


def test_many_short_lived_queues(cy):
    blocks = [cy.KVCacheBlock(i) for i in range(8)]
    for _ in range(2000):
        q = cy.FreeKVCacheBlockQueue(blocks)
        assert q.popleft() is blocks[0]
        assert blocks[1].prev_free_block is q.fake_free_list_head
        del q
        assert all(b.prev_free_block is None for b in blocks)
