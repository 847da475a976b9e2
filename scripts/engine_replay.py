"""Run a fixed set of small engine analyses and print one sha256 over their outputs, so that a
refactor of the engine (or of what the analyze job derives from its result) can be shown to
leave every output byte-equal.

    OMP_NUM_THREADS=1 python scripts/engine_replay.py /tmp/engine-before
    ... change the tree ...
    OMP_NUM_THREADS=1 python scripts/engine_replay.py /tmp/engine-after
    diff -r /tmp/engine-before /tmp/engine-after

The runs (seconds of CPU each, one thread, float64 where the model allows): the bundled example
model (``curvplan example``, a few training steps) with every stage on — full run, a block
fan-out's two children and the fan-in that assembles their records — and a tiny Hugging Face
GPT-2 (random weights from a fixed seed). For each run the script writes:

* ``<run>.result.json``: the engine's result JSON without the fields that measure the machine
  rather than the model (wall-clock times, peak memory, timings of the cost model, versions);
* ``<run>.slim.json`` and ``<run>.arrays.txt``: what the job stores (the slim result and a
  sha256 of every bulky array moved to artifacts);
* ``<run>.planner.txt``: the planner's ``Measurements`` derived from the result (with the
  gradient noise of one intermediate checkpoint for the example), the notes, the inline
  planner inputs and the recommendation ``make_plan`` gives with default targets.

Floats are written by ``float.hex`` so that equal digests mean equal bits.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

#: Keys whose values measure the machine or the clock, not the model (dropped at any depth).
VOLATILE = {
    "elapsed_s",
    "peak_memory_bytes",
    "peak_memory_source",
    "versions",
    "ms_per_product",
    "first_product_ms",
    "seconds",
    "setup_seconds",
    "example",
    "timings",
    "wall_s",
    "round_ms",
    "iteration_ms",
    "product_ms",
    "ms",
    "spectra",
    "measured_bytes",
    "per_example_bytes",
    "per_batch_bytes",
    "fixed_bytes",
    "budget",
    "budget_bytes",
    "source",
    "memory",
    "stages",
    "lockstep",
}


def _volatile(key: str) -> bool:
    return key in VOLATILE or key.endswith("_ms") or key.endswith("_seconds")


def canonical(value: Any) -> Any:
    """JSON-able, bit-exact: floats as hex, volatile keys dropped."""
    if isinstance(value, float):
        return value.hex() if math.isfinite(value) else repr(value)
    if isinstance(value, dict):
        return {str(k): canonical(v) for k, v in value.items() if not _volatile(str(k))}
    if isinstance(value, list | tuple):
        return [canonical(v) for v in value]
    if hasattr(value, "model_dump"):
        return canonical(value.model_dump(mode="json"))
    return value


def _write(out: Path, name: str, value: Any) -> None:
    (out / name).write_text(json.dumps(canonical(value), indent=1, sort_keys=True) + "\n")


def _example(root: Path) -> tuple[dict[str, Any], str, str, str]:
    from curvplan_worker.curvature.example import EXAMPLE_SPEC, write_example

    write_example(root, steps=30, n_eval=12, n_train=64, checkpoint_steps=(10,))
    spec = json.loads(json.dumps(EXAMPLE_SPEC))
    return (
        spec,
        str(root / "checkpoint.safetensors"),
        str(root / "data.safetensors"),
        str(root / "step_10.safetensors"),
    )


GPT2 = {
    "model_type": "gpt2",
    "architectures": ["GPT2LMHeadModel"],
    "n_embd": 8,
    "n_layer": 1,
    "n_head": 2,
    "n_inner": 16,
    "vocab_size": 11,
    "n_positions": 6,
    "activation_function": "gelu",
    "layer_norm_epsilon": 1e-5,
    "bos_token_id": 0,
    "eos_token_id": 0,
}


def _gpt2(root: Path) -> tuple[dict[str, Any], str, str]:
    from safetensors.torch import save_file

    from curvplan_worker.curvature import hf

    root.mkdir(parents=True, exist_ok=True)
    model = hf.build_hf_model(GPT2, dtype=torch.float32, seed=3)
    hf.save_hf_weights(model, root / "model.safetensors")
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 11, (6, 6), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    save_file({"input_ids": ids, "attention_mask": mask}, str(root / "data.safetensors"))
    return (
        {"source": "huggingface", "config": GPT2},
        str(root / "model.safetensors"),
        str(root / "data.safetensors"),
    )


OPTIONS = {
    "precision": "float64",
    "tolerance": 1e-3,
    "max_iter": 30,
    "top_k": 2,
    "trace_probes": 4,
    "ggn": True,
    "blocks": ["layers.0.q", "layers.1.ffn_out", "final_norm"],
    "off_diagonal": [["layers.0.q", "layers.1.ffn_out"], ["final_norm", "layers.0.q"]],
    "per_sample": True,
    "n_directions": 2,
    "top_d": 2,
    "hessian_subsample": 2,
    "gradient_noise": True,
    "noise_grad_examples": 4,
    "noise_hessian_examples": 2,
    "bounds": True,
    "dense": "off",
    "seed": 7,
}


def _noise(spec: dict[str, Any], checkpoint: str, data: str) -> Any:
    """The gradient noise at one intermediate checkpoint, as the analyze job computes it."""
    from curvplan_worker.curvature.analyze import _clean
    from curvplan_worker.curvature.gradient_noise import gradient_noise_from_sample
    from curvplan_worker.curvature.sources import load_source, parse_model

    source = load_source(parse_model(spec), [checkpoint], data, dtype=torch.float64)
    assert source.data is not None
    model = source.module.to(dtype=torch.float64)
    x, y = source.data.inputs, source.data.targets
    if x.is_floating_point():
        x = x.double()
    stats = _clean(
        gradient_noise_from_sample(
            model, source.objective, x, y, n_grad=4, n_hessian=2, seed=7, batch_size=32
        )
    )
    stats.pop("grad_indices", None)
    stats.pop("hessian_indices", None)
    stats["checkpoint"] = "step_10.safetensors (step 10)"
    stats["step"] = 10
    try:  # typed where the analyze job types them
        from curvplan.types.results import GradientNoiseEstimate as Noise
    except ImportError:
        try:
            from curvplan_worker.curvature.measured import GradientNoiseRecord as Noise
        except ImportError:
            return stats
    return Noise.model_validate(stats)


def _derived(out: Path, name: str, result: Any, noise: list[Any]) -> None:
    """What the analyze job derives from an engine result: stored outputs, planner inputs."""
    import numpy as np

    from curvplan.types.planner import Targets
    from curvplan_core.planner import make_plan
    from curvplan_worker.analyze import pipeline
    from curvplan_worker.analyze.measurements import planner_fields, split_bulky

    slim, groups = split_bulky(result)
    _write(out, f"{name}.slim.json", slim)
    lines = []
    for group in sorted(groups):
        for key in sorted(groups[group]):
            array = np.ascontiguousarray(groups[group][key])
            digest = hashlib.sha256(array.tobytes()).hexdigest()
            lines.append(f"{group} {key} {array.dtype.str} {list(array.shape)} {digest}")
    (out / f"{name}.arrays.txt").write_text("\n".join(lines) + "\n")
    fields, notes = planner_fields(result, noise)
    measurements = pipeline._measurements(fields)
    outputs = {g: f"artifact-{g}" for g in groups}
    inline = pipeline._inline_planner_inputs(fields, outputs, result)
    if hasattr(inline, "model_dump"):  # typed: what the job stores (the fields it was given)
        inline = inline.model_dump(exclude_unset=True)
    plan = make_plan(measurements, Targets(), seed=5)
    _write(
        out,
        f"{name}.planner.json",
        {
            "measurements": json.loads(measurements.model_dump_json()),
            "notes": notes,
            "inline": inline,
        },
    )
    (out / f"{name}.plan.json").write_text(plan.model_dump_json(indent=1) + "\n")


def _run(*args: Any, **kwargs: Any) -> tuple[dict[str, Any], Any]:
    """(result JSON, what the analyze job derives its outputs from): the typed measurements
    where the engine has them (``measure``), else the result JSON itself."""
    from curvplan_worker.curvature import analyze as engine

    if not hasattr(engine, "measure"):
        result = engine.analyze(*args, **kwargs)
        return result, result
    from curvplan.types.options import parse_options
    from curvplan_worker.curvature.sources import parse_model

    spec, checkpoint, data, options = args
    measured = engine.measure(parse_model(spec), checkpoint, data, parse_options(options), **kwargs)
    assert measured is not None
    if hasattr(measured, "as_result"):
        return measured.as_result(), measured
    from curvplan_worker.curvature.measured import as_result

    return as_result(measured), measured


def _records(child: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    """A child's block and pair records as the fan-in reads them back from its stored result
    (typed where the engine types them)."""
    blocks, pairs = json.loads(json.dumps([child["blocks"], child["off_diagonal"]]))
    try:
        from curvplan.types.results import BlockPair as Pair
        from curvplan.types.results import BlockSpectrum as Block
    except ImportError:
        try:
            from curvplan_worker.curvature.measured import BlockRecord as Block
            from curvplan_worker.curvature.measured import PairRecord as Pair
        except ImportError:
            return blocks, pairs
    return (
        [Block.model_validate(b) for b in blocks],
        [Pair.model_validate(p) for p in pairs],
    )


def run_all(out: Path) -> str:
    from curvplan.types.options import MachineSettings
    from curvplan.types.spec import parse_spec
    from curvplan_worker.curvature.analyze import BlockShare, MeasuredBlocks, analyze, plan_blocks

    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    machine = MachineSettings(device="cpu", threads=1, self_test=False)
    with tempfile.TemporaryDirectory() as tmp:
        spec, checkpoint, data, step10 = _example(Path(tmp) / "example")
        noise = [_noise(spec, step10, data)]
        full, typed = _run(parse_spec(spec), checkpoint, data, OPTIONS, machine=machine)
        _write(out, "example.result.json", full)
        _derived(out, "example", typed, noise)
        # the same run from the JSON forms (spec and options parsed by the engine)
        again = analyze(spec, checkpoint, data, dict(OPTIONS), machine=machine)
        _write(out, "example-json.result.json", again)
        # a block fan-out: two children, then the fan-in with their records
        plan = plan_blocks(spec, checkpoint, data, OPTIONS)
        names = list(plan.blocks)
        pairs = [(r, c) for r, c, _, _ in plan.pairs]
        half = len(names) // 2
        shares = [
            BlockShare(tuple(names[:half]), tuple(pairs[: len(pairs) // 2])),
            BlockShare(tuple(names[half:]), tuple(pairs[len(pairs) // 2 :])),
        ]
        blocks: list[Any] = []
        off: list[Any] = []
        for i, share in enumerate(shares):
            child = analyze(spec, checkpoint, data, OPTIONS, machine=machine, only=share)
            _write(out, f"example-child{i}.result.json", child)
            # the children's records as the fan-in reads them back from their stored results
            child_blocks, child_pairs = _records(child)
            blocks += child_blocks
            off += child_pairs
        fan_in, typed = _run(
            spec,
            checkpoint,
            data,
            OPTIONS,
            machine=machine,
            measured=MeasuredBlocks(blocks=blocks, off_diagonal=off),
        )
        _write(out, "example-fanin.result.json", fan_in)
        _derived(out, "example-fanin", typed, noise)
        hf_spec, hf_checkpoint, hf_data = _gpt2(Path(tmp) / "gpt2")
        hf_options = {
            **OPTIONS,
            "blocks": ["layers.0.q", "layers.0.ffn_in", "final_norm"],
            "off_diagonal": [["layers.0.q", "final_norm"]],
        }
        gpt2, typed = _run(hf_spec, [hf_checkpoint], hf_data, hf_options, machine=machine)
        _write(out, "gpt2.result.json", gpt2)
        _derived(out, "gpt2", typed, [])
    total = hashlib.sha256()
    for path in sorted(out.iterdir()):
        total.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return total.hexdigest()


if __name__ == "__main__":
    target = Path(sys.argv[1])
    digest = run_all(target)
    print(f"{len(list(target.iterdir()))} outputs: sha256 {digest}")
