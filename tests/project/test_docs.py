"""The README and the manual hold together: every relative link in the README resolves, and
every page of docs/ is in the site's navigation (``.ci/run`` builds the site with
``mkdocs build --strict``, which checks the links between pages)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _nav_pages(nav: object) -> set[str]:
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, list):
        return set().union(*(_nav_pages(item) for item in nav))
    if isinstance(nav, dict):
        return set().union(*(_nav_pages(v) for v in nav.values()))
    return set()


def test_readme_links_resolve() -> None:
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link]
    assert local, "the README links into the manual"
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, missing


def test_every_page_is_in_the_navigation() -> None:
    class Loader(yaml.SafeLoader):
        pass

    # mkdocs.yml may use !!python/name tags in plugins; the navigation needs none
    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda *_: None)
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)
    in_nav = _nav_pages(config["nav"])
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages - in_nav == set(), "pages no one can reach from the index"
    assert in_nav - pages == set(), "navigation to pages that do not exist"


def test_the_readme_is_a_front_page() -> None:
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= 260, f"README.md has {lines} lines: the manual belongs in docs/"
