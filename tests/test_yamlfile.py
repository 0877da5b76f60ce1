"""The YAML loader: libyaml for plain documents, the pure-Python loader for everything it
must refuse or explain. Both paths must agree on data and on the line of every key."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import yaml

from sparkbuild import yamlfile
from sparkbuild.errors import BadYAMLError

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted([*ROOT.glob("builds/*.yaml"), *ROOT.glob("smoke/*.yaml")])


def _python_path(raw: bytes) -> tuple[object, yaml.Node | None]:
    loader = yamlfile._NoAliasLoader(raw.decode("utf-8"))
    try:
        node = loader.get_single_node()
        return loader.construct_document(node), node
    finally:
        loader.dispose()


def _lines(node: yaml.Node | None) -> dict[yamlfile.Location, int]:
    lines: dict[yamlfile.Location, int] = {}
    if node is not None:
        yamlfile.node_lines(node, (), lines)
    return lines


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_libyaml_and_python_agree_on_every_shipped_file(path: Path) -> None:
    raw = path.read_bytes()
    assert yamlfile._parse_with_libyaml(raw.decode()) is not None, "took the slow path"
    data, node = yamlfile.parse_yaml(raw)
    want_data, want_node = _python_path(raw)
    assert data == want_data
    assert _lines(node) == _lines(want_node)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("a: &x [1, 2]\nb: *x\n", "aliases (*x) are not allowed"),
        ("a: 1\nb: 2\na: 3\n", "duplicate key 'a' (first defined on line 1)"),
        ("a: [1, 2\n", "malformed YAML"),
        ("a: !!python/object:os.system x\n", "malformed YAML"),
        ("[" * 5000 + "]" * 5000, "malformed YAML"),
    ],
    ids=["alias", "duplicate", "unclosed", "python-tag", "deep"],
)
def test_refusals_read_as_the_python_loader_words_them(text: str, problem: str) -> None:
    with pytest.raises(BadYAMLError) as caught:
        yamlfile.parse_yaml(text.encode())
    assert problem in caught.value.problem


def test_nesting_past_the_fast_depth_still_parses() -> None:
    depth = yamlfile._FAST_DEPTH + 5
    text = "[" * depth + "1" + "]" * depth
    assert yamlfile._parse_with_libyaml(text) is None
    data, _ = yamlfile.parse_yaml(text.encode())
    for _ in range(depth):
        assert isinstance(data, list)
        data = data[0]
    assert data == 1


def test_a_parse_leaves_the_cyclic_collector_as_it_found_it() -> None:
    """A parse runs with the cyclic garbage collector off (it would only walk the parse's own
    nodes); afterwards it is on again, after a refusal too, and stays off for a caller who
    had turned it off."""
    assert gc.isenabled()
    yamlfile.parse_yaml(b"a: 1\n")
    assert gc.isenabled()
    with pytest.raises(BadYAMLError):
        yamlfile.parse_yaml(b"a: *nothing\n")
    assert gc.isenabled()
    gc.disable()
    try:
        yamlfile.parse_yaml(b"a: 1\n")
        assert not gc.isenabled()
    finally:
        gc.enable()
