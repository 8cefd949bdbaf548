"""One line of meaning and the default for every config key, for `grpo-engine --help`.

The engine's dataclasses document their fields with comments (trailing, or the lines right above the
field); those comments are read from the source, so the help cannot drift from them. The kernels'
`GRPOLossConfig` has no field comments, so its lines are kept here.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import tokenize
import typing
from typing import Any

from grpo_kernels import GRPOLossConfig
from grpo_kernels.losses import loss_type_names

from .config import EngineConfig

LOSS_HELP = {
    "loss_type": f"the objective: {', '.join(loss_type_names())} (TRL's names; grpo_kernels.register_loss_type "
                 "adds one)",
    "beta": "KL coefficient against the starting model (0: no reference model)",
    "epsilon": "lower clipping range of the importance ratio (1 - epsilon)",
    "epsilon_high": "upper clipping range (1 + epsilon_high; null: epsilon)",
    "delta": "two-sided clipping: cap on the importance ratio (> 1; null: off)",
    "importance_sampling_level": "importance ratio per token or per sequence (GSPO)",
    "temperature": "follows rollout.temperature (set that one)",
    "max_completion_length": "the fixed normaliser of the loss types that divide by it (follows "
                             "rollout.max_new_tokens)",
    "use_bias_correction_kl": "weight the KL by the importance ratio (off-policy correction)",
    "sapo_temperature_pos": "sapo: gate temperature for positive advantages",
    "sapo_temperature_neg": "sapo: gate temperature for negative advantages",
    "vespo_k_pos": "vespo: shape k for positive advantages",
    "vespo_lambda_pos": "vespo: rate lambda for positive advantages",
    "vespo_k_neg": "vespo: shape k for negative advantages",
    "vespo_lambda_neg": "vespo: rate lambda for negative advantages",
    "entropy_coef": "entropy bonus coefficient (0: off)",
    "top_entropy_quantile": "train only on the highest-entropy fraction of tokens (1: all)",
}


def field_comments(cls: type) -> dict[str, str]:
    """{field: comment} from the class source: the comment on the field's line, else the comment lines
    directly above it."""
    lines, _ = inspect.getsourcelines(cls)
    comments: dict[int, str] = {}  # line number -> comment text
    code_lines: set[int] = set()  # lines holding code
    for token in tokenize.generate_tokens(io.StringIO("".join(lines)).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
        elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            code_lines.add(token.start[0])
    names = {f.name for f in dataclasses.fields(cls)}
    result = {}
    for number, line in enumerate(lines, start=1):
        name = line.strip().split(":", 1)[0]
        if name not in names or not line.startswith("    ") or line.startswith("     "):
            continue
        if number in comments:
            result[name] = comments[number]
            continue
        above, previous = [], number - 1
        while previous in comments and previous not in code_lines:
            above.insert(0, comments[previous])
            previous -= 1
        if above:
            result[name] = " ".join(above)
    return result


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()  # type: ignore[misc]


def key_help(cls: type = EngineConfig, prefix: str = "") -> dict[str, str]:
    """{dotted key: "meaning (default: value)"} for every leaf key of the tree."""
    hints = typing.get_type_hints(cls)
    comments = LOSS_HELP if cls is GRPOLossConfig else field_comments(cls)
    result = {}
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            result.update(key_help(hints[f.name], f"{prefix}{f.name}."))
            continue
        default = _default(f)
        shown = "null" if default is None else str(default).lower() if isinstance(default, bool) else default
        meaning = comments.get(f.name, "")
        result[f"{prefix}{f.name}"] = f"{meaning} (default: {shown})" if meaning else f"(default: {shown})"
    return result
