"""The client reads save_pretrained directories itself: config inline, every shard, checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_hf_models import GPT2_CONFIG, LLAMA_CONFIG, save_tiny

from curvplan.client.pretrained import PretrainedDirError, is_pretrained_dir, read_pretrained

pytest.importorskip("transformers")


def test_sharded_directory_lists_every_shard_of_the_index(tmp_path: Path) -> None:
    out = save_tiny(GPT2_CONFIG, tmp_path / "gpt2", max_shard_size="2KB")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1  # the oracle: transformers really sharded it

    pretrained = read_pretrained(out)
    assert [p.name for p in pretrained.shards] == files
    assert pretrained.config == json.loads((out / "config.json").read_text())
    assert pretrained.model == {"source": "huggingface", "config": pretrained.config}
    assert is_pretrained_dir(out) and is_pretrained_dir(str(out))
    assert not is_pretrained_dir(out / "config.json")


def test_single_file_directory(tmp_path: Path) -> None:
    out = save_tiny(LLAMA_CONFIG, tmp_path / "llama")
    assert [p.name for p in read_pretrained(out).shards] == ["model.safetensors"]


def test_a_stale_or_missing_shard_is_named_before_any_upload(tmp_path: Path) -> None:
    out = save_tiny(GPT2_CONFIG, tmp_path / "gpt2", max_shard_size="2KB")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    moved = index["weight_map"]["transformer.wte.weight"]
    index["weight_map"]["transformer.wte.weight"] = "elsewhere.safetensors"
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(PretrainedDirError, match=r"elsewhere\.safetensors.*missing"):
        read_pretrained(out)
    from safetensors.numpy import load_file, save_file

    wte = load_file(str(out / moved))["transformer.wte.weight"]
    save_file({"transformer.wte.weight": wte}, str(out / "elsewhere.safetensors"))
    with pytest.raises(PretrainedDirError, match=r"not in the index: transformer\.wte\.weight$"):
        read_pretrained(out)  # moved still holds wte, which the index no longer puts there

    index["weight_map"]["transformer.wte.weight"] = "../outside.safetensors"
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(PretrainedDirError, match="not a file name"):
        read_pretrained(out)


def test_refused_configs_and_pickles_fail_locally(tmp_path: Path) -> None:
    out = save_tiny(GPT2_CONFIG, tmp_path / "gpt2")
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoModel": "a.B"}}))
    with pytest.raises(PretrainedDirError, match="auto_map"):
        read_pretrained(out)
    (out / "config.json").write_text(json.dumps(config))
    (out / "model.safetensors").rename(out / "pytorch_model.bin")
    with pytest.raises(PretrainedDirError, match="safe_serialization"):
        read_pretrained(out)


def test_analyze_sources_sort_out_directories_files_and_ids(tmp_path: Path) -> None:
    import uuid

    from curvplan.client._common import analyze_sources

    out = save_tiny(GPT2_CONFIG, tmp_path / "gpt2", max_shard_size="2KB")
    shards = list(read_pretrained(out).shards)
    data = out / "model.safetensors.index.json"  # any existing file stands in for the data
    known = str(uuid.uuid4())
    sources = analyze_sources(str(out), None, data, [out, known, [known, shards[0]]])
    assert sources.model["source"] == "huggingface"
    assert sources.checkpoint == shards and sources.dataset == data
    assert sources.intermediates == [shards, known, [known, shards[0]]]
    assert sources.uploads() == [*((s, "checkpoint") for s in shards), (data, "dataset")]
    ids = {path: f"id-{i}" for i, (path, _) in enumerate(sources.uploads())}
    checkpoint, dataset, intermediates = sources.resolved(ids)
    assert checkpoint == [ids[s] for s in shards] and dataset == ids[data]
    assert intermediates[1:] == [known, [known, ids[shards[0]]]]

    with pytest.raises(ValueError, match="do not give both"):
        analyze_sources(out, known, data, [])
    with pytest.raises(ValueError, match="not a save_pretrained directory"):
        analyze_sources(str(tmp_path), None, data, [])
    with pytest.raises(ValueError, match="give the weights"):
        analyze_sources({"d_model": 8}, None, data, [])
    with pytest.raises(FileNotFoundError, match="dataset"):
        analyze_sources(out, None, tmp_path / "missing.safetensors", [])
