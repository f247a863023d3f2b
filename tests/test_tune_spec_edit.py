"""`tune --write`: the narrow spec edit keeps comments; odd layouts fall back to a full rewrite."""

from __future__ import annotations

import yaml

from specbuild.tuning.spec_edit import edit_text, set_spec_value

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


def test_block_sequence_value_is_replaced_and_comments_kept():
    out = edit_text(BLOCK, "medusa", "choices", [[0], [1]])
    assert "  choices: [[0], [1]]\n  num_heads: 4\n" in out
    assert "# heads comment" in out and "# my deployment" in out and "# bound" in out
    assert yaml.safe_load(out)["medusa"] == {"heads": "h", "choices": [[0], [1]], "num_heads": 4}


def test_scalar_keeps_its_trailing_comment():
    out = edit_text(BLOCK, "speculation", "max_draft_len", 7)
    assert "  max_draft_len: 7  # bound\n" in out
    assert "# K for the tree" in out


def test_flow_mapping_section():
    text = "name: x\nspeculation: {max_draft_len: 5, use_logits: false}  # K\n"
    out = edit_text(text, "speculation", "max_draft_len", 3)
    assert yaml.safe_load(out)["speculation"] == {"max_draft_len": 3, "use_logits": False}
    assert out.endswith("  # K\n")


def test_missing_key_and_section_are_added():
    assert yaml.safe_load(
        edit_text("name: x\nspeculation:\n  use_logits: true\n", "speculation", "max_draft_len", 4)
    )["speculation"] == {"max_draft_len": 4, "use_logits": True}
    assert yaml.safe_load(edit_text("name: x\n", "speculation", "max_draft_len", 4))["speculation"] == {
        "max_draft_len": 4
    }


def test_set_spec_value_writes_a_valid_spec(tmp_path):
    from specbuild.core.spec import load_spec

    (tmp_path / "t").mkdir()
    path = tmp_path / "s.yaml"
    path.write_text(BLOCK)
    assert set_spec_value(path, "medusa", "choices", [[0], [0, 0], [1]]) is True
    assert load_spec(path).medusa_choices().to_lists() == [[0], [0, 0], [1]]
    assert "# heads comment" in path.read_text()


def test_unusual_layout_falls_back_to_a_full_rewrite(tmp_path):
    from specbuild.core.spec import load_spec

    (tmp_path / "t").mkdir()
    path = tmp_path / "s.yaml"
    # an anchored section: the narrow edit cannot find it, so the whole spec is rewritten
    path.write_text(
        "name: x\nmode: medusa\ntarget: {model: t}\nmedusa: &m\n  heads: h\n  num_heads: 4\nspeculation: "
        "{max_draft_len: 63}\n"
    )
    assert set_spec_value(path, "medusa", "choices", [[0], [1]]) is False
    spec = load_spec(path)
    assert spec.medusa_choices().to_lists() == [[0], [1]] and spec.medusa.heads == "h"
