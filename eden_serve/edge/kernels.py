"""The edge's fast-path arithmetic: matrix products, modulated LayerNorm, temporal attention.

Everything here computes what the reference computes, up to float rounding:

* :class:`Linears` runs every matrix product of the blocks. On a CPU in fp32 it calls oneDNN with
  the weights reordered once into its blocked layout. PyTorch's own fp32 ``F.linear`` goes to MKL,
  which on AMD CPUs runs its AVX2 kernels even where AVX-512 is there: oneDNN is 2x faster on such
  a CPU, and 1.1-1.5x faster on an AVX2 one (docs/performance.md).
* :func:`modulated_layer_norm`: ``LN(x) * (1 + scale) + shift`` with per-channel ``scale`` and
  ``shift`` is one LayerNorm whose affine parameters absorb them: one pass over the tokens, not three.
* :func:`absorbed_temporal_attention`: the DiT's temporal attention without projecting the eight
  condition tokens of each query: ``q . (Wk c) = (Wk^T q) . c`` and ``sum_j a_j Wv c_j =
  Wv (sum_j a_j c_j)``. Projecting them costs 8 tokens x D x 2D per query token; this costs 2 x D x D.
  Its two per-head products (:meth:`Linears.per_head`) run on a CPU as one oneDNN grouped 1x1
  convolution each, on weights reordered once: as ``einsum`` (a ``bmm``: MKL in fp32; oneDNN in bf16,
  reordering the weights at every call) these thin products (64 inputs or outputs per head) took
  1-4% more of a pair's time (docs/gpu.md).
* :func:`three_token_attention`: the decoder's temporal attention (a token over itself and the two
  frames' tokens at its position), written out: three dot products per head.
* :func:`bicubic_2x`: the decoder's bicubic x2 upsampling of the latents' tokens, as four fixed taps
  per axis on the tokens where they lie (channels last). PyTorch's CUDA kernel loops over the 768
  channels inside each thread, reading them strided: on an H200 it took 3.4 ms of a 1080p pair's
  18.7 ms of kernels (2026-11-28, docs/gpu.md). The CPU keeps ``F.interpolate``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..model.weights import Attention, Mlp

# oneDNN's blocked weight layout is chosen for a number of rows; any row count works with it.
_PACK_ROWS = 512


def onednn_linear_available(device: torch.device, dtype: torch.dtype = torch.float32) -> bool:
    """Whether ``dtype`` matrix products on ``device`` can run through oneDNN on prepacked weights."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    try:  # private operators: check that they are there and agree with F.linear
        x = torch.linspace(-1, 1, 24).reshape(3, 8).to(dtype)
        w, b = torch.linspace(-1, 1, 40).reshape(5, 8).flip(0).to(dtype), torch.linspace(0, 1, 5).to(dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, _PACK_ROWS)
        out = torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], "")
        gelu = torch.ops.mkldnn._linear_pointwise(x, packed, b, "gelu", [], "none")
        heads = Linears("onednn").per_head(x.view(3, 2, 4), w[:2].reshape(2, 2, 4), True, key=(w, 0))
    except (AttributeError, RuntimeError):
        return False
    atol = 1e-5 if dtype == torch.float32 else 2e-2
    return torch.allclose(out.float(), F.linear(x, w, b).float(), atol=atol) and torch.allclose(
        gelu.float(), F.gelu(F.linear(x, w, b).float()), atol=atol) and torch.allclose(
        heads.float(), torch.einsum("thd,hcd->thc", x.view(3, 2, 4), w[:2].reshape(2, 2, 4)).float(), atol=atol)


