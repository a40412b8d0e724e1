"""Layer ids: parsed, defaulted and checked here, the same way for every stage, and the one
conversion between the two conventions.

eagle3kit's ids follow the boundary convention (vLLM's `eagle_aux_hidden_state_layer_ids`):
id k is the input of decoder layer k, the HF `output_hidden_states[k]`; id N the last layer's
output. SGLang, SpecForge and ModelOpt count layer outputs: their id j is the output of
decoder layer j, our id j + 1. `to_layer_output` and `from_layer_output` are the only places
that shift between them.

No torch, no transformers: configs import this module.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import pairwise

from eagle3kit.errors import UserError

MIN_DEFAULT_DEPTH = 7
"""Below this many layers EAGLE-3's default ids (2, N//2, N-3) are not distinct."""
LAYERS_EXAMPLE = "2,18,33"


def to_layer_output(ids: Iterable[int]) -> list[int]:
    """Boundary ids -> layer-output ids (SGLang's `eagle_config`): one less each."""
    return [int(i) - 1 for i in ids]


def from_layer_output(ids: Iterable[int]) -> list[int]:
    """Layer-output ids (SGLang, SpecForge, ModelOpt) -> boundary ids: one more each."""
    return [int(i) + 1 for i in ids]


def parse_layer_ids(
    value: str | list[int] | tuple[int, ...] | None, flag: str = "--layers"
) -> list[int] | None:
    """ "2,18,33" -> [2, 18, 33] (a list passes through); None stays None."""
    if value is None:
        return None
    if isinstance(value, list | tuple):
        return [int(v) for v in value]
    try:
        return [int(v) for v in str(value).split(",") if v.strip()]
    except ValueError:
        raise UserError(
            f"{flag} {value}: expected comma-separated integers, e.g. {flag} {LAYERS_EXAMPLE}"
        ) from None


def default_layer_ids(num_layers: int) -> list[int]:
    """EAGLE-3's low, middle and high states in the boundary convention: 2, N//2, N-3."""
    return [2, num_layers // 2, num_layers - 3]


def check_layer_ids(
    ids: list[int], num_layers: int | None = None, count: int | None = None, flag: str = "--layers"
) -> list[int]:
    """`ids` when usable: at least one, `count` of them when a stage needs that many,
    distinct and increasing, and within 0..N once the target's depth N is known."""
    text = ",".join(map(str, ids))
    if not ids:
        raise UserError(f"{flag}: give at least one layer id, e.g. {flag} {LAYERS_EXAMPLE}")
    if count is not None and len(ids) != count:
        raise UserError(
            f"{flag} {text}: give {count} ids (low, middle, high), like {LAYERS_EXAMPLE}"
        )
    if min(ids) < 0 or any(a >= b for a, b in pairwise(ids)):
        raise UserError(
            f"{flag} {text}: ids must be distinct and increasing (low, mid, high), "
            f"like {LAYERS_EXAMPLE}"
        )
    if num_layers is not None and max(ids) > num_layers:
        n = num_layers
        raise UserError(
            f"{flag} {text}: ids must lie in 0..{n} for this {n}-layer target "
            "(boundary convention: id k is the input of layer k, id N the last "
            "layer's output)"
        )
    return list(ids)


def resolve_layer_ids(
    ids: list[int] | None, num_layers: int, count: int | None = None, flag: str = "--layers"
) -> list[int]:
    """The aux ids for a target of `num_layers`: given ones checked, or EAGLE-3's defaults."""
    if ids is not None:
        return check_layer_ids(ids, num_layers, count, flag)
    n = num_layers
    if n < MIN_DEFAULT_DEPTH:
        raise UserError(
            f"the target has {n} layers, too few for distinct default layer ids "
            f"(2, N//2, N-3); choose them with {flag}, e.g. {flag} "
            f"{','.join(str(i) for i in sorted({1, max(n // 2, 1), n}))}"
        )
    return default_layer_ids(n)
