"""Hugging Face model sources against independent oracles (float64).

* Tiny GPT-2: every uniform block's product (q/k/v slices of the fused ``c_attn`` included)
  against a dense Hessian built column by column here, with this file's own loss and plain
  ``torch.autograd`` (none of the operator's code), and against Richardson-extrapolated
  central differences of this file's own gradient; block λ_max/λ_min from the engine's Lanczos
  against ``eigvalsh`` of the exact block.
* Name maps: a reference-spec model and a GPT-2 holding the same (mapped) weights give the same
  loss and the same block spectra; deliberately wrong maps are detected.
* Llama: its RMSNorm and rotary embedding compute in float32 inside transformers, so float64
  products are accurate only to about 1e-3 against finite differences; the limit is asserted
  and reported (``precision_limited``).
* Loading as ``from_pretrained`` does (shards, prefixes, buffers, tied head) and one
  mismatch error naming every offending tensor; Hugging Face data conventions.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

pytest.importorskip("transformers")

from curvplan_worker.curvature import hf
from curvplan_worker.curvature.checkpoint import CheckpointMismatch
from curvplan_worker.curvature.model import build_model
from curvplan_worker.curvature.objective import CausalLMObjective, objective_for
from curvplan_worker.curvature.operator import CurvatureEngine, parse_member
from curvplan_worker.curvature.spectra import block_spectrum

D, HEADS, FF, VOCAB, SEQ = 8, 2, 16, 11, 6

GPT2 = {
    "model_type": "gpt2",
    "architectures": ["GPT2LMHeadModel"],
    "n_embd": D,
    "n_layer": 1,
    "n_head": HEADS,
    "n_inner": FF,
    "vocab_size": VOCAB,
    "n_positions": SEQ,
    "activation_function": "gelu",
    "layer_norm_epsilon": 1e-5,
    "bos_token_id": 0,
    "eos_token_id": 0,
}
LLAMA = {
    "model_type": "llama",
    "hidden_size": D,
    "intermediate_size": 12,
    "num_hidden_layers": 1,
    "num_attention_heads": HEADS,
    "num_key_value_heads": 1,
    "vocab_size": VOCAB,
    "max_position_embeddings": 16,
    "bos_token_id": 0,
    "eos_token_id": 0,
}


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _perturbed(config: dict, scale: float = 0.3, seed: int = 1) -> hf.HFModel:
    model = hf.build_hf_model(config, dtype=torch.float64, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen, dtype=torch.float64))
    return model


def _data(seed: int = 0, n: int = 3):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (n, SEQ), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # left padding on one example
    return hf.pack_causal_lm(ids, mask)


def _own_loss(module, flat: torch.Tensor, names, shapes, x, y) -> torch.Tensor:
    """This file's loss: mean token cross-entropy of the logits (no engine code)."""
    params, start = {}, 0
    for name, shape in zip(names, shapes, strict=True):
        size = int(np.prod(shape))
        params[name] = flat[start : start + size].view(shape)
        start += size
    logits = functional_call(module, params, (x,))
    return (
        F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-100, reduction="sum"
        )
        / (y != -100).sum()
    )


def _dense_oracle(module, x, y):
    names = [n for n, _ in module.named_parameters()]
    shapes = [p.shape for _, p in module.named_parameters()]
    w = torch.cat([p.detach().reshape(-1) for _, p in module.named_parameters()])
    w = w.clone().requires_grad_(True)
    grad = torch.autograd.grad(_own_loss(module, w, names, shapes, x, y), w, create_graph=True)[0]
    cols = [
        torch.autograd.grad(grad[j], w, retain_graph=True)[0] for j in range(w.numel())
    ]  # column by column
    offsets, start = {}, 0
    for name, shape in zip(names, shapes, strict=True):
        offsets[name] = (start, shape)
        start += int(np.prod(shape))

    def grad_at(flat):
        flat = flat.clone().requires_grad_(True)
        loss = _own_loss(module, flat, names, shapes, x, y)
        return torch.autograd.grad(loss, flat)[0]

    return torch.stack(cols, dim=1).detach(), offsets, w.detach(), grad_at


