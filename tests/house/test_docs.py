"""CONTRACT.md is generated from the spec, checked in CI, and every error points into it."""

from __future__ import annotations

import dataclasses
import itertools
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from devbridge import Bridge, InvalidHandleError, ObjectSpec
from devbridge.backends.fake import FakeBackend
from devbridge.checkout import script
from devbridge.cli.main import main
from devbridge.errors import CONTRACT_PATH
from devbridge.spec import SEED_PATH, SPEC_PATH, load
from devbridge.spec.ring import load_ring
from devbridge.statemachine.machine import compile_table

DOCS = script("docs")  # the contract generator: a tool of the checkout (it reads tests/)
DocsError, generate, seed_bullets, source_root = DOCS.DocsError, DOCS.generate, DOCS.seed_bullets, DOCS.source_root

TESTS = Path(__file__).resolve().parents[1]  # every folder of tests/


def test_committed_contract_is_what_the_generator_writes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["docs", "--check"]) == 0
    assert "up to date" in capsys.readouterr().out


def test_changing_the_spec_changes_the_document_until_regenerated(tmp_path: Path) -> None:
    spec, out = tmp_path / "lifecycle.toml", tmp_path / "CONTRACT.md"
    shutil.copy(SPEC_PATH, spec)
    args = ["docs", "--spec", str(spec), "--out", str(out), "--tests", str(TESTS)]
    assert main(args) == 0 and main([*args, "--check"]) == 0
    spec.write_text(spec.read_text().replace("A handle is a capability", "A handle is a token"))
    assert main([*args, "--check"]) == 1
    assert main(args) == 0 and main([*args, "--check"]) == 0
    assert "A handle is a token" in out.read_text()


def test_a_contract_clause_without_a_rule_fails_the_generator(tmp_path: Path) -> None:
    seed = tmp_path / "SEED.md"
    seed.write_text(SEED_PATH.read_text() + "\n## Extra\n\n- Devices never catch fire.\n")
    with pytest.raises(DocsError, match=re.escape("implemented by no rule: 'Devices never catch fire.'")):
        generate(seed_path=seed, tests_dir=TESTS)
    assert main(["docs", "--seed", str(seed), "--out", str(tmp_path / "C.md")]) == 2
    assert not (tmp_path / "C.md").exists()


def test_a_rule_without_tests_fails_the_generator(tmp_path: Path) -> None:
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    with pytest.raises(DocsError, match=re.escape("has no test marked @pytest.mark.holds")):
        generate(tests_dir=tmp_path)


def test_every_clause_and_rule_appears_with_its_proving_tests() -> None:
    doc = (source_root() / CONTRACT_PATH).read_text()
    for _, bullet in seed_bullets(SEED_PATH):
        assert re.search(rf"^- {re.escape(bullet)} — \[", doc, re.M), bullet
    for rid in load().rules:
        block = doc.split(f"#### {rid}\n", 1)[1].split("\n#### ", 1)[0]
        assert re.search(r"- Proved by: `tests/\w+/test_\w+\.py::\w+`", block), rid
        assert re.search(r"- Breach refused or deferred in: `tests/\w+/test_\w+\.py::\w+`", block), rid


def diagrams() -> list[str]:
    doc = (source_root() / CONTRACT_PATH).read_text()
    return [block.split("```", 1)[0] for block in doc.split("```mermaid\n")[1:]]


def lifecycle_diagrams() -> list[str]:
    """The allocation's two diagrams (the ring's records have the third)."""
    return diagrams()[:2]


def test_the_full_diagram_has_every_spec_transition() -> None:
    _, full = lifecycle_diagrams()
    assert full.startswith("stateDiagram-v2\n    [*] --> allocated\n")
    for t in load().transitions:
        edge = re.search(rf"^    {t.source} --> {t.dest} : (.*)$", full, re.M)
        assert edge is not None and t.event in edge.group(1), t


def test_the_folded_diagram_has_one_edge_per_pair_of_states_with_its_events() -> None:
    folded, _ = lifecycle_diagrams()
    assert folded.startswith("stateDiagram-v2\n    [*] --> allocated\n")
    edges = dict(re.findall(r"^    (\w+ --> \w+) : (.*)$", folded, re.M))
    moves = [t for t in load().transitions if t.source != t.dest]
    assert set(edges) == {f"{t.source} --> {t.dest}" for t in moves}  # no self-loop, no pair twice
    for t in moves:
        assert t.event in re.split(r", | / release", edges[f"{t.source} --> {t.dest}"]), t
    assert "[" not in "".join(edges.values())  # no guards


def test_the_ring_diagram_has_every_record_transition_of_the_ring_spec() -> None:
    from devbridge.spec.ring import load_ring

    ring = load_ring()
    records = diagrams()[2]
    assert records.startswith(f"stateDiagram-v2\n    [*] --> {ring.initial}\n")
    for t in ring.transitions:
        assert f"    {t.source} --> {t.dest}: {t.event}\n" in records, t
    assert len(diagrams()) == 3


