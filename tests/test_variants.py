"""The drafter variants (norm_before_fc, fc_norm, norm_before_residual, norm_output, more
decoder layers, an own embedding) load from every layout `info` reads with the same tensors
and the same forward, and that forward is vLLM's (`llama_eagle3.py`), re-implemented here in
its own terms: the fused residual-add norms, the first layer's [embedding, hidden] input and the
post-norm aux output, decoding one chain over a growing key/value list."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

from eagle3kit.checkpoints.detect import inspect
from eagle3kit.checkpoints.load import load_any
from eagle3kit.checkpoints.native import save_drafter
from eagle3kit.errors import UserError
from eagle3kit.export import ExportConfig, run
from eagle3kit.model import (
    VARIANTS,
    DraftCache,
    DrafterConfig,
    Eagle3Drafter,
    TTTState,
    build_vocab,
    config_fingerprint,
)

N, V, VD, H = 8, 97, 40, 32
IDS = [2, 4, 5]

VARIANT_CASES = {
    "plain": {},
    "norm_before_fc": {"norm_before_fc": True},
    "fc_norm": {"fc_norm": True},
    "norm_output": {"norm_output": True},
    "speculators": dict(VARIANTS["speculators"]),
    "eagle3.1": dict(VARIANTS["eagle3.1"]),
    "two_layers": {"num_hidden_layers": 2, "norm_before_residual": True},
    "three_layers_3.1": {"num_hidden_layers": 3, "fc_norm": True, "norm_output": True},
    "own_embedding": {"embed_requires_grad": True, "norm_before_fc": True},
}


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("target")
    config = LlamaConfig(
        vocab_size=V,
        hidden_size=H,
        intermediate_size=64,
        num_hidden_layers=N,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    return out


def target_embedding(target: Path) -> torch.Tensor:
    from eagle3kit.checkpoints.weights import target_embedding as read

    return read(target)


def make_drafter(target: Path, seed: int = 1, **variant) -> Eagle3Drafter:
    config = DrafterConfig.from_target(
        AutoConfig.from_pretrained(target),
        draft_vocab_size=VD,
        aux_layer_ids=IDS,
        target_name_or_path=str(target),
    )
    for key, value in variant.items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    model = Eagle3Drafter(config)
    model.load_target_embedding(target_embedding(target))
    for p in model.trainable_parameters():  # norms start at 1: perturb them so a swap shows
        torch.nn.init.normal_(p, mean=1.0 if p.dim() == 1 else 0.0, std=0.3)
    vocab = build_vocab(np.random.default_rng(0).integers(0, 9, V), VD)
    model.set_vocab(torch.from_numpy(vocab.d2t), torch.from_numpy(vocab.t2d))
    return model.eval()


def save_run(model: Eagle3Drafter, target: Path, out: Path) -> Path:
    identity = {
        "path": str(target),
        "name_or_path": str(target),
        "architectures": ["LlamaForCausalLM"],
        "fingerprint": config_fingerprint(AutoConfig.from_pretrained(target)),
    }
    save_drafter(model, out / "drafter", extra={"target": identity, "layer_ids": IDS})
    (out / "run.json").write_text(json.dumps({"target": identity, "layer_ids": IDS}))
    return out


def hf_style(model: Eagle3Drafter, out: Path, *, midlayer: bool) -> Path:
    """The SGLang/SpecForge (midlayer.*) or ModelOpt (layers.i.*, eagle_config) layout, with
    the variant fields where vLLM reads them for such a config."""
    c = model.config
    out.mkdir()
    tensors = {n: t for n, t in model.state_dict().items() if n != "embed_tokens.weight"}
    if midlayer:
        tensors = {
            ("midlayer." + n[len("layers.0.") :] if n.startswith("layers.0.") else n): t
            for n, t in tensors.items()
        }
    save_file(tensors, str(out / "model.safetensors"))
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": H,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "num_hidden_layers": c.num_hidden_layers,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "max_position_embeddings": 4096,
        "vocab_size": V,
        "draft_vocab_size": VD,
        "norm_before_residual": c.norm_before_residual,
        "fc_norm": c.fc_norm,
        "norm_output": c.norm_output,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": [i - 1 for i in IDS],
            "norm_before_fc": c.norm_before_fc,
        },
    }
    (out / "config.json").write_text(json.dumps(config))
    return out


def drafts(
    model: Eagle3Drafter, aux: torch.Tensor, ids: torch.Tensor, steps: int = 3
) -> list[torch.Tensor]:
    t = ids.shape[1] - steps
    hidden, state, out = model.project(aux), TTTState(), []
    with torch.no_grad():
        for k in range(steps):
            hidden = model.ttt_step(hidden, ids[:, k : k + t], torch.arange(t)[None] + k, state)
            out.append(model.logits(hidden))
    return out


def inputs(seed: int = 5, t: int = 7, steps: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, t, 3 * H, generator=g), torch.randint(0, V, (1, t + steps), generator=g))


# The reference: vLLM's llama_eagle3.py, in its own terms ------------------------------------
def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def add_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's RMSNorm(x, residual): (norm(x + residual), x + residual)."""
    summed = x if residual is None else x + residual
    return rms(summed, weight, eps), summed


