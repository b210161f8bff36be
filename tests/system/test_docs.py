"""The documents a newcomer reads: the README opens with what the project does and its glossary, every link stays
inside the repository, the figures lead with a table and a picture, and the project's files are there."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
# Every term the README uses for what the seat is and does; each is defined in its glossary.
TERMS = ("mesh", "node", "module", "manifest", "bus", "state", "bucket", "key", "token", "consumer", "provider",
         "provision", "plan", "compose", "held", "judge", "bound entries", "BoundReads", "have", "want", "retiring",
         "ask", "router", "warrant", "seat", "lease", "holder", "standby", "settled", "fixed point", "actor",
         "supervisor", "compare-and-set", "conflict", "verb")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def tracked(pattern: str) -> list[Path]:
    names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", pattern], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    return [ROOT / n for n in names if (ROOT / n).exists()]


def section(text: str, title: str) -> str:
    """A `## title` section's text, up to the next `## `."""
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start: end if end > 0 else len(text)]


def readme() -> str:
    return (ROOT / "README.md").read_text()


def test_6_the_readme_opens_with_what_the_project_does_in_plain_words() -> None:
    text = readme()
    opening = text[text.index("\n") : text.index("\n## ")].strip()
    assert opening and "```" not in opening
    assert "NATS" in opening and "machine" in opening
    titles = re.findall(r"^## (.+)$", text, re.MULTILINE)
    assert titles[:2] == ["Quick start", "Glossary"]


def test_6_the_glossary_defines_every_term_before_the_readme_uses_it() -> None:
    glossary = section(readme(), "Glossary")
    defined = set(re.findall(r"\*\*([^*]+)\*\*", glossary))
    assert set(TERMS) <= defined, sorted(set(TERMS) - defined)


def test_6_every_link_of_the_documents_stays_inside_the_repository() -> None:
    docs = tracked("*.md")
    assert ROOT / "docs" / "contract.md" in docs
    for doc in docs:
        for target in LINK.findall(doc.read_text()):
            if re.match(r"[a-z]+:", target):  # a web page (https://...): not a file of the repository
                assert target.startswith("https://"), (doc, target)
                continue
            path = (doc.parent / target.split("#", 1)[0]).resolve()
            assert path.is_relative_to(ROOT) and path.exists(), f"{doc.relative_to(ROOT)} links {target}"
    assert "../shared" not in readme() and "(docs/contract.md)" in readme()


def test_6_the_contract_is_complete_and_speaks_to_users() -> None:
    text = (ROOT / "docs" / "contract.md").read_text()
    for title in ("1. Conventions", "2. What the seat reads", "3. Manifests", "4. What the seat writes",
                  "4.1 The registry", "5. The seat's rules", "5.4 Retiring is asked", "6. Waking", "7. Bad input",
                  "8. The seat is held once", "8.1 A partitioned seat", "9. The seat's verb"):
        assert re.search(rf"^#+ {re.escape(title)}", text, re.MULTILINE), title
    for name in ("mesh-provisioner.plans", "mesh-provisioner.provisions", "mesh-provisioner.refused",
                 "mesh-provisioner.seat", "asks.ask.mesh-provisioner", "mesh-provisioner.provisioning", "depends-on",
                 "Nats-Msg-Id", "binds", "holder"):
        assert name in text, name
    assert "seeds" not in text and "../shared" not in text


def test_6_license_changelog_contributing() -> None:
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text and len(license_text) > 10_000
    assert 'license = { text = "Apache-2.0" }' in (ROOT / "pyproject.toml").read_text()
    assert (ROOT / "CHANGELOG.md").read_text().startswith("# Changelog")
    assert "## Unreleased" in (ROOT / "CHANGELOG.md").read_text()
    contributing = (ROOT / "CONTRIBUTING.md").read_text()
    assert contributing.startswith("# Contributing")
    assert "ruff check" in contributing and "mypy --strict" in contributing


def test_6_the_layout_tree_has_every_directory_of_the_repository() -> None:
    built = section(readme(), "How it is built")
    tree = built.split("```\n", 2)[1]
    top = {name.split("/", 1)[0] for name in subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                                                            capture_output=True, text=True, check=True).stdout.split()
           if "/" in name and not name.startswith(".")}
    assert {"faults", "meshcheck", "benchmarks", "deploy", "examples", "docs", "tests", "mesh_provisioner"} <= top
    listed = set(re.findall(r"^([a-z_]+)/", tree, re.MULTILINE))
    assert top <= listed, sorted(top - listed)


@pytest.mark.parametrize("name", ["BENCHMARKS.md", "RELIABILITY.md"])
def test_6_the_figures_lead_with_one_table_and_one_picture(name: str) -> None:
    text = (ROOT / "docs" / name).read_text()
    lead = text[: text.index("\n## ")]
    tables = re.findall(r"^\|---", lead, re.MULTILINE)
    pictures = re.findall(r"!\[[^\]]+\]\(([^)]+)\)", lead)
    assert len(tables) == 1 and len(pictures) == 1, (tables, pictures)
    assert (ROOT / "docs" / pictures[0]).stat().st_size > 10_000
    # Up to the picture, read without the rest: no commit hashes, no field names of the JSON or the code.
    head = lead[: lead.index("![")]
    assert not re.search(r"`[0-9a-f]{7}`", head)
    assert not re.search(r"`[a-z]+_[a-z_]+`", head)


def test_6_the_reliability_picture_is_drawn_from_its_figures(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from benchmarks import plots

    assert plots.main(["--reliability", str(ROOT / "docs" / "reliability.json"), "--out", str(tmp_path)]) == 0
    assert (tmp_path / "reliability.png").stat().st_size > 10_000
    assert (tmp_path / "soak.png").stat().st_size > 10_000, "the soak's picture, from the soak's figures"
