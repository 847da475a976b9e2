"""Spec, checkpoint and data validation, eval-mode handling and the loss normalisation."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from curvplan.types.spec import SpecError, parse_spec
from curvplan_worker.curvature.blocks import (
    BlockError,
    custom_blocks,
    default_blocks,
    select_blocks,
)
from curvplan_worker.curvature.checkpoint import (
    CheckpointMismatch,
    load_checkpoint,
    save_checkpoint,
)
from curvplan_worker.curvature.data import DataError, Dataset, load_dataset, save_dataset
from curvplan_worker.curvature.device import DropoutActiveError, eval_mode
from curvplan_worker.curvature.hvp import CurvatureEngine
from curvplan_worker.curvature.model import build_model
from curvplan_worker.curvature.objective import objective_for

pytestmark = pytest.mark.usefixtures("single_thread")

LM = {
    "d_model": 8,
    "n_heads": 2,
    "d_ff": 12,
    "n_layers": 1,
    "task": {"type": "causal_lm", "vocab_size": 7, "seq_len": 6},
}


def test_spec_errors_name_the_fields():
    with pytest.raises(SpecError) as err:
        parse_spec({**LM, "d_model": 9, "norm": "batchnorm"})
    fields = [f for f, _ in err.value.errors]
    assert "norm" in fields
    with pytest.raises(SpecError, match="divisible by n_heads"):
        parse_spec({**LM, "d_model": 9})
    with pytest.raises(SpecError, match="exactly one of input_dim and vocab_size"):
        parse_spec({**LM, "task": {"type": "classification", "seq_len": 4, "n_classes": 2}})
    assert parse_spec({**LM, "norm_position": "pre"}).final_norm is True
    assert parse_spec(LM).final_norm is False


def test_checkpoint_mismatch_lists_every_offending_tensor(tmp_path):
    model = build_model(LM)
    path = tmp_path / "ckpt.safetensors"
    save_checkpoint(model, path)
    from safetensors.torch import load_file, save_file

    state = load_file(str(path))
    del state["layers.0.attn.k.bias"]
    state["layers.0.attn.q.weight"] = torch.zeros(8, 4)
    state["layers.0.mlp.weight"] = torch.zeros(3)
    state["head.bias"] = torch.zeros(7, dtype=torch.int64)
    save_file(state, str(path))
    with pytest.raises(CheckpointMismatch) as err:
        load_checkpoint(build_model(LM), path)
    problems = {(i.name, i.problem) for i in err.value.issues}
    assert problems == {
        ("layers.0.attn.k.bias", "missing"),
        ("layers.0.attn.q.weight", "shape"),
        ("layers.0.mlp.weight", "unexpected"),
        ("head.bias", "dtype"),
    }
    message = str(err.value)
    for name, _ in problems:
        assert name in message
    assert err.value.as_dict()["issues"][0]["name"]


def test_checkpoint_round_trip_loads_exact_weights(tmp_path):
    model = build_model(LM, seed=3)
    save_checkpoint(model, tmp_path / "c.safetensors")
    other = load_checkpoint(build_model(LM, seed=4), tmp_path / "c.safetensors")
    for (n, p), (_, q) in zip(model.named_parameters(), other.named_parameters(), strict=True):
        assert torch.equal(p, q), n


def test_data_errors_name_the_tensor(tmp_path):
    spec = parse_spec(LM)
    path = tmp_path / "d.safetensors"
    save_dataset(Dataset(torch.randint(0, 7, (4, 6)), torch.randint(0, 9, (4, 6))), path)
    with pytest.raises(DataError, match=r"'targets'.*\[0, 7\)"):
        load_dataset(spec, path)
    save_dataset(Dataset(torch.randn(4, 6), torch.randint(0, 7, (4, 6))), path)
    with pytest.raises(DataError, match=r"'inputs'.*int64"):
        load_dataset(spec, path)
    save_dataset(Dataset(torch.randint(0, 7, (4, 9)), torch.randint(0, 7, (4, 9))), path)
    with pytest.raises(DataError, match=r"'inputs'.*sequence length 9"):
        load_dataset(spec, path)
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(2)}, str(path))
    with pytest.raises(DataError, match="missing tensor"):
        load_dataset(spec, path)


class _AlwaysTrainingDropout(nn.Dropout):
    """Monte-Carlo dropout that ignores eval(): exactly what the engine must refuse."""

    def train(self, mode: bool = True):
        return super().train(True)


def test_eval_mode_restores_the_callers_mode_and_refuses_active_dropout():
    model = build_model(LM)
    model.train()
    model.layers[0].attn.eval()  # a mixed state must come back exactly
    before = {n: m.training for n, m in model.named_modules()}
    x = torch.randint(0, 7, (3, 6))
    with CurvatureEngine(model, objective_for(LM), [(x, x)]) as eng:
        assert not any(m.training for m in model.modules())
        eng.gradient()
    assert {n: m.training for n, m in model.named_modules()} == before

    model.layers[0].drop = _AlwaysTrainingDropout(0.1)
    with pytest.raises(DropoutActiveError, match=r"layers\.0\.drop"), eval_mode(model):
        pass
    assert {n: m.training for n, m in model.named_modules() if n != "layers.0.drop"} == before


def test_engine_never_modifies_the_weights():
    model = build_model(LM, dtype=torch.float64)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    x = torch.randint(0, 7, (3, 6))
    with CurvatureEngine(model, objective_for(LM), [(x, x)]) as eng:
        names = eng.names
        eng.hvp(names, names, torch.ones(eng.layout(names).numel, dtype=torch.float64))
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n])


def test_token_weighted_loss_over_uneven_batches_equals_the_full_mean():
    model = build_model(LM, dtype=torch.float64, seed=1)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 7, (7, 6), generator=gen)
    y = torch.randint(0, 7, (7, 6), generator=gen)
    y[0, :5] = -100  # very uneven token counts per example
    y[5, 2:] = -100
    objective = objective_for(LM)
    logits = model(x)
    mask = y != -100
    full = torch.nn.functional.cross_entropy(logits[mask], y[mask])  # mean over kept tokens
    params = [p for _, p in model.named_parameters()]
    full_grad = torch.cat([g.reshape(-1) for g in torch.autograd.grad(full, params)])
    for cut in ([(0, 1), (1, 7)], [(0, 4), (4, 7)], [(0, 7)]):
        batches = [(x[a:b], y[a:b]) for a, b in cut]
        with CurvatureEngine(model, objective, batches) as eng:
            assert eng.total_count == int(mask.sum())
            assert eng.loss_value == pytest.approx(float(full.detach()), rel=1e-12)
            assert torch.allclose(eng.gradient(), full_grad, rtol=1e-10, atol=1e-14)


def test_blocks_defaults_tied_weights_and_patterns():
    spec = {**LM, "task": {**LM["task"], "tie_embeddings": True}}
    model = build_model(spec)
    blocks = default_blocks(model)
    assert blocks["embed"] == ["embed.weight", "pos.weight"]
    assert blocks["head"] == ["head.bias"]  # the tied weight lives in `embed` only
    assert blocks["layers.0.q"] == ["layers.0.attn.q.weight", "layers.0.attn.q.bias"]
    assert list(select_blocks(blocks, ["layers.0.ffn_*"])) == [
        "layers.0.ffn_in",
        "layers.0.ffn_out",
    ]
    custom = custom_blocks(model, {"attn": ["layers.0.attn.*"], "rest": ["layers.0.ln*"]})
    assert len(custom["attn"]) == 8 and len(custom["rest"]) == 4
    with pytest.raises(BlockError, match="matches no parameter"):
        custom_blocks(model, {"x": ["nope.*"]})
    with pytest.raises(BlockError, match="both block"):
        custom_blocks(model, {"a": ["layers.0.attn.q.*"], "b": ["layers.0.attn.*"]})
