"""`tune --write`: the round-trip edit (ruamel.yaml) keeps comments, key order and layout whatever the
spec's YAML looks like; a result that is not a valid spec, or reads back differently, is not written."""

from __future__ import annotations

import pytest
import yaml

from specbuild.core.errors import SpecError
from specbuild.tuning.spec_edit import edit_text, set_spec_value, set_spec_values

BLOCK = """\
# my deployment
name: x  # name comment
mode: medusa
target: {model: t}
medusa:
  heads: h  # heads comment
  choices:
    - [0]
    - [0, 0]
  num_heads: 4
speculation:
  # K for the tree
  max_draft_len: 63  # bound
"""


def _one(text, section, key, value):
    return edit_text(text, [(section, key, value)])


def test_block_sequence_value_is_replaced_and_comments_kept():
    out = _one(BLOCK, "medusa", "choices", [[0], [1]])
    assert "  choices: [[0], [1]]\n  num_heads: 4\n" in out
    assert "# heads comment" in out and "# my deployment" in out and "# bound" in out
    assert yaml.safe_load(out)["medusa"] == {"heads": "h", "choices": [[0], [1]], "num_heads": 4}


def test_scalar_keeps_its_trailing_comment_and_the_rest_is_byte_identical():
    out = _one(BLOCK, "speculation", "max_draft_len", 7)
    edited = next(line for line in out.splitlines() if "max_draft_len" in line)
    assert edited.split() == ["max_draft_len:", "7", "#", "bound"]  # the comment keeps its column
    assert out.replace(edited, "") == BLOCK.replace("  max_draft_len: 63  # bound", "")


def test_flow_mapping_section():
    text = "name: x\nspeculation: {max_draft_len: 5, use_logits: false}  # K\n"
    out = _one(text, "speculation", "max_draft_len", 3)
    assert yaml.safe_load(out)["speculation"] == {"max_draft_len": 3, "use_logits": False}
    assert out.rstrip("\n").endswith("# K")


def test_missing_key_and_section_are_added():
    assert yaml.safe_load(
        _one("name: x\nspeculation:\n  use_logits: true\n", "speculation", "max_draft_len", 4)
    )["speculation"] == {"use_logits": True, "max_draft_len": 4}
    assert yaml.safe_load(_one("name: x\n", "speculation", "max_draft_len", 4))["speculation"] == {
        "max_draft_len": 4
    }


def test_schedule_mapping_keeps_integer_keys_in_flow_style():
    out = edit_text(BLOCK, [("speculation", "max_draft_len", 4), ("speculation", "schedule", {1: 4, 4: 0})])
    assert "  schedule: {1: 4, 4: 0}\n" in out
    assert yaml.safe_load(out)["speculation"]["schedule"] == {1: 4, 4: 0}


def test_set_spec_value_writes_a_valid_spec(tmp_path):
    from specbuild.core.spec import load_spec

    (tmp_path / "t").mkdir()
    path = tmp_path / "s.yaml"
    path.write_text(BLOCK)
    set_spec_value(path, "medusa", "choices", [[0], [0, 0], [1]])
    assert load_spec(path).medusa_choices().to_lists() == [[0], [0, 0], [1]]
    assert "# heads comment" in path.read_text()


# Layouts the former textual edit could not handle: it rewrote the whole spec and dropped every comment.
ODD = [
    # an anchored section (the edit looked for `medusa:` alone on its line)
    "# keep me\nname: x\nmode: medusa\ntarget: {model: t}\nmedusa: &m  # anchored\n  heads: h\n"
    "  num_heads: 4\nspeculation: {max_draft_len: 63}\n",
    # the key's value on the next line, under a comment
    "# keep me\nname: x\nmode: medusa\ntarget: {model: t}\nmedusa:\n  heads: h\n  num_heads: 4\n  choices:\n"
    "    # first guess\n    [[0], [1]]\nspeculation: {max_draft_len: 63}\n",
    # sequences indented four under their key, a document start marker
    "---\n# keep me\nname: x\nmode: medusa\ntarget:\n    model: t\nmedusa:\n    heads: h\n    num_heads: 4\n"
    "    choices:\n      - [0]\nspeculation:\n    max_draft_len: 63\n",
]


@pytest.mark.parametrize("text", ODD)
def test_unusual_layouts_keep_their_comments(tmp_path, text):
    from specbuild.core.spec import load_spec

    (tmp_path / "t").mkdir()
    path = tmp_path / "s.yaml"
    path.write_text(text)
    set_spec_value(path, "medusa", "choices", [[0], [1]])
    out = path.read_text()
    assert "# keep me" in out and load_spec(path).medusa_choices().to_lists() == [[0], [1]]
    assert load_spec(path).medusa.heads == "h"
    assert out.count("\n") <= text.count("\n") + 2  # the new key (ruamel may move a comment to a line)


def test_four_space_indentation_is_kept():
    out = _one(ODD[2], "speculation", "max_draft_len", 7)
    assert out == ODD[2].replace("max_draft_len: 63", "max_draft_len: 7")


def test_an_invalid_result_is_not_written(tmp_path):
    (tmp_path / "t").mkdir()
    path = tmp_path / "s.yaml"
    path.write_text(BLOCK)
    with pytest.raises(SpecError):
        set_spec_values(path, "speculation", {"max_draft_len": 0})  # out of its range
    assert path.read_text() == BLOCK  # left as it was


def test_a_quoted_key_keeps_the_comments(tmp_path):
    """The former edit did not recognise `"max_draft_len":` and rewrote the whole spec without comments."""
    from specbuild.core.spec import load_spec

    (tmp_path / "t").mkdir()
    path = tmp_path / "s.yaml"
    text = "# keep me\nname: x\nmode: draft_target\ntarget: {model: t}\ndraft: {model: t}\nspeculation:\n"
    path.write_text(text + '  "max_draft_len": 3  # bound\n')
    set_spec_value(path, "speculation", "max_draft_len", 7)
    out = path.read_text()
    assert out.startswith(text) and "# bound" in out and load_spec(path).speculation.max_draft_len == 7


def test_a_value_that_would_read_back_differently_is_refused(tmp_path):
    """ruamel writes YAML 1.2, where `yes` is a string; the spec loader (PyYAML, YAML 1.1) would read a
    boolean: the read-back check catches it and nothing is written."""
    (tmp_path / "t").mkdir()
    path = tmp_path / "s.yaml"
    path.write_text(BLOCK)
    with pytest.raises(SpecError, match="does not read back"):
        set_spec_value(path, "medusa", "heads", "yes")
    assert path.read_text() == BLOCK
