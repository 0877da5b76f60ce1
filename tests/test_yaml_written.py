"""The tool never writes YAML by hand (issue 34): a test over the source.

Every YAML file sparkbuild writes goes through ``yamlfile.dump_yaml``. The idioms this test
refuses (tests/support/yaml_by_hand.py) are each shown found in the code that shipped them:
the imported profile's header, whose lines a recipe's newline could end, was one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.yaml_by_hand import findings, scan

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "sparkbuild"

# As they shipped before issue 34 (engines/recipes.py, bench/arena.py, lockfile.py).
PROFILE_HEADER = """
import yaml

class ImportedRecipe:
    def yaml_text(self) -> str:
        lines = [f"# Imported from the Spark Arena recipe {self.source.file}"]
        for note in self.dropped:
            lines.append(f"# Not carried: {note.item}: {note.detail}")
        body = yaml.safe_dump(dict(self.profile), sort_keys=False)
        return "\\n".join(lines) + "\\n" + body
"""
CLAIMS_HEADER = """
import yaml

def recipe_claims(imported, data):
    header = f"# Published figures for the Spark Arena recipe {imported.source.file}\\n"
    return header + yaml.safe_dump(data, sort_keys=False)
"""
LOCK_HEADER = """
import yaml

def dumps(lock):
    body = yaml.dump(lock.to_json(), Dumper=_CanonicalDumper, sort_keys=True)
    return HEADER + redact(body)
"""
# Through the one dumper, and still put together with other text.
JOINED = """
from sparkbuild.yamlfile import dump_yaml

def claims_text(name, data):
    return f"# claims for {name}\\n{dump_yaml(data)}"

def lines(data, extra):
    text = dump_yaml(data)
    return "".join([text, extra])
"""
# A template written to a .yaml file.
TEMPLATE = """
def write_profile(folder, name, model):
    path = folder / f"{name}.yaml"
    path.write_text(f"engine: vllm\\nmodel: {model}\\n")
"""


def test_the_package_writes_no_yaml_by_hand() -> None:
    found = scan(PACKAGE)
    assert not found, "YAML assembled as text (use yamlfile.dump_yaml):\n" + "\n".join(
        map(str, found)
    )


@pytest.mark.parametrize(
    ("source", "name", "idioms"),
    [
        (PROFILE_HEADER, "recipes.py", {"dump-call", "dump-joined"}),
        (CLAIMS_HEADER, "arena.py", {"dump-call", "dump-joined"}),
        (LOCK_HEADER, "lockfile.py", {"dump-call", "dump-joined"}),
        (JOINED, "claims.py", {"dump-joined"}),
        (TEMPLATE, "profiles.py", {"yaml-write"}),
    ],
    ids=["profile-header", "claims-header", "lock-header", "joined", "template"],
)
def test_each_idiom_is_found_where_it_shipped(source: str, name: str, idioms: set[str]) -> None:
    assert {f.idiom for f in findings(source, name)} == idioms


def test_the_one_dumper_and_the_spec_editor_may_dump() -> None:
    one = "import yaml\ndef dump_yaml(data):\n    return yaml.dump(data)\n"
    assert findings(one, "yamlfile.py") == []
    editor = "from ruamel.yaml import YAML\ndef dump(data, out):\n    YAML().dump(data, out)\n"
    assert findings(editor, "specedit.py") == []
    assert [f.idiom for f in findings(editor, "other.py")] == ["dump-call"]
