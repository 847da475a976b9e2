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
