"""Which compiled spec candidates (transitions and rejections) and which ordering edges a run exercised."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from devbridge.spec import load
from devbridge.statemachine.machine import Step, Table


@dataclass
class Coverage:
    """Which compiled spec candidates a run exercised, and how many steps it took."""

    table: Table
    label: str = "stateful"
    hits: dict[tuple[str, str, int], int] = field(default_factory=dict)
    steps: int = 0
    seconds: float = 0.0
    edges: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # (earlier, later, hazard)
    refusals: Counter[str] = field(default_factory=Counter)  # refusals by rule (ORDER-2 among them)

    def record_edge(self, earlier: str, later: str, hazard: str) -> None:
        self.edges[(earlier, later, hazard)] += 1

    @staticmethod
    def hazard_edges() -> list[tuple[str, str, str]]:
        """Every (earlier kind, later kind, hazard) the spec's table orders."""
        lc = load()
        return [(a, b, h) for a in lc.accesses for b in lc.accesses if (h := lc.hazard(a, b))]

    def missing_edges(self) -> list[tuple[str, str, str]]:
        return [e for e in self.hazard_edges() if e not in self.edges]

    def record(self, state: str, event: str, step: Step) -> None:
        key = (state, event, self.table.steps[(state, event)].index(step))
        self.hits[key] = self.hits.get(key, 0) + 1

    def missing(self) -> list[str]:
        return [
            self.table.describe(s, e, step) for s, e, i, step in self.table.candidates() if (s, e, i) not in self.hits
        ]

    def merge(self, hits: dict[tuple[str, str, int], int], edges: Counter[tuple[str, str, str]]) -> None:
        """Add what another run of the same table exercised (its `hits` and `edges`)."""
        for key, n in hits.items():
            self.hits[key] = self.hits.get(key, 0) + n
        self.edges.update(edges)

    def covered(self) -> str:
        """One line: spec transitions, rejections and hazard edges exercised, of all."""
        candidates = self.table.candidates()
        t = [c for c in candidates if c[3].rule is None]
        r = [c for c in candidates if c[3].rule is not None]
        edges = self.hazard_edges()
        return (
            f"spec transitions covered: {sum((s, e, i) in self.hits for s, e, i, _ in t)}/{len(t)}   "
            f"rejections covered: {sum((s, e, i) in self.hits for s, e, i, _ in r)}/{len(r)}   "
            f"hazard edges covered: {len(edges) - len(self.missing_edges())}/{len(edges)}"
        )

    def report(self) -> str:
        candidates = self.table.candidates()
        transitions = [c for c in candidates if c[3].rule is None]
        rejections = [c for c in candidates if c[3].rule is not None]
        rate = self.steps / max(self.seconds, 1e-9)
        lines = [
            f"{self.label}: {self.steps} steps in {self.seconds:.1f} s ({rate:.0f} steps/s)",
            f"spec transitions covered: {sum((s, e, i) in self.hits for s, e, i, _ in transitions)}/{len(transitions)}",
            f"spec rejections covered:  {sum((s, e, i) in self.hits for s, e, i, _ in rejections)}/{len(rejections)}",
            f"hazard edges covered:     {len(self.hazard_edges()) - len(self.missing_edges())}/"
            f"{len(self.hazard_edges())}   ORDER-2 refusals: {self.refusals['ORDER-2']}",
        ]
        lines += [f"  {self.edges[e]:>7}  {e[0]} then {e[1]}: {e[2]}" for e in self.hazard_edges()]
        for s, e, i, step in candidates:
            lines.append(f"  {self.hits.get((s, e, i), 0):>7}  {self.table.describe(s, e, step)}")
        return "\n".join(lines)
