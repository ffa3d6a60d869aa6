"""The breadth-first search both checkers run: levels, forked processes, the first violation.

A checker supplies a `Search`: how to expand a batch of its nodes (a path of actions to replay,
or a state as a value) into their successors, each with the key that says which states are the
same. This module does the rest, the same way for both: every node is kept with its parent and
the action that reached it; a level is expanded in frontier order, in this process or in
processes forked for it (which inherit every node and key: nothing is sent but what they find);
the first violation in breadth-first order is the one reported, whatever the number of
processes, so it is a shortest one.
"""

from __future__ import annotations

import gc
import multiprocessing
import multiprocessing.pool
import signal
import time
from collections import Counter
from collections.abc import Callable, Generator
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

Action = tuple[Any, ...]


@dataclass
class Expansion:
    """What expanding a batch of nodes found."""

    transitions: int = 0
    hits: dict[tuple[str, str, int], int] = field(default_factory=dict)  # spec steps taken
    edges: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # ordering edges found
    found: list[tuple[Any, Any, int, Action]] = field(default_factory=list)  # key, node, parent, action
    violation: tuple[int, Action, str, str] | None = None  # parent, action, error, what caught it


class Search(Protocol):
    #: nodes per expansion (in this process; at most this many per chunk a forked process takes)
    batch: int
    #: whether the garbage collector runs during the search (off where nothing makes a cycle:
    #: a collection would walk every node kept, again and again)
    collects: bool

    def expand(self, batch: list[tuple[int, Any]], known: set[Any]) -> Expansion:
        """Take every enabled action from each (index, node), checking each step; report each
        successor whose key `known` lacks (adding it), and stop at the first violation."""
        ...


@dataclass
class Outcome:
    states: int = 0  # distinct states reached, the root's included
    transitions: int = 0
    depth: int = 0  # levels that reached a new state (or the violation)
    exhaustive: bool = False  # no violation, and no new state left within the depth
    seconds: float = 0.0
    violation: tuple[list[Action], str, str] | None = None  # path, error, what caught it
    hits: dict[tuple[str, str, int], int] = field(default_factory=dict)
    edges: Counter[tuple[str, str, str]] = field(default_factory=Counter)


#: frontier nodes per process below which a level is expanded here, unforked
FORK_AT = 16


def explore(
    search: Search,
    root: Any,
    root_key: Any,
    *,
    depth: int | None,
    jobs: int = 1,
    progress: Callable[[int, int, int], None] | None = None,
) -> Outcome:
    """Breadth first from `root`, at most `depth` levels (None: until no new state), in `jobs`
    processes. `progress(states, transitions, level)` is called after each expansion."""
    out = Outcome()
    start = time.perf_counter()
    nodes: list[Any] = [root]
    parents: list[tuple[int, Action | None]] = [(-1, None)]
    # every key reached: expanded here, `expand` adds each as it finds it (so all it reports are
    # new); in forked processes each adds to its own copy, and here the repeats are dropped
    seen: set[Any] = {root_key}
    frontier = [0]
    collecting = gc.isenabled()
    if not search.collects:
        gc.disable()
    try:
        level = 0
        while frontier and (depth is None or level < depth):
            next_frontier: list[int] = []
            forked = jobs > 1 and len(frontier) >= FORK_AT * jobs
            # closed at the level's end (even at a violation): its forked processes end with it
            with closing(_expansions(search, nodes, frontier, seen, jobs if forked else 1)) as expansions:
                for expansion in expansions:
                    out.transitions += expansion.transitions
                    for key, value in expansion.hits.items():
                        out.hits[key] = out.hits.get(key, 0) + value
                    out.edges.update(expansion.edges)
                    for key, node, parent, action in expansion.found:
                        if forked:  # a process knows what it found, not what the others did
                            size = len(seen)
                            seen.add(key)
                            if len(seen) == size:
                                continue
                        next_frontier.append(len(nodes))
                        nodes.append(node)
                        parents.append((parent, action))
                    if expansion.violation is not None:
                        parent, action, error, kill = expansion.violation
                        out.violation = ([*path_to(parents, parent), action], error, kill)
                        break
                    if progress is not None:
                        progress(len(nodes), out.transitions, level + 1)
            level += 1
            out.depth = level if next_frontier or out.violation else level - 1
            if out.violation is not None:
                break
            frontier = next_frontier
        out.exhaustive = out.violation is None and not frontier
    finally:
        if collecting:
            gc.enable()
    out.states = len(nodes)
    out.seconds = time.perf_counter() - start
    return out


def path_to(parents: list[tuple[int, Action | None]], index: int) -> list[Action]:
    """The actions from the root to node `index`."""
    path: list[Action] = []
    while index > 0:
        index, action = parents[index]
        assert action is not None
        path.append(action)
    return path[::-1]


class _Level:
    """What the processes forked for one level inherit (fork: copied on write, never sent): the
    search, every node so far, the level's frontier (indices into them) and the keys seen."""

    search: ClassVar[Search]
    nodes: ClassVar[list[Any]]
    frontier: ClassVar[list[int]]
    known: ClassVar[set[Any]]  # the keys seen before the fork, then those this process found

    @classmethod
    def run(cls, chunk: tuple[int, int]) -> Expansion:
        nodes = cls.nodes
        return cls.search.expand([(i, nodes[i]) for i in cls.frontier[chunk[0] : chunk[1]]], cls.known)


def _expansions(
    search: Search, nodes: list[Any], frontier: list[int], seen: set[Any], jobs: int
) -> Generator[Expansion, None, None]:
    """The level's expansions, in frontier order (so the first violation is the one a single
    process finds). With `jobs`, by processes forked for this level, which inherit the nodes."""
    if jobs == 1:
        for i in range(0, len(frontier), search.batch):
            yield search.expand([(k, nodes[k]) for k in frontier[i : i + search.batch]], seen)
        return
    _Level.search, _Level.nodes, _Level.frontier, _Level.known = search, nodes, frontier, seen
    size = max(1, min(search.batch, len(frontier) // (jobs * 8)))
    pool = fork_pool(jobs)
    try:
        yield from pool.imap(_Level.run, [(i, i + size) for i in range(0, len(frontier), size)])
    finally:
        pool.terminate()
        _Level.nodes, _Level.frontier, _Level.known = [], [], set()  # not kept after the search


def fork_pool(
    jobs: int, initializer: Callable[..., object] | None = None, initargs: tuple[Any, ...] = ()
) -> multiprocessing.pool.Pool:
    """`jobs` processes forked from this one (they inherit its state: nothing is sent).

    Every object this process holds is frozen out of the garbage collector for the fork, so a
    child never finalizes what it inherited: a parent's OpenCL event released by a child, or a
    pipe of an earlier pool closed under the number a newer pool's pipe has by then, lost that
    pool its results and hung the search (a process that had used a CL device, then forked)."""
    gc.freeze()
    try:
        return multiprocessing.get_context("fork").Pool(jobs, _forked, (initializer, initargs))
    finally:
        gc.unfreeze()


def _forked(initializer: Callable[..., object] | None, initargs: tuple[Any, ...]) -> None:
    """A forked process begins: SIGTERM ends it, whatever this process had made of SIGTERM (a
    handler, a block), so that the pool's `terminate` always can; seen once, a worker that
    outlived it hung the search's end in `join`."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    if initializer is not None:
        initializer(*initargs)