def _indices(members, offsets) -> torch.Tensor:
    """Positions of a block's members in the flat parameter vector (row-major, slices too)."""
    out = []
    for text in members:
        m = parse_member(text)
        start, shape = offsets[m.name]
        idx = torch.arange(int(np.prod(shape))).view(shape)
        if m.is_slice:
            idx = idx[..., m.start : m.stop]
        out.append(start + idx.reshape(-1))
    return torch.cat(out)


def test_gpt2_every_block_matches_dense_hessian_finite_differences_and_eigvalsh():
    model = _perturbed(GPT2)
    x, y = _data()
    module = model.module
    h, offsets, w, grad_at = _dense_oracle(module, x, y)
    assert torch.allclose(h, h.T, atol=1e-12 * float(h.abs().max()))
    blocks = hf.uniform_blocks(module, "gpt2")
    assert list(blocks) == [
        "embed",
        *(f"layers.0.{s}" for s in ("ln1", "q", "k", "v", "o", "ln2", "ffn_in", "ffn_out")),
        "final_norm",
    ]  # tied embeddings: no head block
    assert blocks["layers.0.q"] == [
        "transformer.h.0.attn.c_attn.weight[:, 0:8]",
        "transformer.h.0.attn.c_attn.bias[0:8]",
    ]
    gen = torch.Generator().manual_seed(3)
    with CurvatureEngine(module, CausalLMObjective(), [(x[:2], y[:2]), (x[2:], y[2:])]) as eng:
        for name, members in blocks.items():
            idx = _indices(members, offsets)
            exact = h[idx][:, idx]
            v = torch.randn(idx.numel(), generator=gen, dtype=torch.float64)
            product = eng.block_hvp(members, v)
            ref = exact @ v
            assert float((product - ref).norm() / ref.norm()) <= 1e-8, name
            # Richardson-extrapolated central differences of this file's gradient
            u = v / v.norm()
            full = torch.zeros_like(w)
            full[idx] = u

            def central(step, full=full, idx=idx):
                return (grad_at(w + step * full) - grad_at(w - step * full))[idx] / (2 * step)

            fd = float(v.norm()) * (4 * central(5e-4) - central(1e-3)) / 3
            assert float((product - fd).norm() / fd.norm()) <= 1e-8, name
            ev = np.linalg.eigvalsh(exact.numpy())
            spec = block_spectrum(eng, members, generator=gen, tol=1e-9, floor=1e-3)
            scale = max(abs(ev[0]), abs(ev[-1]))
            assert abs(spec.lambda_max - ev[-1]) <= 1e-6 * scale, name
            assert abs(spec.lambda_min - ev[0]) <= 1e-6 * scale, name


def _reference_spec() -> dict:
    return {
        "d_model": D,
        "n_heads": HEADS,
        "d_ff": FF,
        "n_layers": 1,
        "norm": "layernorm",
        "norm_position": "pre",
        "ln_eps": 1e-5,
        "activation": "gelu",
        "bias": True,
        "positional": "learned",
        "task": {"type": "causal_lm", "vocab_size": VOCAB, "seq_len": SEQ, "tie_embeddings": True},
    }


