"""What the keyed digest costs per payload: tagging on the cloud, checking on the edge, against
encoding and decoding the same payload, and against keyed BLAKE2b, the other MAC in hashlib.

    .venv/bin/python benchmarks/keyed_digest.py [--sizes 480x854,1080x1920] [--codec bf16+zstd] [--repeat 7]

Payloads are pairs of synthetic conditions with the official dimensions (eden_serve.model.synthetic), so
their sizes are the real ones for each codec. Prints the median of ``--repeat`` timings of each step.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import time

import torch

from eden_serve import wire
from eden_serve.config import PRESETS
from eden_serve.model import synthetic
from eden_serve.wire import keyed
import results


def median_ms(step, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="480x854,1080x1920", help="frame sizes HxW (default 480x854,1080x1920)")
    parser.add_argument("--codec", default=wire.DEFAULT_CODEC, help=f"wire codec (default {wire.DEFAULT_CODEC})")
    parser.add_argument("--config", default="official", choices=sorted(PRESETS))
    parser.add_argument("--repeat", type=int, default=7, help="timings per step, median printed (default 7)")
    args = parser.parse_args()
    config = PRESETS[args.config]
    key = os.urandom(32).hex().encode()
    print(f"keyed digest (HMAC-SHA256) per payload, {args.config} dimensions, codec {args.codec}, median of {args.repeat}; "
          f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads")
    print(f"{'frames':>10} {'payload':>12} {'tag ms':>8} {'check ms':>9} {'GB/s':>6} {'BLAKE2b ms':>11} {'encode ms':>10} "
          f"{'decode ms':>10} {'tag+check':>10}")
    rows = []
    for text in args.sizes.split(","):
        size = tuple(int(v) for v in text.split("x"))
        chunk = synthetic.chunk(config, size)
        payload = wire.encode(chunk, config, args.codec)
        tagged = keyed.sign(payload, key)
        sign_ms = median_ms(lambda: keyed.sign(payload, key), args.repeat)
        check_ms = median_ms(lambda: keyed.verify(tagged, key), args.repeat)
        blake_ms = median_ms(lambda: hashlib.blake2b(payload, key=key[:64], digest_size=32).digest(), args.repeat)
        encode_ms = median_ms(lambda: wire.encode(chunk, config, args.codec), args.repeat)
        decode_ms = median_ms(lambda: wire.decode(payload, config), args.repeat)
        share = (sign_ms + check_ms) / (encode_ms + decode_ms)
        print(f"{text:>10} {len(payload):>12,} {sign_ms:>8.2f} {check_ms:>9.2f} {len(payload) / check_ms / 1e6:>6.2f} "
              f"{blake_ms:>11.2f} {encode_ms:>10.1f} {decode_ms:>10.1f} {share:>9.1%}")
        rows.append({"frames": text, "codec": args.codec, "payload_bytes": len(payload), "tag_ms": sign_ms, "check_ms": check_ms,
                     "blake2b_ms": blake_ms, "encode_ms": encode_ms, "decode_ms": decode_ms, "tag_check_share": share})
    print("BLAKE2b: keyed BLAKE2b-256 over the payload, the check's alternative; "
          "tag+check: their time as a share of encoding and decoding the same payload")
    results.write("keyed_digest", rows)


if __name__ == "__main__":
    main()