def test_errors_name_their_rule_and_its_anchor() -> None:
    bridge = Bridge(FakeBackend())
    h = bridge.alloc_device(ObjectSpec("x", "uint8"), 4)
    bridge.free_device(h)
    with pytest.raises(InvalidHandleError) as e:
        bridge.free_device(h)
    assert str(e.value).startswith("[FREE-2] ") and str(e.value).endswith("(see spec/CONTRACT.md#free-2)")
    assert "\n#### FREE-2\n" in (source_root() / CONTRACT_PATH).read_text()  # GitHub's anchor of that heading


def dot_edges(dot: str) -> dict[tuple[str, str], str]:
    """(source, dest) -> label of every edge of a picture's Graphviz source."""
    return {
        (a, b): label.strip('"') for a, b, label in re.findall(r"^\t(\w+) -> (\w+) \[label=(\"[^\"]*\"|\w+)", dot, re.M)
    }


def drawn() -> list[Any]:
    """Every picture the docs show, from the packaged spec."""
    lc = load()
    return list(DOCS.diagrams(lc, compile_table(lc), load_ring()))


def pictures() -> dict[str, str]:
    """name -> Graphviz source of every picture the docs show, from the spec."""
    return {d.name: d.dot for d in drawn()}


def test_the_pictures_have_every_transition_of_their_spec() -> None:
    drawn = pictures()
    assert sorted(drawn) == ["lifecycle", "lifecycle-full", "ring-records", "worker-stages"]
    lc = load()
    folded = dot_edges(drawn["lifecycle"])
    assert set(folded) == {(t.source, t.dest) for t in lc.transitions if t.source != t.dest}
    full = dot_edges(drawn["lifecycle-full"])
    for t in lc.transitions:
        assert t.event in full[(t.source, t.dest)], t
    assert "[not last_copy]" in full[("copying", "copying")]  # the guards, and the steps that stay
    from devbridge.spec.ring import load_ring

    ring = load_ring()
    records = dot_edges(drawn["ring-records"])
    for r in ring.transitions:
        assert r.event in records[(r.source, r.dest)].split("\\n"), r
    from devbridge.apps.worker import MOVES, STAGES

    stages = dot_edges(drawn["worker-stages"])
    assert stages == {(a.name, b.name): why for (a, b), why in MOVES.items()}
    assert {(a, b) for a, tos in STAGES.items() for b in tos} == set(MOVES)
    table = compile_table(lc)
    starts_and_ends = {
        "lifecycle": (lc.initial, table.terminal),
        "lifecycle-full": (lc.initial, table.terminal),
        "ring-records": (ring.initial, {s.name for s in ring.states.values() if s.terminal}),
        "worker-stages": ("SLOT", {a.name for a, tos in STAGES.items() if not tos}),
    }
    for name, (initial, terminal) in starts_and_ends.items():
        assert f"\tstart -> {initial}\n" in drawn[name], name
        assert set(re.findall(r"^\t(\w+) \[peripheries=2\]$", drawn[name], re.M)) == set(terminal), name
        assert drawn[name].startswith(f"digraph {name.replace('-', '_')} {{") or drawn[name].startswith(
            f'digraph "{name}" {{'
        ), name


def test_a_picture_s_digest_is_of_its_graph_and_of_how_it_is_drawn(monkeypatch: pytest.MonkeyPatch) -> None:
    first = {d.name: d.digest for d in drawn()}
    assert {d.name: d.digest for d in drawn()} == first
    moved = [dataclasses.replace(d, moves=(*d.moves[:-1], (*d.moves[-1][:2], ["renamed"]))) for d in drawn()]
    assert all(d.digest != first[d.name] for d in moved)  # a label
    monkeypatch.setattr(DOCS, "FONT", "Courier")
    assert all(d.digest != first[d.name] for d in drawn())  # the drawing


