"""The reference Transformer family built from a :class:`ModelSpec` (engine contract).

Parameter names are part of the contract (checkpoints use exactly these):
``embed.weight`` (token embedding, or input projection ``embed.weight``/``embed.bias``),
``pos.weight`` (learned positions), per layer ``layers.{i}.ln1.*``, ``layers.{i}.attn.{q,k,v,o}.*``,
``layers.{i}.ln2.*``, ``layers.{i}.ffn_in.*``, ``layers.{i}.ffn_out.*``, ``final_norm.*``,
``head.weight|bias``. ``nn.Linear`` convention: ``weight`` is (out, in), so the paper's
W_Q = ``attn.q.weight.T`` and W_1 = ``ffn_in.weight.T``.

Attention is an explicit matmul-softmax (no fused SDPA kernel), so every operation has second
derivatives on every device. Norms are written out so that ``ln_eps = 0`` (the theory,
Petrov et al. 2025 Assumption 2) means exactly zero. There is no dropout anywhere.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from curvplan.types.spec import (
    CausalLMTask,
    ClassificationTask,
    ModelSpec,
    RegressionTask,
    parse_spec,
)


class Norm(nn.Module):
    """LayerNorm (biased variance, Petrov et al. 2025 §3.2) or RMSNorm over the last dim.

    ``eps`` is added to the variance (mean square); 0 is allowed. With ``affine`` a
    ``weight`` (and for LayerNorm with ``bias`` a ``bias``) parameter is learned.
    """

    def __init__(self, kind: str, dim: int, eps: float, affine: bool, bias: bool) -> None:
        super().__init__()
        self.kind = kind
        self.eps = float(eps)
        self.dim = dim
        if affine:
            self.weight = nn.Parameter(torch.ones(dim))
            if kind == "layernorm" and bias:
                self.bias = nn.Parameter(torch.zeros(dim))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, x: Tensor) -> Tensor:
        if self.kind == "layernorm":
            mu = x.mean(dim=-1, keepdim=True)
            xc = x - mu
            var = (xc * xc).mean(dim=-1, keepdim=True)
            y = xc * torch.rsqrt(var + self.eps)
        else:
            ms = (x * x).mean(dim=-1, keepdim=True)
            y = x * torch.rsqrt(ms + self.eps)
        if self.weight is not None:
            y = y * self.weight
        if self.bias is not None:
            y = y + self.bias
        return y


class Attention(nn.Module):
    """Multi-head self-attention softmax(Q Kᵀ/√d_head) V (Petrov et al. 2025 §1.3 for 1 head)."""

    def __init__(self, spec: ModelSpec, causal: bool) -> None:
        super().__init__()
        d = spec.d_model
        self.n_heads = spec.n_heads
        self.d_head = spec.d_head
        self.causal = causal
        self.q = nn.Linear(d, d, bias=spec.bias)
        self.k = nn.Linear(d, d, bias=spec.bias)
        self.v = nn.Linear(d, d, bias=spec.bias)
        self.o = nn.Linear(d, d, bias=spec.bias) if spec.attn_output_proj else None

    def forward(self, x: Tensor) -> Tensor:
        n, t, d = x.shape
        h, dh = self.n_heads, self.d_head
        q = self.q(x).view(n, t, h, dh).transpose(1, 2)
        k = self.k(x).view(n, t, h, dh).transpose(1, 2)
        v = self.v(x).view(n, t, h, dh).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(dh)
        if self.causal:
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(mask, float("-inf"))
        attn = torch.softmax(scores, dim=-1)
        out = torch.matmul(attn, v).transpose(1, 2).reshape(n, t, d)
        return self.o(out) if self.o is not None else out


class Block(nn.Module):
    """One Transformer block: post-LN (paper) or pre-LN."""

    def __init__(self, spec: ModelSpec, causal: bool) -> None:
        super().__init__()
        self.pre = spec.norm_position == "pre"
        self.ln1 = Norm(spec.norm, spec.d_model, spec.ln_eps, spec.norm_affine, spec.bias)
        self.attn = Attention(spec, causal)
        self.ln2 = Norm(spec.norm, spec.d_model, spec.ln_eps, spec.norm_affine, spec.bias)
        self.ffn_in = nn.Linear(spec.d_model, spec.d_ff, bias=spec.bias)
        self.ffn_out = nn.Linear(spec.d_ff, spec.d_model, bias=spec.bias)
        self.gelu = spec.activation == "gelu"

    def ffn(self, x: Tensor) -> Tensor:
        hidden = self.ffn_in(x)
        hidden = F.gelu(hidden) if self.gelu else F.relu(hidden)
        return self.ffn_out(hidden)

    def forward(self, x: Tensor) -> Tensor:
        if self.pre:
            x = x + self.attn(self.ln1(x))
            return x + self.ffn(self.ln2(x))
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.ffn(x))


def sinusoidal_positions(seq_len: int, dim: int) -> Tensor:
    """Fixed sinusoidal position table (Vaswani et al. 2017, §3.5), shape (seq_len, dim)."""
    pos = torch.arange(seq_len, dtype=torch.float64)[:, None]
    i = torch.arange(0, dim, 2, dtype=torch.float64)
    angle = pos / torch.pow(10000.0, i / dim)
    table = torch.zeros(seq_len, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : dim // 2])
    return table.float()


class CurvTransformer(nn.Module):
    """Reference Transformer of the engine contract; ``forward(inputs)`` returns the output
    (logits (n, seq, V) for causal_lm, (n, C) for classification, (n, seq, out) for regression).
    """

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        task = spec.task
        d = spec.d_model
        causal = isinstance(task, CausalLMTask)
        if isinstance(task, CausalLMTask) or (
            isinstance(task, ClassificationTask) and task.vocab_size is not None
        ):
            self.embed: nn.Module | None = nn.Embedding(task.vocab_size, d)
        elif task.input_dim is not None:
            self.embed = nn.Linear(task.input_dim, d, bias=spec.bias)
        else:
            self.embed = None
        if spec.positional == "learned":
            self.pos: nn.Module | None = nn.Embedding(task.seq_len, d)
        else:
            self.pos = None
        if spec.positional == "sinusoidal":
            self.register_buffer(
                "pos_table", sinusoidal_positions(task.seq_len, d), persistent=False
            )
        else:
            self.pos_table = None
        self.layers = nn.ModuleList(Block(spec, causal) for _ in range(spec.n_layers))
        self.final_norm = (
            Norm(spec.norm, d, spec.ln_eps, spec.norm_affine, spec.bias)
            if spec.use_final_norm
            else None
        )
        if isinstance(task, CausalLMTask):
            self.head: nn.Linear | None = nn.Linear(d, task.vocab_size, bias=spec.bias)
            if task.tie_embeddings:
                self.head.weight = self.embed.weight  # tied: one tensor, owned by `embed`
        elif isinstance(task, ClassificationTask):
            self.head = nn.Linear(d, task.n_classes, bias=spec.bias)
        elif isinstance(task, RegressionTask) and task.output_dim is not None:
            self.head = nn.Linear(d, task.output_dim, bias=spec.bias)
        else:
            self.head = None
        self.pool = isinstance(task, ClassificationTask)

    def forward(self, inputs: Tensor) -> Tensor:
        x = self.embed(inputs) if self.embed is not None else inputs
        t = x.shape[1]
        if self.pos is not None:
            x = x + self.pos.weight[:t]
        elif self.pos_table is not None:
            x = x + self.pos_table[:t].to(x.dtype)
        for layer in self.layers:
            x = layer(x)
        if self.final_norm is not None:
            x = self.final_norm(x)
        if self.pool:
            x = x.mean(dim=1)
        return self.head(x) if self.head is not None else x


def build_model(
    spec: ModelSpec | dict, *, seed: int | None = 0, dtype: torch.dtype = torch.float32
) -> CurvTransformer:
    """Build the reference Transformer for ``spec`` (initialised from ``seed``), in eval mode.

    The parameters are GPT-2-style initialised (normal, std 0.02; biases 0; norms at 1/0),
    entirely from ``seed`` (the global RNG is not used), so that a freshly built model is a
    reproducible starting point; checkpoints replace them.
    """
    spec = parse_spec(spec)
    gen = torch.Generator().manual_seed(0 if seed is None else seed)
    model = CurvTransformer(spec)
    with torch.no_grad():
        for name, p in model.named_parameters():
            is_norm = ".ln" in name or name.startswith("final_norm")
            if name.endswith("bias"):
                p.zero_()
            elif is_norm:
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    model.to(dtype)
    model.eval()
    return model


def parameter_names(model: nn.Module) -> list[str]:
    """Deduplicated parameter names in ``named_parameters()`` order (tied tensors once)."""
    return [name for name, _ in model.named_parameters()]