def rope(x: torch.Tensor, position: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style rotation of x [T, heads, D] at positions [T]."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = position.double()[:, None] * inv  # [T, D/2]
    cos, sin = ang.cos().float()[:, None], ang.sin().float()[:, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


class VllmStyle:
    """One request's drafter: combine_hidden_states, then model.forward per proposal step
    over a key/value list per layer (each query sees every key before it)."""

    def __init__(self, w: dict, c: DrafterConfig) -> None:
        self.w, self.c = w, c
        self.kv: list[list[tuple[torch.Tensor, torch.Tensor]]] = [
            [] for _ in range(c.num_hidden_layers)
        ]

    def combine(self, aux: torch.Tensor) -> torch.Tensor:
        w, c = self.w, self.c
        if c.norm_before_fc:
            aux = rms(aux, w["input_norm.weight"], c.rms_norm_eps)
        if c.fc_norm:
            aux = torch.cat(
                [
                    rms(chunk, w[f"fc_norm.{i}.weight"], c.rms_norm_eps)
                    for i, chunk in enumerate(aux.chunk(len(c.aux_layer_ids), -1))
                ],
                -1,
            )
        return aux @ w["fc.weight"].T

    def attention(self, i: int, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        w, c = self.w, self.c
        p = f"layers.{i}.self_attn."
        heads, kv_heads, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        q = rope((x @ w[p + "q_proj.weight"].T).view(-1, heads, d), positions, c.rope_theta)
        k = rope((x @ w[p + "k_proj.weight"].T).view(-1, kv_heads, d), positions, c.rope_theta)
        v = (x @ w[p + "v_proj.weight"].T).view(-1, kv_heads, d)
        self.kv[i].append((k, v))
        keys = torch.cat([a for a, _ in self.kv[i]]).repeat_interleave(heads // kv_heads, 1)
        values = torch.cat([b for _, b in self.kv[i]]).repeat_interleave(heads // kv_heads, 1)
        new, total = q.shape[0], keys.shape[0]
        scores = torch.einsum("qhd,khd->hqk", q, keys) / math.sqrt(d)
        allowed = torch.arange(total)[None] <= torch.arange(total - new, total)[:, None]
        probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1)
        out = torch.einsum("hqk,khd->qhd", probs, values).reshape(new, heads * d)
        return out @ w[p + "o_proj.weight"].T

    def mlp(self, i: int, x: torch.Tensor) -> torch.Tensor:
        p = f"layers.{i}.mlp."
        gate, up = x @ self.w[p + "gate_proj.weight"].T, x @ self.w[p + "up_proj.weight"].T
        return (F.silu(gate) * up) @ self.w[p + "down_proj.weight"].T

    def forward(
        self, ids: torch.Tensor, positions: torch.Tensor, hidden: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(normed hidden states for compute_logits, aux output for the next step)."""
        w, c, eps = self.w, self.c, self.c.rms_norm_eps
        embeds = w["embed_tokens.weight"][ids]
        residual = None
        for i in range(c.num_hidden_layers):
            p = f"layers.{i}."
            if i == 0:
                embeds = rms(embeds, w[p + "input_layernorm.weight"], eps)
                normed = rms(hidden, w[p + "hidden_norm.weight"], eps)
                residual = normed if c.norm_before_residual else hidden
                x = torch.cat([embeds, normed], -1)
            else:
                x, residual = add_norm(hidden, residual, w[p + "input_layernorm.weight"], eps)
            x = self.attention(i, x, positions)
            x, residual = add_norm(x, residual, w[p + "post_attention_layernorm.weight"], eps)
            hidden = self.mlp(i, x)
        normed, prenorm = add_norm(hidden, residual, w["norm.weight"], eps)
        return normed, (normed if c.norm_output else prenorm)

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        return normed @ self.w["lm_head.weight"].T


def reference_chain(
    model: Eagle3Drafter, aux: torch.Tensor, ids: torch.Tensor, t: int, steps: int
) -> list[torch.Tensor]:
    """The draft logits vLLM computes after a context ending at t, feeding ids[t+1..]."""
    ref = VllmStyle({n: x.float() for n, x in model.state_dict().items()}, model.config)
    normed, out = ref.forward(ids[0, : t + 1], torch.arange(t + 1), ref.combine(aux[0, : t + 1]))
    logits = [ref.logits(normed[-1])]
    hidden = out[-1:]
    for k in range(1, steps):
        normed, hidden = ref.forward(ids[0, t + k : t + k + 1], torch.tensor([t + k]), hidden)
        logits.append(ref.logits(normed[-1]))
    return logits


# The tests ----------------------------------------------------------------------------------
@pytest.mark.parametrize("case", list(VARIANT_CASES))
def test_forward_is_vllms(case, target):
    """Training-time test, chain decoding and the vLLM-style reference give the same logits at
    every step, for each variant."""
    model = make_drafter(target, **VARIANT_CASES[case])
    aux, ids = inputs()
    t_len, steps = aux.shape[1], 3
    ttt = drafts(model, aux, ids, steps)
    for t in (0, 3, t_len - 1):
        expected = reference_chain(model, aux, ids, t, steps)
        cache = DraftCache()
        with torch.no_grad():
            h = model.decode(
                model.project(aux[:, : t + 1]), ids[:, : t + 1], torch.arange(t + 1)[None], cache
            )[:, -1:]
            for k in range(steps):
                torch.testing.assert_close(ttt[k][0, t], expected[k], rtol=1e-4, atol=1e-4)
                torch.testing.assert_close(model.logits(h)[0, 0], expected[k], rtol=1e-4, atol=1e-4)
                if k < steps - 1:
                    h = model.decode(
                        h, ids[:, t + k + 1 : t + k + 2], torch.tensor([[t + k + 1]]), cache
                    )
    if case != "plain":  # the variant changes the function: the check has teeth
        plain = make_drafter(target)
        plain.load_state_dict(model.state_dict(), strict=False)
        assert not torch.allclose(drafts(plain, aux, ids, steps)[-1], ttt[-1], atol=1e-3)


def test_plain_drafter_state_is_unchanged(target):
    """The default drafter has exactly the tensors it always had (exports stay identical)."""
    names = list(make_drafter(target).state_dict())
    assert names == [
        "d2t",
        "t2d",
        "embed_tokens.weight",
        "fc.weight",
        *[
            f"layers.0.{n}"
            for n in (
                "self_attn.q_proj.weight",
                "self_attn.k_proj.weight",
                "self_attn.v_proj.weight",
                "self_attn.o_proj.weight",
                "mlp.gate_proj.weight",
                "mlp.up_proj.weight",
                "mlp.down_proj.weight",
                "input_layernorm.weight",
                "hidden_norm.weight",
                "post_attention_layernorm.weight",
            )
        ],
        "norm.weight",
        "lm_head.weight",
    ]


@pytest.mark.parametrize("case", list(VARIANT_CASES))
def test_every_layout_loads_the_variant(case, target, tmp_path):
    variant = VARIANT_CASES[case]
    model = make_drafter(target, **variant)
    run_dir = save_run(model, target, tmp_path / "run")
    out = tmp_path / "export"
    run(ExportConfig(run_dir, out, format="vllm", dtype="fp32"))
    exported = json.loads((out / "config.json").read_text())
    full = {**VARIANTS["eagle3"], **variant}
    for key in (
        "norm_before_residual",
        "norm_before_fc",
        "fc_norm",
        "norm_output",
        "embed_requires_grad",
    ):
        assert exported[key] is full[key], key
    assert exported["transformer_layer_config"]["num_hidden_layers"] == full["num_hidden_layers"]
    paths = {"eagle3kit": run_dir / "drafter", "speculators": out}
    if not full["embed_requires_grad"]:  # the HF-style layouts have no field for it
        paths["modelopt"] = hf_style(model, tmp_path / "modelopt", midlayer=False)
        if full["num_hidden_layers"] == 1:
            paths["sglang"] = hf_style(model, tmp_path / "sglang", midlayer=True)
    aux, ids = inputs()
    expected = drafts(model, aux, ids)
    foreign = torch.randn(V, H)  # a target embedding the own-embedding drafter must not take
    for layout, path in paths.items():
        info = inspect(path, target)
        assert info.layout == layout
        assert info.problems == [], (layout, info.problems)
        assert info.variant == {k: full[k] for k in info.variant}, layout
        assert info.norm_before_residual is full["norm_before_residual"]
        own = full["embed_requires_grad"]
        loaded, _ = load_any(path, embedding=foreign if own else target_embedding(target))
        state = loaded.state_dict()
        for name, tensor in model.state_dict().items():
            assert torch.equal(state[name], tensor), (layout, name)
        got = drafts(loaded.eval(), aux, ids)
        for a, b in zip(got, expected, strict=True):
            assert torch.equal(a, b), layout


def test_own_embedding_is_stored_and_kept(target, tmp_path):
    model = make_drafter(target, embed_requires_grad=True)
    with torch.no_grad():
        model.embed_tokens.weight.add_(0.5)  # trained away from the target's
    assert model.embed_tokens.weight.requires_grad
    run_dir = save_run(model, target, tmp_path / "run")
    out = tmp_path / "export"
    result = run(ExportConfig(run_dir, out, dtype="fp32", with_embedding=True))
    assert any("its own embedding" in w for w in result.warnings)
    for path in (run_dir / "drafter", out):
        info = inspect(path, target)
        assert info.has_embedding and info.problems == []  # not "differs from the target's"
        loaded, _ = load_any(path, embedding=target_embedding(target))
        assert torch.equal(loaded.embed_tokens.weight, model.embed_tokens.weight)


def test_sglang_export_of_a_variant_is_refused(target, tmp_path):
    run_dir = save_run(make_drafter(target, norm_output=True), target, tmp_path / "run")
    with pytest.raises(UserError, match=r"--format sglang.*norm_output.*--format vllm"):
        run(ExportConfig(run_dir, tmp_path / "out", format="sglang"))
    assert not (tmp_path / "out").exists()


def edit_export(
    model: Eagle3Drafter, target: Path, tmp: Path, config_edit=None, tensor_edit=None
) -> Path:
    run_dir = save_run(model, target, tmp / "run")
    out = tmp / "export"
    run(ExportConfig(run_dir, out, dtype="fp32"))
    config = json.loads((out / "config.json").read_text())
    if config_edit:
        config_edit(config)
    (out / "config.json").write_text(json.dumps(config))
    if tensor_edit:
        from safetensors.torch import load_file

        tensors = load_file(str(out / "model.safetensors"))
        tensor_edit(tensors)
        save_file(tensors, str(out / "model.safetensors"))
    return out


@pytest.mark.parametrize(
    "variant, config_edit, tensor_edit, found",
    [
        (
            {"norm_before_fc": True},
            lambda c: c.update(norm_before_fc=False),
            None,
            "input_norm.weight present but norm_before_fc is not set",
        ),
        (
            {"fc_norm": True},
            lambda c: c.update(fc_norm=False),
            None,
            "fc_norm.* tensors present but fc_norm is not set",
        ),
        (
            {"num_hidden_layers": 2},
            lambda c: c["transformer_layer_config"].update(num_hidden_layers=1),
            None,
            "num_hidden_layers is 1 but the weights hold 2 decoder layers",
        ),
        (
            {"embed_requires_grad": True},
            None,
            lambda t: t.pop("embed_tokens.weight"),
            "embed_requires_grad is true but the checkpoint has no embed_tokens.weight",
        ),
    ],
)
def test_a_config_that_hides_the_variant_is_reported_and_not_loaded(
    target, tmp_path, variant, config_edit, tensor_edit, found
):
    path = edit_export(make_drafter(target, **variant), target, tmp_path, config_edit, tensor_edit)
    assert any(p.startswith(found) for p in inspect(path, target).problems)
    with pytest.raises(UserError, match="cannot load"):
        load_any(path, embedding=target_embedding(target))


def test_norm_before_fc_without_its_tensor_uses_weight_one(target, tmp_path):
    """speculators and vLLM leave a missing input_norm at its initial weight 1."""
    model = make_drafter(target, norm_before_fc=True)
    path = edit_export(model, target, tmp_path, tensor_edit=lambda t: t.pop("input_norm.weight"))
    info = inspect(path, target)
    assert info.problems == [] and any("no input_norm.weight" in w for w in info.warnings)
    loaded, _ = load_any(path, embedding=target_embedding(target))
    assert torch.equal(loaded.input_norm.weight, torch.ones(3 * H))


def test_bad_variant_combinations_are_refused(target, tmp_path):
    with pytest.raises(ValueError, match="exclude each other"):
        make_drafter(target, norm_before_fc=True, fc_norm=True).config.__post_init__()
    path = edit_export(
        make_drafter(target),
        target,
        tmp_path,
        config_edit=lambda c: c.update(norm_before_fc=True, fc_norm=True),
    )
    assert any(
        p.startswith("norm_before_fc and fc_norm are both set")
        for p in inspect(path, target).problems
    )
    with pytest.raises(UserError, match=r"config\.json: norm_before_fc and fc_norm exclude"):
        load_any(path, embedding=target_embedding(target))
