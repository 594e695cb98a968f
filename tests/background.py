"""Real simulations a test module needs, started two at a time as the module starts.

A short simulation is mostly start-up (SuperLink, Ray, every process importing PyTorch), and
much of that waits rather than computes, so two runs side by side on the 2-core CI machine
finish well before the same two one after the other (docs/PERFORMANCE.md, "Start-up of a
short run"). Each run stays a separate `fedapps run` with its own SuperLink and Ray: what a
test asserts does not change, independent runs only overlap. A run's error reaches the test
that asks for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest

SIDE_BY_SIDE = 2  # the CI machine's cores: more only queue for them


class Runs:
    """Futures of named runs; `runs[key]` waits for one (starting it if nobody asked yet)."""

    def __init__(self, start: Callable[[str], Any], keys: Iterable[str],
                 workers: int = SIDE_BY_SIDE) -> None:
        self._start = start
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sim")
        self._futures: dict[str, Future] = {}
        for key in keys:
            self._submit(key)

    def _submit(self, key: str) -> Future:
        if key not in self._futures:
            self._futures[key] = self._pool.submit(self._start, key)
        return self._futures[key]

    def __getitem__(self, key: str) -> Any:
        return self._submit(key).result()

    def close(self) -> None:
        """Drop runs no test reached (a failure stopped the module) and wait for those
        running, so no simulation outlives its module."""
        self._pool.shutdown(wait=True, cancel_futures=True)


@contextmanager
def beside(run: Callable[[], Any]) -> Iterator[Callable[[], Any]]:
    """`run()` in the background while the block runs (one test's reference run beside the run
    it checks); the yielded `result()` waits for it and raises its error. Leaving the block
    waits for it too, so it never outlives the test."""
    started = Runs(lambda _: run(), ["run"], workers=1)
    try:
        yield lambda: started["run"]
    finally:
        started.close()


Needs = Callable[[pytest.Item], list[str]] | dict[str, list[str]]


def selected_keys(request: pytest.FixtureRequest, needs: Needs) -> list[str]:
    """The runs the module's selected tests need, in test order (`-k` starts no others).
    `needs`: test function name -> run keys, or a function of the test item."""
    def keys_of(item: pytest.Item) -> list[str]:
        return needs.get(item.originalname, []) if isinstance(needs, dict) else needs(item)

    items = [i for i in request.session.items if i.module is request.module]
    return list(dict.fromkeys(key for item in items for key in keys_of(item)))


def simulations(runs: dict[str, tuple[str, ...]], needs: Needs,
                run: Callable[..., tuple[Any, Any]]) -> Callable:
    """A module-scoped fixture: `sims[key]` is (output root, process, results.json) of
    `run(root, experiment, key, *sets)` for runs[key] = (experiment, *sets)."""

    @pytest.fixture(scope="module")
    def sims(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
        root = tmp_path_factory.mktemp("sim")
        started = Runs(lambda key: (root, *run(root, runs[key][0], key, *runs[key][1:])),
                       selected_keys(request, needs))
        yield started
        started.close()

    return sims
