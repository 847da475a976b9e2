"""``block_bounds_for_model`` on the engine's reference model (curvplan_worker.curvature.model).

Oracle: the dense Hessian of the model's MSE loss w.r.t. the layer's parameters, by autograd
through ``torch.func.functional_call`` (no bounds code involved), per sample and for the dataset
mean; block norms by dense SVD.
"""

from __future__ import annotations

import json

import pytest
import torch

from curvplan_worker.curvature.bounds import (
    BoundsInputError,
    BoundsOptionError,
    block_bounds_for_model,
    layernorm_jacobian_norm,
    pair_bound,
    tightness,
)
from curvplan_worker.curvature.model import build_model

torch.set_default_dtype(torch.float64)
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")

THEORY_SPEC = {
    "d_model": 3,
    "n_heads": 1,
    "d_ff": 4,
    "n_layers": 1,
    "norm": "layernorm",
    "norm_position": "post",
    "ln_eps": 0.0,
    "norm_affine": False,
    "activation": "relu",
    "bias": False,
    "attn_output_proj": False,
    "positional": "none",
    "task": {"type": "regression", "seq_len": 3},
}
ENGINE_BLOCK = {
    "q": "attn.q",
    "k": "attn.k",
    "v": "attn.v",
    "ffn_in": "ffn_in",
    "ffn_out": "ffn_out",
}


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _model(spec: dict, scale: float = 30.0, seed: int = 0):
    model = build_model(spec, seed=seed, dtype=torch.float64)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("weight") and ".ln" not in name:
                p.mul_(scale)
    return model


def _layer_hessian(model, layer: int, inputs, targets) -> tuple[torch.Tensor, dict[str, slice]]:
    names = [f"layers.{layer}.{ENGINE_BLOCK[b]}.weight" for b in ENGINE_BLOCK]
    params = dict(model.named_parameters())
    shapes = [params[n].shape for n in names]
    flat = torch.cat([params[n].detach().reshape(-1) for n in names])

    def loss(v: torch.Tensor) -> torch.Tensor:
        chunks = torch.split(v, [s.numel() for s in shapes])
        override = {n: c.view(s) for n, c, s in zip(names, chunks, shapes, strict=True)}
        out = torch.func.functional_call(model, {**params, **override}, (inputs,))
        return ((out - targets) ** 2).mean()

    H = torch.autograd.functional.hessian(loss, flat, vectorize=True)
    offsets, start = {}, 0
    for b, s in zip(ENGINE_BLOCK, shapes, strict=True):
        offsets[b] = slice(start, start + s.numel())
        start += s.numel()
    return H, offsets


def _norm(m: torch.Tensor) -> float:
    return float(torch.linalg.matrix_norm(m, ord=2))


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {
            "ln_eps": 1e-5,
            "positional": "learned",
            "task": {"type": "regression", "seq_len": 3, "input_dim": 5},
        },
    ],
)
@pytest.mark.parametrize("mode", ["paper", "exact"])
def test_bounds_dominate_the_engine_models_hessian(overrides: dict, mode: str) -> None:
    spec = {**THEORY_SPEC, **overrides}
    model = _model(spec)
    g = torch.Generator().manual_seed(1)
    in_dim = spec["task"].get("input_dim") or spec["d_model"]
    inputs = torch.randn(4, 3, in_dim, generator=g)
    targets = torch.randn(4, 3, spec["d_model"], generator=g)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model.train()
    result = block_bounds_for_model(model, spec, inputs, targets, {"mode": mode})
    assert model.training  # the caller's mode is restored
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n])  # live weights untouched
    if overrides:  # embed + learned positions: blocks bounded, the whole model is not
        assert not result["applicable"]
        assert any(r.startswith("embed") for r in result["reasons"])
        assert any(r.startswith("positional=learned") for r in result["reasons"])
    else:
        assert result["applicable"] and result["reasons"] == []
    json.dumps(result, allow_nan=False)  # goes into result.json as is
    H, off = _layer_hessian(model, 0, inputs, targets)
    measured = {}
    for b, sl in off.items():
        measured[f"layers.0.{b}"] = _norm(H[sl, sl])
        rec = result["blocks"][f"layers.0.{b}"]
        assert rec["applicable"] and rec["reason"] is None
        assert rec["value"] >= measured[f"layers.0.{b}"], (b, rec["value"])
    for entry in result["off_diagonal"]:
        row, col = entry["row"].split(".")[-1], entry["col"].split(".")[-1]
        assert entry["value"] >= _norm(H[off[row], off[col]]), (row, col)
        assert pair_bound(result, entry["col"], entry["row"]) is entry
    assert len(result["off_diagonal"]) == 10
    # per-sample: max_over_samples and M_tr bound every per-sample Hessian (Theorem 7's M)
    for s in range(inputs.shape[0]):
        Hs, _ = _layer_hessian(model, 0, inputs[s : s + 1], targets[s : s + 1])
        assert result["M_tr"] >= _norm(Hs)
        for b, sl in off.items():
            assert result["blocks"][f"layers.0.{b}"]["max_over_samples"] >= _norm(Hs[sl, sl])
    ratios = tightness(result, measured)
    assert all(r is not None and r >= 1.0 for k, r in ratios.items() if k in measured)
    assert ratios["layers.0.ln1"] is None


