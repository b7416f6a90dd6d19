"""Payload size, token error and speed of every token codec: ``python -m eden_serve.commands.bench_wire``.

Conditions are pairs of :func:`eden_serve.model.synthetic.chunk` (LayerNorm outputs) with the official
dimensions, in its two token profiles, ``plain`` and ``outliers``. The frames codec carries frames, not
tokens: benchmarks/chunks.py measures it on real video.

Token errors are over cond_dit and cond_dec together, the RMS error also relative to the tokens' RMS.
``--frames`` adds the error of the edge's output frame (480p, against fp32 conditions), with
synthetic weights unless ``--checkpoint`` names the official one; the edge's own bf16 mode is shown
for scale. It takes a minute or two on a CPU.
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from ..config import PRESETS, EdenConfig
from ..edge import EdgeModel, middles_of
from ..model import synthetic
from ..model.checkpoint import load_pair
from ..wire import DEFAULT_CODEC, TOKEN_CODECS, Chunk, decode, encode

RESOLUTIONS = {"480p": (480, 854), "1080p": (1080, 1920), "4K": (2160, 3840)}


def token_errors(chunk: Chunk, config: EdenConfig, codec: str) -> tuple[float, float, float]:
    out = decode(encode(chunk, config, codec), config)
    x = torch.cat([getattr(chunk, name).frames(0, chunk.frames) for name in ("cond_dit", "cond_dec")])
    err = torch.cat([getattr(out, name).frames(0, out.frames) for name in ("cond_dit", "cond_dec")]) - x
    rms = err.square().mean().sqrt().item()
    return err.abs().max().item(), rms, rms / x.square().mean().sqrt().item()


def _middle(edge: EdgeModel, chunk: Chunk) -> torch.Tensor:
    """The middle of ``chunk``'s first pair, [3, H, W] float32 in [0, 1]."""
    return middles_of(edge, [chunk.pair(0)], uint8=False)[0]


def frame_errors(config: EdenConfig, checkpoint: str | None, chunks: dict[str, Chunk]) -> None:
    print("\noutput-frame error at 480p against fp32 conditions: max abs / PSNR (dB), pixels in [0, 1]")
    edge = load_pair(checkpoint, config)[1]
    edge_bf16 = load_pair(checkpoint, config, precision="bf16")[1]
    refs = {profile: _middle(edge, chunk) for profile, chunk in chunks.items()}
    rows = {codec: lambda chunk, codec=codec: _middle(edge, decode(encode(chunk, config, codec), config)) for codec in TOKEN_CODECS}
    rows["edge in bf16"] = lambda chunk: _middle(edge_bf16, chunk)
    print(f"{'codec':<18}" + "".join(f"{profile:>20}" for profile in chunks))
    for label, run in rows.items():
        if label.endswith("+zstd") or label == "fp32":  # zstd is lossless
            continue
        cells = ""
        for profile, chunk in chunks.items():
            err = run(chunk) - refs[profile]
            cells += f"{err.abs().max().item():>11.2e} {-10 * math.log10(err.square().mean().item()):>7.1f}"
        print(f"{label:<18}{cells}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="official", choices=list(PRESETS))
    parser.add_argument("--frames", action="store_true", help="also measure the output-frame error through the edge model")
    parser.add_argument("--checkpoint", help="official eden.pt for --frames (default: synthetic weights)")
    args = parser.parse_args(argv)
    config = PRESETS[args.config]

    print(f"payload bytes, config {args.config} (D={config.hidden_dim}), 'plain' tokens; x = ratio to fp32")
    sizes = {}
    for res, size in RESOLUTIONS.items():
        cond = synthetic.chunk(config, size, profile="plain")
        sizes[res] = {codec: len(encode(cond, config, codec)) for codec in TOKEN_CODECS}
        print(f"  {res} {size[0]}x{size[1]}: grid {cond.grid}, N = {cond.grid[0] * cond.grid[1]}")
    print(f"{'codec':<18}" + "".join(f"{res:>22}" for res in RESOLUTIONS))
    for codec in TOKEN_CODECS:
        cells = "".join(f"{sizes[res][codec]:>14,} ({sizes[res]['fp32'] / sizes[res][codec]:4.2f}x)" for res in RESOLUTIONS)
        print(f"{codec:<18}{cells}")

    print("\ntoken error at 480p (max abs / RMS / RMS relative to token RMS), and encode+decode time at 1080p")
    conds = {profile: synthetic.chunk(config, RESOLUTIONS["480p"], profile=profile) for profile in ("plain", "outliers")}
    big = synthetic.chunk(config, RESOLUTIONS["1080p"], profile="plain")
    print(f"{'codec':<18}{'plain':>30}{'outliers':>30}{'enc ms':>9}{'dec ms':>9}")
    for codec in TOKEN_CODECS:
        cells = "".join("{:>9.2e} {:>9.2e} {:>9.2e}".format(*token_errors(cond, config, codec)) for cond in conds.values())
        start = time.perf_counter()
        payload = encode(big, config, codec)
        mid = time.perf_counter()
        decode(payload, config)
        end = time.perf_counter()
        print(f"{codec:<18}{cells}{1000 * (mid - start):>9.0f}{1000 * (end - mid):>9.0f}")
    if args.frames:
        frame_errors(config, args.checkpoint, conds)
    print(f"\nDEFAULT_CODEC = {DEFAULT_CODEC!r}")


if __name__ == "__main__":
    main()