def test_the_check_tells_a_stale_missing_cut_or_stray_picture_and_docs_redraws_only_that(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each SVG carries the digest of what it was drawn from: `--check` tells a stale, missing,
    cut or stray picture without drawing, and `devbridge docs` redraws only those (in a folder
    whose path has a space) and removes only the SVGs it drew itself."""
    out = tmp_path / "a folder" / "CONTRACT.md"
    out.parent.mkdir()
    folder = out.parent / "diagrams"
    assert main(["docs", "--out", str(out)]) == 0
    assert sorted(p.name for p in folder.iterdir()) == sorted(f"{n}.svg" for n in pictures())
    for d in drawn():
        svg = (folder / f"{d.name}.svg").read_text().splitlines()
        assert svg[1] == DOCS.STAMP.format(d.digest) and svg[-1] == "</svg>"
        assert f"<title>{d.name.replace('-', '&#45;')}</title>" in svg  # (dot escapes a hyphen)
    capsys.readouterr()
    assert main(["docs", "--out", str(out), "--check"]) == 0
    from devbridge.apps.worker import jobs

    monkeypatch.setitem(jobs.MOVES, (jobs.Stage.COMPUTE, jobs.Stage.SLOT), "restart (renamed)")
    assert main(["docs", "--out", str(out), "--check"]) == 1
    worker = folder / "worker-stages.svg"
    assert capsys.readouterr().err.strip() == f"{worker} was not drawn from the spec as it is: run `devbridge docs`"
    assert main(["docs", "--out", str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == [f"wrote {worker}"]
    assert "restart (renamed)" in worker.read_text()
    assert main(["docs", "--out", str(out), "--check"]) == 0
    (folder / "lifecycle.svg").unlink()
    ring = folder / "ring-records.svg"
    ring.write_text("\n".join(ring.read_text().splitlines()[:3]) + "\n<svg/>\n")  # its stamp kept, cut short
    (folder / "old.svg").write_text(f"<?xml version='1.0'?>\n{DOCS.STAMP.format('0' * 64)}\n<svg></svg>\n")
    (folder / "theirs.svg").write_text("<svg></svg>\n")  # not drawn by devbridge docs: left alone
    capsys.readouterr()
    assert main(["docs", "--out", str(out), "--check"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"{folder / 'lifecycle.svg'} is missing: run `devbridge docs`",
        f"{ring} was not drawn from the spec as it is: run `devbridge docs`",
        f"{folder / 'old.svg'} is drawn from nothing: run `devbridge docs`",
    ]
    assert main(["docs", "--out", str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == [
        f"wrote {folder / 'lifecycle.svg'}",
        f"wrote {ring}",
        f"removed {folder / 'old.svg'} (drawn from nothing)",
    ]
    assert main(["docs", "--out", str(out), "--check"]) == 0 and (folder / "theirs.svg").exists()


def test_the_checkout_s_own_contract_has_its_pictures_in_the_docs(capsys: pytest.CaptureFixture[str]) -> None:
    """`--out` naming the checkout's own CONTRACT.md checks docs/diagrams, as the default does."""
    assert main(["docs", "--check", "--out", str(source_root() / CONTRACT_PATH)]) == 0
    assert capsys.readouterr().out.strip().endswith(f"and the pictures in {source_root() / 'docs' / 'diagrams'}")


def test_without_graphviz_s_dot_the_contract_is_written_and_the_pictures_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import graphviz

    def missing(*args: object) -> None:
        raise graphviz.ExecutableNotFound(("dot",))

    monkeypatch.setattr(graphviz, "version", missing)
    out = tmp_path / "CONTRACT.md"
    assert main(["docs", "--out", str(out)]) == 1
    assert out.read_text().startswith("# devbridge contract") and not (tmp_path / "diagrams").exists()
    assert "the pictures need Graphviz (apt install graphviz" in capsys.readouterr().err
    assert main(["docs", "--out", str(out), "--check"]) == 1  # no picture: the check needs no Graphviz


def test_every_mermaid_block_of_the_contract_is_marked_with_its_picture() -> None:
    doc = (source_root() / CONTRACT_PATH).read_text()
    marks = re.findall(r"^<!-- diagram: ([\w-]+): (.+) -->\n```mermaid\n", doc, re.M)
    assert [name for name, _ in marks] == ["lifecycle", "lifecycle-full", "ring-records"]
    assert doc.count("```mermaid") == len(marks) and all(title == DOCS.TITLES[n] for n, title in marks)


IN_USE = ["copying", "computing", "copying_computing"]
ARROW = re.compile(r"\s*(?:-{2,}|─{2,})[^>▶]*?(?:>|▶)\s*")


def text_edges(block: str) -> set[tuple[str, str]]:
    """The (source, dest) pairs a text drawing of the lifecycle shows: chains like
    `allocated, idle --free--> freed`, several on a line apart by wide gaps ("in use": the
    three in-use states)."""
    found = set()
    for line in block.splitlines():
        for chain in re.split(r" {3,}(?![-─])", line.strip()):  # (not the gap that aligns an arrow)
            groups = ARROW.split(chain)
            if len(groups) < 2:
                continue  # a note beside the chains
            states = [[s for g in group.split(", ") for s in (IN_USE if g == "in use" else [g])] for group in groups]
            found |= {(a, b) for before, after in itertools.pairwise(states) for a in before for b in after}
    return found


def text_blocks(page: Path) -> str:
    return "\n".join(b.split("```", 1)[0] for b in page.read_text().split("```text\n")[1:])


@pytest.mark.parametrize("page", ["README.md", "docs/concepts/lifecycle.md"])
def test_the_text_drawing_of_the_lifecycle_has_every_edge_of_its_picture(page: str) -> None:
    """For terminals, below the picture: the same pairs of states, no more and no fewer."""
    folded = dot_edges(pictures()["lifecycle"])
    assert text_edges(text_blocks(source_root() / page)) == set(folded)
