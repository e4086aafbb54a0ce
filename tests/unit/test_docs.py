"""The documentation site's generated reference is complete: every setting says what
it is (the settings page is generated from these descriptions), and every page of
docs/ is in the site's navigation (the strict build also refuses a page left out)."""

from __future__ import annotations

import re

import pytest
from pydantic_settings import BaseSettings

from es_agents.dev.config import DevSettings
from es_agents.settings import KafkaSettings, ModelSettings, Settings
from tests.doc_blocks import DOCS, README


@pytest.mark.parametrize("model", [KafkaSettings, Settings, ModelSettings, DevSettings])
def test_every_setting_is_described(model: type[BaseSettings]) -> None:
    bare = [
        name
        for name, field in model.model_fields.items()
        if not field.description and name != "kafka"
    ]
    assert bare == [], f"{model.__name__}: add a description to {bare}"


def test_every_page_is_in_the_navigation() -> None:
    nav = (README.parent / "mkdocs.yml").read_text()
    listed = set(re.findall(r"([\w/.-]+\.md)", nav))
    pages = {
        str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if "gen" not in p.parts
    }
    generated = {"reference/settings.md", "reference/schemas.md"}
    assert pages - listed == set()
    assert listed - pages - generated == set()


def test_the_readme_links_to_pages_that_exist() -> None:
    for target in re.findall(r"\]\((docs/[^)#]+)", README.read_text()):
        assert (README.parent / target).exists(), target