def _map_reference_to_gpt2(ref_state: dict, wrong: str | None = None) -> dict:
    """Reference names → GPT-2 names (Conv1D stores weights as (in, out))."""
    q, k, v = (ref_state[f"layers.0.attn.{s}.weight"].T for s in "qkv")
    qb, kb, vb = (ref_state[f"layers.0.attn.{s}.bias"] for s in "qkv")
    if wrong == "swap_qk":
        q, k, qb, kb = k, q, kb, qb
    c_fc = ref_state["layers.0.ffn_in.weight"]
    out = {
        "transformer.wte.weight": ref_state["embed.weight"],
        "transformer.wpe.weight": ref_state["pos.weight"],
        "transformer.h.0.ln_1.weight": ref_state["layers.0.ln1.weight"],
        "transformer.h.0.ln_1.bias": ref_state["layers.0.ln1.bias"],
        "transformer.h.0.attn.c_attn.weight": torch.cat([q, k, v], dim=1),
        "transformer.h.0.attn.c_attn.bias": torch.cat([qb, kb, vb]),
        "transformer.h.0.attn.c_proj.weight": ref_state["layers.0.attn.o.weight"].T,
        "transformer.h.0.attn.c_proj.bias": ref_state["layers.0.attn.o.bias"],
        "transformer.h.0.ln_2.weight": ref_state["layers.0.ln2.weight"],
        "transformer.h.0.ln_2.bias": ref_state["layers.0.ln2.bias"],
        "transformer.h.0.mlp.c_fc.weight": c_fc.T
        if wrong != "no_transpose"
        else c_fc.reshape(c_fc.shape[1], c_fc.shape[0]),
        "transformer.h.0.mlp.c_fc.bias": ref_state["layers.0.ffn_in.bias"],
        "transformer.h.0.mlp.c_proj.weight": ref_state["layers.0.ffn_out.weight"].T,
        "transformer.h.0.mlp.c_proj.bias": ref_state["layers.0.ffn_out.bias"],
        "transformer.ln_f.weight": ref_state["final_norm.weight"],
        "transformer.ln_f.bias": ref_state["final_norm.bias"],
    }
    return {n: t.contiguous() for n, t in out.items()}


def _dense_block_eigs(eng: CurvatureEngine, members) -> np.ndarray:
    n = eng.layout(members).numel
    mat = eng.block_hvp(members, torch.eye(n, dtype=torch.float64)).T
    return np.linalg.eigvalsh((0.5 * (mat + mat.T)).numpy())


def _deviation(ref_model, spec, wrong, tmp_path) -> float:
    from safetensors.torch import save_file

    state = {n: p.detach() for n, p in ref_model.named_parameters()}
    path = tmp_path / f"mapped-{wrong}.safetensors"
    save_file(_map_reference_to_gpt2(state, wrong), str(path))
    gpt2 = hf.build_hf_model(GPT2, dtype=torch.float64)
    hf.load_hf_weights(gpt2, [path])
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(0, VOCAB, (4, SEQ), generator=gen)
    x_hf, y_hf = hf.pack_causal_lm(ids)
    x_ref = ids
    y_ref = y_hf  # the same shifted next-token targets
    ref_blocks = {
        "embed": ["embed.weight", "pos.weight"],
        **{
            f"layers.0.{s}": [f"layers.0.attn.{s}.weight", f"layers.0.attn.{s}.bias"]
            for s in "qkvo"
        },
        **{
            f"layers.0.{s}": [f"layers.0.{s}.weight", f"layers.0.{s}.bias"]
            for s in ("ln1", "ln2", "ffn_in", "ffn_out")
        },
        "final_norm": ["final_norm.weight", "final_norm.bias"],
    }
    hf_blocks = hf.uniform_blocks(gpt2.module, "gpt2")
    assert set(ref_blocks) == set(hf_blocks)
    worst = 0.0
    with (
        CurvatureEngine(ref_model, objective_for(spec), [(x_ref, y_ref)]) as a,
        CurvatureEngine(gpt2.module, CausalLMObjective(), [(x_hf, y_hf)]) as b,
    ):
        worst = abs(a.loss_value - b.loss_value) / abs(a.loss_value)
        for name in ref_blocks:
            ea, eb = _dense_block_eigs(a, ref_blocks[name]), _dense_block_eigs(b, hf_blocks[name])
            scale = max(abs(ea[0]), abs(ea[-1]))
            worst = max(worst, abs(ea[-1] - eb[-1]) / scale, abs(ea[0] - eb[0]) / scale)
    return worst


