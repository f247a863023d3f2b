"""The one Medusa tree type: parse, format (Python list and Triton brace form), validate.

A tree is a list of paths; each path is a tuple of top-k indices, one per Medusa head (depth d uses
head d). The root (the token the base model itself produced) is implicit and never listed.
No torch here: the spec loader, `check`, the repository generator and `tune` all use it.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from specbuild.core.errors import SpecbuildError

# FasterDecoding/Medusa medusa_choices.py; TRT-LLM READMEs pass it verbatim. 63 nodes, depth 4.
MC_SIM_7B_63 = [
    [0],
    [0, 0],
    [1],
    [0, 1],
    [2],
    [0, 0, 0],
    [1, 0],
    [0, 2],
    [3],
    [0, 3],
    [4],
    [0, 4],
    [2, 0],
    [0, 5],
    [0, 0, 1],
    [5],
    [0, 6],
    [6],
    [0, 7],
    [0, 1, 0],
    [1, 1],
    [7],
    [0, 8],
    [0, 0, 2],
    [3, 0],
    [0, 9],
    [8],
    [9],
    [1, 0, 0],
    [0, 2, 0],
    [1, 2],
    [0, 0, 3],
    [4, 0],
    [2, 1],
    [0, 0, 4],
    [0, 0, 5],
    [0, 0, 0, 0],
    [0, 1, 1],
    [0, 0, 6],
    [0, 3, 0],
    [5, 0],
    [1, 3],
    [0, 0, 7],
    [0, 0, 8],
    [0, 0, 9],
    [6, 0],
    [0, 4, 0],
    [1, 4],
    [7, 0],
    [0, 1, 2],
    [2, 0, 0],
    [3, 1],
    [2, 2],
    [8, 0],
    [0, 5, 0],
    [1, 5],
    [1, 0, 1],
    [0, 2, 1],
    [9, 0],
    [0, 6, 0],
    [0, 0, 0, 1],
    [1, 6],
    [0, 7, 0],
]  # noqa: E501

NAMED_TREES: dict[str, list[list[int]]] = {
    "mc_sim_7b_63": MC_SIM_7B_63,
    # The 3-head variant used for Llama-3.1-8B-Medusa in TRT-LLM's README (61 nodes).
    "mc_sim_7b_61": [p for p in MC_SIM_7B_63 if p not in ([0, 0, 0, 0], [0, 0, 0, 1])],
    # Chains: one candidate per head, the cheapest trees.
    "chain_1": [[0]],
    "chain_2": [[0], [0, 0]],
    "chain_3": [[0], [0, 0], [0, 0, 0]],
    "chain_4": [[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]],
}
DEFAULT_TREE = "mc_sim_7b_63"  # medusa.choices when a spec leaves it out (the TRT-LLM README tree)


@dataclass(frozen=True)
class MedusaChoices:
    """A validated-on-demand Medusa tree. `paths` keeps the given order (TRT-LLM uses it as node order)."""

    paths: tuple[tuple[int, ...], ...]

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def parse(cls, value: object) -> MedusaChoices:
        """Accept a named tree, a list of lists, a Python-literal string or Triton's '{0, 0}, {1}' form."""
        if isinstance(value, MedusaChoices):
            return value
        if isinstance(value, str):
            text = value.strip()
            if text in NAMED_TREES:
                return cls.from_lists(NAMED_TREES[text])
            if text.startswith("{"):
                return cls.from_triton(text)
            if text.startswith("["):
                try:
                    value = ast.literal_eval(text)
                except (ValueError, SyntaxError):
                    raise _bad(text) from None
            else:
                raise SpecbuildError(
                    f"unknown Medusa tree name {text!r}",
                    expected=f"one of {', '.join(sorted(NAMED_TREES))}, or a list of paths like [[0], [0, "
                    "0], [1]]",
                    found=text,
                    fix="use medusa.choices: mc_sim_7b_63, or run `specbuild tune` to build one",
                )
        if isinstance(value, (list, tuple)):
            return cls.from_lists(value)
        raise _bad(repr(value))

    @classmethod
    def from_lists(cls, lists: object) -> MedusaChoices:
        if not isinstance(lists, (list, tuple)):
            raise _bad(repr(lists))
        paths = []
        for p in lists:
            if not isinstance(p, (list, tuple)) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in p
            ):
                raise _bad(repr(lists))
            paths.append(tuple(int(i) for i in p))
        return cls(tuple(paths))

    @classmethod
    def from_triton(cls, text: str) -> MedusaChoices:
        """Parse the backend's form `{0, 0, 0}, {0, 1}` (no outer braces)."""
        body = text.strip()
        if body.startswith("{{") or body.endswith("}}"):
            raise SpecbuildError(
                "Medusa choices have outer braces",
                expected="the TensorRT-LLM backend form {0, 0}, {1} (no outer braces)",
                found=text,
                fix="remove the outer pair of braces; the backend silently replaces this form with a default "
                "tree",
            )
        groups = re.findall(r"\{([^{}]*)\}", body)
        rest = re.sub(r"\{[^{}]*\}", "", body).replace(",", "").strip()
        if rest or not groups:
            raise _bad(text)
        try:
            return cls(tuple(tuple(int(x) for x in g.split(",") if x.strip()) for g in groups))
        except ValueError:
            raise _bad(text) from None

    # ---- formats --------------------------------------------------------------------------------
    def to_lists(self) -> list[list[int]]:
        return [list(p) for p in self.paths]

    def to_triton(self) -> str:
        """The tensorrt_llm backend's `medusa_choices` parameter value: `{0, 0, 0}, {0, 1}`."""
        return ", ".join("{" + ", ".join(str(i) for i in p) + "}" for p in self.paths)

    def __str__(self) -> str:
        return str(self.to_lists())

    # ---- derived --------------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """Number of tree nodes, root excluded: what must fit in max_draft_len."""
        return len(self.paths)

    @property
    def depth(self) -> int:
        """Longest path: the number of Medusa heads it needs."""
        return max((len(p) for p in self.paths), default=0)

    def problems(self, *, num_heads: int | None = None, max_draft_len: int | None = None) -> list[str]:
        """Every reason this tree is invalid (empty when valid)."""
        out: list[str] = []
        if not self.paths:
            out.append("the tree is empty: list at least one path such as [0]")
        seen: set[tuple[int, ...]] = set()
        for p in self.paths:
            if len(p) == 0:
                out.append("the empty path [] is implicit (the root) and must not be listed")
            if any(i < 0 for i in p):
                out.append(f"path {list(p)} has a negative top-k index")
            if p in seen:
                out.append(f"path {list(p)} is listed twice")
            seen.add(p)
        for p in self.paths:
            for n in range(1, len(p)):
                if p[:n] not in seen:
                    out.append(
                        f"path {list(p)} needs its prefix {list(p[:n])} listed too "
                        "(the C++ runtime wants every node, not only leaves)"
                    )
                    break
        if num_heads is not None and self.depth > num_heads:
            out.append(f"the tree is {self.depth} deep but the model has {num_heads} Medusa heads")
        if max_draft_len is not None and self.size > max_draft_len:
            out.append(f"the tree has {self.size} nodes but max_draft_len is {max_draft_len}")
        return out

    def validate(
        self, *, num_heads: int | None = None, max_draft_len: int | None = None, where: str = "medusa.choices"
    ) -> MedusaChoices:
        problems = self.problems(num_heads=num_heads, max_draft_len=max_draft_len)
        if problems:
            raise SpecbuildError(
                f"{where}: invalid Medusa tree",
                expected="a prefix-closed list of paths, depth <= number of heads, size <= max_draft_len",
                found="; ".join(problems),
                fix="fix the listed paths, use a named tree (mc_sim_7b_63), or let `specbuild tune` build "
                "one",
            )
        return self


def default_tree(num_heads: int) -> list[list[int]] | str:
    """The tree when neither a build nor a caller names one: DEFAULT_TREE when the heads reach its depth
    (mc_sim_7b_63 needs 4), else a chain over every head."""
    if num_heads >= MedusaChoices.parse(DEFAULT_TREE).depth:
        return DEFAULT_TREE
    return [[0] * d for d in range(1, num_heads + 1)]


def _bad(found: str) -> SpecbuildError:
    return SpecbuildError(
        "cannot read Medusa choices",
        expected="a tree name (mc_sim_7b_63), a list of paths [[0], [0, 0], [1]] or the Triton form {0}, {0, "
        "0}, {1}",
        found=found[:200],
        fix="write medusa.choices as a YAML list of lists of non-negative ints",
    )