def test_deeper_model_keeps_only_the_parts_that_hold() -> None:
    spec = {**THEORY_SPEC, "n_layers": 2}
    model = _model(spec, scale=20.0)
    g = torch.Generator().manual_seed(2)
    inputs, targets = torch.randn(2, 3, 3, generator=g), torch.randn(2, 3, 3, generator=g)
    result = block_bounds_for_model(model, spec, inputs, targets, None)
    first, last = result["layers"]["layers.0"], result["layers"]["layers.1"]
    assert not first["applicable"] and "downstream" in first["reasons"][0]
    assert result["blocks"]["layers.0.q"]["value"] is None
    assert "H_tr" in first and first["H_tr"]["QQ"] > 0  # the block's own bounds still hold
    assert last["applicable"] and result["blocks"]["layers.1.q"]["value"] > 0
    assert result["M_tr"] == last["M_tr"]
    # M_tr covers only the last layer, so the model as a whole is outside Theorems 5-7
    assert not result["applicable"]
    assert any(r.startswith("n_layers=2") for r in result["reasons"])
    assert result["M_tr_scope"].startswith("layers.1")


def test_outside_the_theory_reports_reasons_and_keeps_layernorm_norms() -> None:
    spec = {
        "d_model": 4,
        "n_heads": 2,
        "d_ff": 8,
        "n_layers": 1,
        "norm_position": "pre",
        "ln_eps": 1e-5,
        "activation": "gelu",
        "bias": True,
        "task": {"type": "causal_lm", "vocab_size": 7, "seq_len": 5},
    }
    model = _model(spec, scale=20.0)
    tokens = torch.randint(0, 7, (3, 5), generator=torch.Generator().manual_seed(0))
    result = block_bounds_for_model(model, spec, tokens, tokens, {})
    assert not result["applicable"]
    text = " ".join(result["reasons"])
    for word in (
        "n_heads=2",
        "norm_position=pre",
        "gelu",
        "bias",
        "W_O",
        "causal mask",
        "cross-entropy",
        "final_norm",
    ):
        assert word in text, word
    q = result["blocks"]["layers.0.q"]
    assert q["value"] is None and not q["applicable"] and "single-head" in q["reason"]
    assert result["M_tr"] is None
    # pre-LN: ln1's input is the block input X = embed + positions; its exact norms still hold
    X = model.embed.weight[tokens] + model.pos.weight[:5]
    gamma = model.layers[0].ln1.weight
    expected = max(layernorm_jacobian_norm(X[s].detach(), 1e-5, gamma) for s in range(3))
    assert result["layers"]["layers.0"]["ln_norms"]["ln1"]["jacobian_norm"] == pytest.approx(
        expected, rel=1e-10
    )
    assert result["blocks"]["layers.0.ln1"]["jacobian_norm"] == pytest.approx(expected)


def test_bad_options_and_targets_are_clear_errors() -> None:
    model = _model(THEORY_SPEC)
    x, t = torch.randn(2, 3, 3), torch.randn(2, 3, 3)
    with pytest.raises(BoundsOptionError, match="c_A"):
        block_bounds_for_model(model, THEORY_SPEC, x, t, {"c_A": "1/3"})
    with pytest.raises(BoundsOptionError, match="unknown"):
        block_bounds_for_model(model, THEORY_SPEC, x, t, {"cA": "1/2"})
    with pytest.raises(BoundsInputError, match="targets"):
        block_bounds_for_model(model, THEORY_SPEC, x, torch.randn(2, 3, 4), None)
    result = block_bounds_for_model(model, THEORY_SPEC, x, None, None)
    assert not result["applicable"] and "no targets" in result["reasons"][0]


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")
def test_attention_bounds_still_hold_for_a_pre_ln_gelu_model() -> None:
    """Outside the theory (pre-LN, GELU, affine LN) the attention-only bounds ||G_k||,
    ||Phi_kl|| are kept; they must dominate the exact derivatives of the model's attention."""
    spec = {
        **THEORY_SPEC,
        "norm_position": "pre",
        "activation": "gelu",
        "norm_affine": True,
        "ln_eps": 1e-5,
        "d_model": 4,
    }
    model = _model(spec, scale=40.0)
    inputs = torch.randn(3, 3, 4, generator=torch.Generator().manual_seed(5))
    result = block_bounds_for_model(model, spec, inputs, torch.randn(3, 3, 4), None)
    assert not result["applicable"]
    assert result["blocks"]["layers.0.q"]["value"] is None
    att = result["layers"]["layers.0"]["attention"]
    assert att["applicable"]
    bound = {key: v for key, v in att.items() if isinstance(v, float)}  # G_k, Phi_kl by name
    attn, ln1 = model.layers[0].attn, model.layers[0].ln1
    params = {n: p.detach() for n, p in attn.named_parameters()}
    keys = {"K": "k.weight", "Q": "q.weight", "V": "v.weight"}
    for s in range(3):
        x = ln1(inputs[s : s + 1]).detach()  # the attention input of a pre-LN block

        def f(a: torch.Tensor, b: torch.Tensor, i: str, j: str, x=x) -> torch.Tensor:
            return torch.func.functional_call(attn, {**params, keys[j]: b, keys[i]: a}, (x,))

        for i in keys:
            jac = torch.func.jacrev(lambda a, i=i: f(a, params[keys[i]], i, i))(params[keys[i]])
            assert _norm(jac.reshape(x.numel(), -1)) <= bound[f"G_{i}"] * (1 + 1e-9)
            for j in keys:
                if i == j:
                    second = torch.func.jacfwd(torch.func.jacrev(lambda a, i=i: f(a, a, i, i)))(
                        params[keys[i]]
                    )
                else:
                    second = torch.func.jacfwd(
                        torch.func.jacrev(lambda a, b, i=i, j=j: f(a, b, i, j), argnums=0),
                        argnums=1,
                    )(params[keys[i]], params[keys[j]])
                rows = x.numel() * params[keys[i]].numel()
                exact = _norm(second.reshape(rows, -1))
                assert exact <= bound[f"Phi_{i}{j}"] * (1 + 1e-9) + 1e-12, (s, i, j)