def test_reference_and_gpt2_with_mapped_weights_agree_and_wrong_maps_are_caught(tmp_path):
    spec = _reference_spec()
    ref = build_model(spec, dtype=torch.float64, seed=2)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
        ref.head.bias.zero_()  # GPT-2's lm_head has no bias
    assert _deviation(ref, spec, None, tmp_path) <= 1e-8
    assert _deviation(ref, spec, "swap_qk", tmp_path) > 1e-4
    assert _deviation(ref, spec, "no_transpose", tmp_path) > 1e-4


def test_llama_float64_is_limited_by_its_float32_internals_and_says_so():
    model = _perturbed(LLAMA, scale=0.3)
    assert model.precision_limited(torch.float64)["limited"] is True
    assert model.precision_limited(torch.float32)["limited"] is False
    x, y = _data(seed=4)
    module = model.module
    h, offsets, w, grad_at = _dense_oracle(module, x, y)
    blocks = hf.uniform_blocks(module, "llama")
    assert blocks["layers.0.ffn_in"] == [
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
    ]
    assert "head" in blocks and blocks["head"] == ["lm_head.weight"]
    gen = torch.Generator().manual_seed(7)
    worst_fd = 0.0
    with CurvatureEngine(module, CausalLMObjective(), [(x, y)]) as eng:
        for name in ("layers.0.ln1", "layers.0.q", "layers.0.ffn_in", "final_norm"):
            members = blocks[name]
            idx = _indices(members, offsets)
            v = torch.randn(idx.numel(), generator=gen, dtype=torch.float64)
            product = eng.block_hvp(members, v)
            ref = h[idx][:, idx] @ v
            # the same float32-internal function differentiated by two codes: they agree to
            # float32 rounding (1e-7 measured), not to float64's
            assert float((product - ref).norm() / ref.norm()) <= 1e-5, name
            u = v / v.norm()
            full = torch.zeros_like(w)
            full[idx] = u

            def central(step, full=full, idx=idx):
                return (grad_at(w + step * full) - grad_at(w - step * full))[idx] / (2 * step)

            fd = float(v.norm()) * (4 * central(1e-2) - central(2e-2)) / 3
            worst_fd = max(worst_fd, float((product - fd).norm() / fd.norm()))
    # the reachable accuracy, asserted: within the documented limit, and (honestly) not at
    # float64 level — if transformers ever computes these in float64 this test says so.
    assert worst_fd <= hf.FLOAT32_INTERNALS_ACCURACY * 10
    assert worst_fd > 1e-9


def test_loading_accepts_shards_prefixes_buffers_and_a_tied_head(tmp_path):
    src = _perturbed(GPT2, seed=3)
    src.module.save_pretrained(tmp_path / "sharded", max_shard_size="2KB")
    shards = sorted((tmp_path / "sharded").glob("*.safetensors"))
    assert len(shards) > 1
    dst = hf.build_hf_model(GPT2, dtype=torch.float64, seed=9)
    hf.load_hf_weights(dst, shards)
    for (n, a), (_, b) in zip(
        src.module.named_parameters(), dst.module.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), n
    # base-model names (no "transformer." prefix), GPT-2's attn.bias buffer, a tied lm_head
    from safetensors.torch import save_file

    state = {
        n.removeprefix("transformer."): p.detach().float() for n, p in src.module.named_parameters()
    }
    state["h.0.attn.bias"] = torch.tril(torch.ones(1, 1, SEQ, SEQ))
    state["lm_head.weight"] = state["wte.weight"].clone()
    save_file(state, str(tmp_path / "base.safetensors"))
    again = hf.build_hf_model(GPT2, dtype=torch.float64, seed=9)
    ignored = hf.load_hf_weights(again, [tmp_path / "base.safetensors"])
    assert sorted(ignored) == ["h.0.attn.bias", "lm_head.weight"]
    wte = again.module.transformer.wte.weight
    assert torch.equal(wte, src.module.transformer.wte.weight.float().double())