class Linears:
    """The blocks' matrix products, by ``kind``:

    * ``torch``: ``F.linear`` (any device, and bf16 under autocast);
    * ``onednn``: on a CPU through oneDNN, on weights reordered once, in the weights' dtype (fp32,
      or bf16 whose inputs are cast here): ``F.linear`` would reorder the weights at every call.

    Prepared weights are made on first use and kept, keyed by the weight and the rows used: they
    are a second copy of the block weights (about 600 MB with the official dimensions), and a third
    of the DiT's temporal key and value weights for :meth:`per_head` (57 MB in fp32).
    """

    def __init__(self, kind: str = "torch"):
        self.kind = kind
        self._prepared: dict[tuple, torch.Tensor] = {}

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, rows: slice = slice(None),
                 gelu: bool = False) -> torch.Tensor:
        """``F.linear(x, weight[rows], bias)``, then the exact (erf) GELU if ``gelu``."""
        if self.kind == "torch":
            y = F.linear(x, weight[rows], bias)
            return F.gelu(y) if gelu else y
        start, stop, _ = rows.indices(weight.shape[0])
        key = (id(weight), start, stop)
        if key not in self._prepared:
            self._prepared[key] = torch.ops.mkldnn._reorder_linear_weight(weight[rows].contiguous(), _PACK_ROWS)
        # The GELU as oneDNN's post-op, on the product's float32 accumulators before they are stored:
        # one pass over the MLP's 4D-wide hidden tokens instead of three.
        attr, algorithm = ("gelu", "none") if gelu else ("none", "")
        return torch.ops.mkldnn._linear_pointwise(x.to(weight.dtype), self._prepared[key], bias, attr, [], algorithm)

    def per_head(self, x: torch.Tensor, weight: torch.Tensor, transposed: bool = False,
                 key: tuple[torch.Tensor, int] | None = None) -> torch.Tensor:
        """Each head's own product, ``weight`` [H, a, b] (a view of the ``qkv`` weight, cached
        under ``key`` = (that weight, first row)): [T, H, a] -> [T, H, b] (``x[t, h] @
        weight[h]``), or ``transposed``, [T, H, b] -> [T, H, a] (``weight[h] @ x[t, h]``)."""
        if self.kind == "torch" or key is None:
            return torch.einsum("thd,hcd->thc" if transposed else "thc,hcd->thd", x, weight)
        heads = weight.shape[0]
        cache_key = ("per_head", id(key[0]), key[1], int(transposed))
        if cache_key not in self._prepared:
            # A grouped 1x1 convolution is a block-diagonal product, one block per head: its
            # [H * outputs, inputs] weight is each head's block stacked.
            blocks = weight if transposed else weight.transpose(1, 2)
            self._prepared[cache_key] = torch.ops.mkldnn._reorder_convolution_weight(
                blocks.reshape(-1, blocks.shape[-1], 1, 1).contiguous(), [0, 0], [1, 1], [1, 1], heads,
                [1, heads * blocks.shape[-1], _PACK_ROWS, 1])
        tokens = x.shape[0]
        # The tokens as the width of a one-row image in channels-last layout: [T, H * in] as it is.
        image = x.to(weight.dtype).reshape(1, tokens, 1, -1).permute(0, 3, 1, 2)
        y = torch.ops.mkldnn._convolution_pointwise(image, self._prepared[cache_key], None, [0, 0], [1, 1], [1, 1],
                                                    heads, "none", [], "")
        return y.permute(0, 2, 3, 1).reshape(tokens, heads, -1)

    def module(self, linear: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        return self(x, linear.weight, linear.bias)

    def project(self, attn: Attention, x: torch.Tensor, parts: str = "qkv") -> torch.Tensor:
        """[..., T, D] -> [..., T, len(parts), H, hd]: like :meth:`Attention.project`."""
        dim = attn.proj.weight.shape[0]
        first = "qkv".index(parts[0])
        y = self(x, attn.qkv.weight, rows=slice(first * dim, (first + len(parts)) * dim))
        return y.unflatten(-1, (len(parts), attn.num_heads, -1))

    def output(self, attn: Attention, y: torch.Tensor) -> torch.Tensor:
        """[..., H, T, hd] attention output -> proj of [..., T, D]."""
        return self.module(attn.proj, y.transpose(-3, -2).flatten(-2))

    def mlp(self, mlp: Mlp, x: torch.Tensor) -> torch.Tensor:
        assert mlp.act.approximate == "none", "the fused GELU is the exact one"
        return self.module(mlp.fc2, self(x, mlp.fc1.weight, mlp.fc1.bias, gelu=True))


def modulated_layer_norm(norm: torch.nn.LayerNorm, x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``norm(x) * (1 + scale) + shift`` for [D] ``shift`` and ``scale``, in one LayerNorm."""
    gain = 1 + scale
    return F.layer_norm(x, norm.normalized_shape, norm.weight * gain, torch.addcmul(shift, norm.bias, gain), norm.eps)


def absorbed_temporal_attention(linears: Linears, attn: Attention, h: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
    """Attention of each token ``h[t]`` ([T, D]) over itself and its ``cond[t]`` ([T, C, D]) tokens,
    the condition tokens' keys and values never formed; the query row only, after ``proj``: [T, D]."""
    tokens, dim = h.shape
    heads = attn.num_heads
    q, k, v = linears.project(attn, h).unbind(-3)  # [T, H, hd] each
    q = q * (dim // heads) ** -0.5
    w_k, w_v = (attn.qkv.weight[i * dim : (i + 1) * dim].view(heads, dim // heads, dim) for i in (1, 2))
    # The weight itself, not its id: a compiled block (torch's products) then guards on no block's identity.
    keys = [(attn.qkv.weight, i * dim) for i in (1, 2)]
    q_in_cond = linears.per_head(q, w_k, key=keys[0])  # [T, H, D]: each head's query seen in token space
    scores = torch.cat([(q * k).sum(-1, keepdim=True), torch.bmm(q_in_cond, cond.transpose(1, 2))], dim=-1)
    weights = scores.float().softmax(-1)  # [T, H, 1 + C]: the token itself first; float32 under bf16 too
    mixed = torch.bmm(weights[..., 1:], cond)  # [T, H, D]: each head's weighted condition tokens
    out = linears.per_head(mixed, w_v, transposed=True, key=keys[1]).addcmul_(weights[..., :1], v)  # [T, H, hd]
    return linears.module(attn.proj, out.reshape(tokens, dim))


def three_token_attention(linears: Linears, attn: Attention, h: torch.Tensor, kv0: torch.Tensor, kv1: torch.Tensor) -> torch.Tensor:
    """Attention of each token ``h[t]`` over [frame 0's token t, itself, frame 1's token t], the
    middle row only, after ``proj``: [T, D]. ``kv0``, ``kv1``: the frames' keys and values [T, 2, H, hd]."""
    q, k, v = linears.project(attn, h).unbind(-3)  # [T, H, hd] each
    scores = torch.stack([(q * kv0[:, 0]).sum(-1), (q * k).sum(-1), (q * kv1[:, 0]).sum(-1)], dim=-1)
    weights = scores.float().mul_(q.shape[-1] ** -0.5).softmax(-1)[..., None]  # [T, H, 3, 1], float32 under bf16 too
    out = (kv0[:, 1] * weights[:, :, 0]).addcmul_(v, weights[:, :, 1]).addcmul_(kv1[:, 1], weights[:, :, 2])
    return linears.module(attn.proj, out.flatten(1))


# Keys's cubic (a = -0.75, PyTorch's) at the two phases of a x2 upsampling without aligned corners:
# an even output sits 3/4 of the way from its source's left neighbour, an odd one 1/4; the four taps'
# weights are exact in binary, and the odd phase's are the even one's reversed.
_TAPS = (-0.03515625, 0.26171875, 0.87890625, -0.10546875)


def _bicubic_2x_along(x: torch.Tensor, dim: int) -> torch.Tensor:
    n = x.shape[dim]
    first, last = x.narrow(dim, 0, 1), x.narrow(dim, n - 1, 1)
    padded = torch.cat([first, first, x, last, last], dim)  # the kernel's clamped reads at the borders
    s = [padded.narrow(dim, k, n + 1) for k in range(4)]
    even = (s[0] * _TAPS[0] + s[1] * _TAPS[1] + s[2] * _TAPS[2] + s[3] * _TAPS[3]).narrow(dim, 0, n)
    odd = (s[0] * _TAPS[3] + s[1] * _TAPS[2] + s[2] * _TAPS[1] + s[3] * _TAPS[0]).narrow(dim, 1, n)
    return torch.stack([even, odd], dim + 1).flatten(dim, dim + 1)


def bicubic_2x(tokens: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """``F.interpolate(grid, scale_factor=2, mode="bicubic", align_corners=False)`` of the tokens
    [B, height * width, D] laid out as a grid of D channels, as tokens [B, 4 * height * width, D], in
    float32 (within its rounding of PyTorch's kernel), in the tokens' dtype."""
    grid = tokens.float().reshape(len(tokens), height, width, tokens.shape[-1])
    return _bicubic_2x_along(_bicubic_2x_along(grid, 2), 1).flatten(1, 2).to(tokens.dtype)
