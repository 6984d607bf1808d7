"""Slices of the fixture-wide tests for the suite: a test that repeats the same check over every
fixture runs on every `step`-th one (in the fixtures' order, starting at `offset`), unless
PORTER_TEST_EVERY_FIXTURE=1, which runs them all (before changing what such a test checks, and in
benchmarks). Two checks of the same kind (two runs of each fixture on XLA) take complementary
slices (`fixture_rest`), so every fixture is still run by one of them."""
from __future__ import annotations

import os
from typing import Sequence, TypeVar

T = TypeVar("T")


def fixture_slice(items: Sequence[T], step: int, offset: int = 0) -> list[T]:
    if os.environ.get("PORTER_TEST_EVERY_FIXTURE") == "1":
        return list(items)
    return list(items[offset::step])


def fixture_rest(items: Sequence[T], step: int, offset: int = 0) -> list[T]:
    """What `fixture_slice(items, step, offset)` leaves out (everything with
    PORTER_TEST_EVERY_FIXTURE=1)."""
    if os.environ.get("PORTER_TEST_EVERY_FIXTURE") == "1":
        return list(items)
    return [item for i, item in enumerate(items) if i % step != offset % step]


def every_lane(items: Sequence[T]) -> list[T]:
    """Cases only the every-fixture lane runs (PORTER_TEST_EVERY_FIXTURE=1): the costliest of a
    check that cheaper cases of the same class already make in every run."""
    return list(items) if os.environ.get("PORTER_TEST_EVERY_FIXTURE") == "1" else []
