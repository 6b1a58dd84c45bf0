"""A pool's account, on data (issue 23.2): the rule, and any interleaving of provisioning,
writes, expansion, deletion and failed allocations against a simulated filesystem."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from localpv.csi.account import Account, Promise, Space, Terms, open_account, strictest

GiB = 1 << 30
MiB = 1 << 20


def account(capacity: int, free: int, *promises: Promise, overcommit: float = 1.0, reserved: int = 0) -> Account:
    return open_account(Space(capacity, free), Terms(overcommit, reserved), promises)


def test_a_thick_image_must_fit_what_thin_images_were_promised() -> None:
    """10 GiB pool, a thin image of 8 GiB with 1 GiB written: 9 GiB free, but 7 are promised.
    With overcommit 1.5 the bound (15 GiB) would take a 3 GiB thick image; the thin tenant's
    unwritten 7 GiB would not fit next to it."""
    a = account(10 * GiB, 9 * GiB, Promise(8 * GiB, allocated=GiB), overcommit=1.5)
    assert a.refusal(2 * GiB, thick=True, pool="p") is None
    why = a.refusal(3 * GiB, thick=True, pool="p")
    assert why is not None and "kept for what other images were promised" in why
    assert a.largest(thick=True) == 2 * GiB
    assert a.refusal(3 * GiB, thick=False, pool="p") is None  # a thin one is a promise, not blocks
    strict = account(10 * GiB, 9 * GiB, Promise(8 * GiB, allocated=GiB))
    assert "does not fit" in str(strict.refusal(3 * GiB, thick=True, pool="p"))


def test_reserved_is_never_promised_nor_allocated() -> None:
    a = account(10 * GiB, 10 * GiB, reserved=GiB)
    assert a.bound == 9 * GiB and a.largest(thick=True) == 9 * GiB and a.largest(thick=False) == 9 * GiB
    assert a.refusal(9 * GiB + 1, thick=False, pool="p") is not None
    assert a.refusal(9 * GiB + 1, thick=True, pool="p") is not None
    full = account(10 * GiB, GiB, reserved=GiB)
    assert "at or below its 1.00 GiB reserved" in str(full.refusal(MiB, thick=False, pool="p"))


def test_overcommit_leaves_its_overcommitted_part_unbacked_by_design() -> None:
    """Over-commit 2: thin promises of 15 GiB on 10 GiB, 1 GiB written. 5 GiB of them are
    over-committed (unbacked by choice); the other 9 GiB unwritten stay free for them."""
    a = account(10 * GiB, 9 * GiB, Promise(15 * GiB, allocated=GiB), overcommit=2)
    assert a.overcommitted == 5 * GiB and a.backing == 9 * GiB
    assert a.largest(thick=True) == 0
    assert a.refusal(5 * GiB, thick=False, pool="p") is None
    assert a.refusal(5 * GiB + 1, thick=False, pool="p") is not None


def test_an_expansion_replaces_its_promise_and_a_thick_one_needs_only_what_it_does_not_hold() -> None:
    thick = Promise(4 * GiB, thick=True, allocated=4 * GiB)
    a = account(10 * GiB, 6 * GiB, thick)
    assert a.refusal(10 * GiB, thick=True, pool="p", holds=thick) is None
    assert a.refusal(10 * GiB + MiB, thick=True, pool="p", holds=thick) is not None
    # A failed earlier attempt left the file partly allocated: the real allocation counts.
    partly = Promise(4 * GiB, thick=True, allocated=5 * GiB)
    assert account(10 * GiB, 5 * GiB, partly).refusal(10 * GiB, thick=True, pool="p", holds=partly) is None


def test_a_thick_image_being_made_keeps_its_room_before_its_blocks_are_taken() -> None:
    """Two thick claims at once: the first is recorded (its fallocate not done yet); the free
    space does not show it, the account does."""
    making = Promise(6 * GiB, thick=True, allocated=0)
    a = account(10 * GiB, 10 * GiB, making, overcommit=2)
    assert a.pending == 6 * GiB and a.largest(thick=True) == 4 * GiB
    assert a.refusal(5 * GiB, thick=True, pool="p") is not None


def test_pools_on_one_filesystem_follow_the_strictest_terms() -> None:
    assert strictest([Terms(3, 0), Terms(1.5, GiB)]) == Terms(1.5, GiB)
    assert strictest([]) == Terms()


# ---------------------------------------------------------------- any interleaving


@dataclass
class Filesystem:
    """A filesystem the account is asked about: images take blocks as they are allocated or
    written; nothing else is on it."""

    capacity: int
    images: dict[int, Promise] = field(default_factory=dict)

    @property
    def free(self) -> int:
        return self.capacity - sum(p.allocated for p in self.images.values())

    def account(self, terms: Terms) -> Account:
        return open_account(Space(self.capacity, self.free), terms, self.images.values())


sizes = st.integers(min_value=1, max_value=40).map(lambda n: n * 256 * MiB)
ops = st.lists(st.one_of(
    st.tuples(st.just("provision"), sizes, st.booleans()),
    st.tuples(st.just("write"), st.integers(0, 50), sizes),
    st.tuples(st.just("expand"), st.integers(0, 50), sizes),
    st.tuples(st.just("delete"), st.integers(0, 50), st.just(0)),
    st.tuples(st.just("fail"), sizes, st.booleans()),
), max_size=60)


@settings(max_examples=400, deadline=None)
@given(ops=ops, overcommit=st.sampled_from([1.0, 1.5, 2.0, 5.0]), reserved=st.sampled_from([0, GiB, 3 * GiB]))
def test_no_interleaving_promises_beyond_the_bound_or_lets_thick_eat_thin_promises(
        ops: list[tuple[str, int, bool | int]], overcommit: float, reserved: int) -> None:
    terms = Terms(overcommit, reserved)
    fs = Filesystem(capacity=20 * GiB)
    made = 0
    for op, a, b in ops:
        ids = sorted(fs.images)
        if op in ("provision", "fail"):
            size, thick = a, bool(b)
            if fs.account(terms).refusal(size, thick=thick, pool="p") is not None:
                continue
            if op == "fail":  # the allocation failed after the check: nothing is kept
                continue
            assert not thick or size <= fs.free, "a thick image the account accepted must be allocatable"
            fs.images[made] = Promise(size, thick, size if thick else 0)
            made += 1
        elif not ids:
            continue
        elif op == "write":  # a thin tenant writes: blocks as long as the filesystem has them
            key = ids[a % len(ids)]
            p = fs.images[key]
            if not p.thick:
                fs.images[key] = Promise(p.size, False, p.allocated + min(int(b), p.unwritten, fs.free))
        elif op == "expand":
            key = ids[a % len(ids)]
            p = fs.images[key]
            new = p.size + int(b)
            if fs.account(terms).refusal(new, thick=p.thick, pool="p", holds=p) is None:
                assert not p.thick or new - p.allocated <= fs.free
                fs.images[key] = Promise(new, p.thick, new if p.thick else p.allocated)
        elif op == "delete":
            del fs.images[ids[a % len(ids)]]
        now = fs.account(terms)
        assert now.promised <= now.bound, "never promise more than overcommit x size - reserved"
        if overcommit == 1.0:
            # Every promise backed: whatever thin tenants were promised, they can still write.
            assert fs.free >= now.unwritten, "thick allocations must not eat thin promises"
