"""The pieces ``delay_many`` builds each call from, held to what Celery and the stdlib make:
the ``argsrepr`` fast path is exactly ``saferepr``, an id is a canonical version-4 UUID, and the
lazy result set hands out the ids it was made with. No Redis needed."""

from __future__ import annotations

import uuid

from celery import Celery
from celery.utils.saferepr import saferepr
from hypothesis import example, given
from hypothesis import strategies as st

from sluice.ids import new_id
from sluice.tasks.bulk import BulkResult, args_repr

scalars = st.one_of(st.integers(), st.floats(), st.booleans(), st.none(), st.text(max_size=40),
                    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=40),
                    st.text(alphabet="a '\"\\\n", max_size=6))  # the characters repr and saferepr treat apart
arguments = st.one_of(st.tuples(), st.lists(scalars, max_size=8).map(tuple),
                      st.lists(st.one_of(scalars, st.lists(scalars, max_size=3), st.dictionaries(st.text(max_size=5), scalars, max_size=3)),
                               max_size=4).map(tuple))


@given(arguments, st.sampled_from([8, 40, 1024, None]), st.sampled_from([0, 1, 3]))
@example(("it's",), 1024, 3)
@example(("a\\b",), 1024, 3)
@example(('say "hi"',), 1024, 3)
@example(("a\nb",), 1024, 3)
@example(("é",), 1024, 3)
@example((1, 2.5, True, None, "abc"), 1024, 3)
@example(("x" * 30,), 20, 3)
def test_args_repr_is_celerys_saferepr_for_any_arguments(args: tuple, maxlen: int | None, maxlevels: int) -> None:
    """Whatever the arguments (numbers, None, any text, nested lists and dicts) and however short
    the limit, the header delay_many writes is the one apply_async would (Celery's saferepr)."""
    assert args_repr(args, maxlen, maxlevels) == saferepr(args, maxlen, maxlevels=maxlevels)


def test_new_id_is_a_random_version_4_uuid_in_canonical_form() -> None:
    """Each id parses as an RFC 4122 version-4 UUID whose canonical text is the id itself, and
    10,000 of them are all different."""
    ids = [new_id() for _ in range(10_000)]
    for text in ids[:500]:
        parsed = uuid.UUID(text)
        assert (parsed.version, parsed.variant, str(parsed)) == (4, uuid.RFC_4122, text)
    assert len(set(ids)) == len(ids)


def test_a_bulk_result_gives_its_ids_without_making_results_and_the_same_ids_after() -> None:
    """``ids`` and ``len`` need no AsyncResult; ``results`` makes one per id, in order, once."""
    app = Celery(set_as_current=False)
    ids = [new_id() for _ in range(3)]
    bulk = BulkResult(ids, app=app)
    assert bulk.ids == ids and len(bulk) == 3 and bulk._results is None
    results = bulk.results
    assert [r.id for r in results] == ids and bulk.results is results and bulk.ids == ids
