"""The README's configuration table documents every setting (docs stay true)."""

from pathlib import Path

from onceflow.settings import Settings

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_every_setting_is_documented():
    missing = [name for name in Settings.model_fields if f"`ONCEFLOW_{name.upper()}`" not in README]
    assert missing == []


def test_readme_opens_with_the_two_commands():
    first_block = README.split("```")[1]
    assert "make demo" in first_block and "make test" in first_block