def test_a_mismatch_names_every_missing_unexpected_and_misshaped_tensor(tmp_path):
    from safetensors.torch import save_file

    src = _perturbed(LLAMA, seed=3)
    state = {n: p.detach() for n, p in src.module.named_parameters()}
    del state["lm_head.weight"]
    del state["model.norm.weight"]
    state["model.layers.0.mlp.up_proj.weight"] = torch.zeros(3, 3, dtype=torch.float64)
    state["model.layers.7.extra.weight"] = torch.zeros(2, dtype=torch.float64)
    save_file(state, str(tmp_path / "bad.safetensors"))
    dst = hf.build_hf_model(LLAMA, dtype=torch.float64)
    with pytest.raises(CheckpointMismatch) as info:
        hf.load_hf_weights(dst, [tmp_path / "bad.safetensors"])
    found = {(i.name, i.problem) for i in info.value.issues}
    assert found == {
        ("lm_head.weight", "missing"),
        ("model.norm.weight", "missing"),
        ("model.layers.0.mlp.up_proj.weight", "shape"),
        ("model.layers.7.extra.weight", "unexpected"),
    }


def test_hugging_face_label_conventions_padding_and_the_models_own_loss():
    model = _perturbed(GPT2, scale=0.1)
    gen = torch.Generator().manual_seed(11)
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=gen)
    x, y = hf.validate_hf_data(model, {"input_ids": ids})
    objective = CausalLMObjective()
    with torch.no_grad():
        sums, counts = objective.example_losses(model.module, x, y)
    own = float(sums.sum() / counts.sum())
    with torch.no_grad():
        theirs = float(
            type(model.module).__mro__[1].forward(model.module, input_ids=ids, labels=ids).loss
        )
    assert abs(own - theirs) <= 1e-6 * abs(theirs)  # theirs is float32-upcast
    # explicit labels with -100 equal the mask-derived ones; left padding keeps positions
    mask = torch.ones_like(ids)
    mask[:, :2] = 0
    labels = torch.where(mask.bool(), ids, -100)
    x1, y1 = hf.validate_hf_data(model, {"input_ids": ids, "attention_mask": mask})
    x2, y2 = hf.validate_hf_data(
        model, {"input_ids": ids, "attention_mask": mask, "labels": labels}
    )
    assert torch.equal(y1, y2) and torch.equal(x1, x2)
    s_pad, c_pad = objective.example_losses(model.module, x1, y1)
    s_cut, c_cut = objective.example_losses(model.module, *hf.pack_causal_lm(ids[:, 2:]))
    assert torch.equal(c_pad, c_cut)
    assert torch.allclose(s_pad, s_cut, rtol=1e-10)
    from curvplan_worker.curvature.data import DataError

    with pytest.raises(DataError, match="labels"):
        hf.validate_hf_data(model, {"input_ids": ids, "labels": ids + VOCAB})
    with pytest.raises(DataError, match="input_ids"):
        hf.validate_hf_data(model, {"input_ids": torch.zeros(1, SEQ + 1, dtype=torch.long)})


def test_unsupported_configs_are_refused_naming_the_field():
    with pytest.raises(hf.HFModelError, match=r"model_type.*bert.*supported"):
        hf.check_config({"model_type": "bert"})
    with pytest.raises(hf.HFModelError, match="auto_map"):
        hf.check_config({**GPT2, "auto_map": {"AutoModel": "x.Y"}})
    with pytest.raises(hf.HFModelError, match="architectures"):
        hf.check_config({**GPT2, "architectures": ["GPT2ForSequenceClassification"]})
    assert hf.count_parameters(GPT2) == sum(
        p.numel() for p in hf.build_hf_model(GPT2).module.parameters()
    )


@pytest.mark.slow
def test_cli_example_and_curvature_on_a_save_pretrained_directory(tmp_path):
    """``curvplan example --arch`` writes a save_pretrained directory that ``curvplan
    curvature --model`` measures under the uniform block ids; a Llama in float64 is reported
    precision-limited; a shard from another model fails naming the tensors."""
    import json

    from typer.testing import CliRunner

    from curvplan.cli import app

    runner = CliRunner()
    for arch in ("gpt2", "llama"):
        out = tmp_path / arch
        res = runner.invoke(app, ["example", "--arch", arch, "--out", str(out), "--steps", "5"])
        assert res.exit_code == 0, res.output
        assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
        options = {
            "per_sample": False,
            "gradient_noise": False,
            "trace_probes": 0,
            "max_iter": 40,
            "tolerance": 1e-4,
        }
        (out / "options.json").write_text(json.dumps(options))
        args = ["curvature", "--model", str(out), "--data", str(out / "data.safetensors")]
        args += ["--out", str(out / "result.json"), "--options", str(out / "options.json")]
        args += ["--block", "layers.0.q", "--block", "head", "--block", "embed", "--quiet"]
        args += ["--precision", "float64", "--threads", "1", "--no-self-test"]
        res = runner.invoke(app, args)
        assert res.exit_code == 0, res.output
        result = json.loads((out / "result.json").read_text())
        assert result["model"]["architecture"] == hf.SUPPORTED_ARCHITECTURES[arch]
        names = [b["name"] for b in result["blocks"]]
        if arch == "gpt2":  # tied: no head block; q is a slice of the fused c_attn
            assert names == ["embed", "layers.0.q"]
            q = result["blocks"][1]
            assert q["params"][0] == "transformer.h.0.attn.c_attn.weight[:, 0:32]"
            assert q["slices"][0] == {
                "param": "transformer.h.0.attn.c_attn.weight",
                "dim": 1,
                "start": 0,
                "stop": 32,
            }
            assert result["precision_limited"]["limited"] is False
        else:
            assert names == ["embed", "layers.0.q", "head"]
            assert result["precision_limited"]["limited"] is True
            assert "float32" in result["precision_limited"]["reason"]
        assert all(b["bound"]["applicable"] is False for b in result["blocks"])
    # the GPT-2 directory with the Llama's weights: one error naming the tensors
    (tmp_path / "gpt2" / "model.safetensors").write_bytes(
        (tmp_path / "llama" / "model.safetensors").read_bytes()
    )
    res = runner.invoke(
        app,
        [
            "curvature",
            "--model",
            str(tmp_path / "gpt2"),
            "--data",
            str(tmp_path / "gpt2" / "data.safetensors"),
            "--out",
            str(tmp_path / "bad.json"),
            "--quiet",
        ],
    )
    assert res.exit_code == 2
    assert "missing: transformer.wte.weight" in res.output
    assert "unexpected: model.embed_tokens.weight" in res.output


def test_large_vocabularies_are_micro_batched_by_default():
    from curvplan_worker.curvature.data import Dataset
    from curvplan_worker.curvature.sources import LOGIT_BUDGET, ModelSource

    tokens = torch.zeros(8, 1024, dtype=torch.long)
    data = Dataset(torch.stack([tokens, tokens], dim=1), tokens)
    source = ModelSource("huggingface", torch.nn.Linear(1, 1), CausalLMObjective(), data, None, {})
    source.vocab_size = 50257  # GPT-2: 8 × 1024 × 50257 logits would not fit the budget
    assert source.micro_batch(None) == max(1, LOGIT_BUDGET // (1024 * 50257)) == 1
    assert source.micro_batch(4) == 4  # the caller's choice wins
    source.vocab_size = 16
    assert source.micro_batch(None) is None  # small vocabulary: one batch
