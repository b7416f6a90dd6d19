"""Write the bundled example pair, frame0.png and frame1.png (256 x 448), next to this script.

A synthetic scene, so the repository ships no third-party images: a sky-to-ground gradient with
soft stripes, a ball moving right and down, and a bar moving left, one step apart between frames.
Run: python examples/make_frames.py
"""

from pathlib import Path

import numpy as np
from PIL import Image

HEIGHT, WIDTH = 256, 448


def frame(t: float) -> np.ndarray:
    """The scene at time t (0 for frame0, 1 for frame1): H x W x 3 uint8."""
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH].astype(np.float32)
    sky = np.stack([0.35 + 0.3 * y / HEIGHT, 0.55 + 0.25 * y / HEIGHT, 0.95 - 0.4 * y / HEIGHT], axis=-1)
    stripes = 0.04 * np.sin(x / 9.0 + y / 31.0)[..., None]
    image = sky + stripes
    # Anti-aliased shapes: coverage falls from 1 to 0 across one pixel of the edge.
    ball_x, ball_y, radius = 120 + 40 * t, 110 + 16 * t, 38
    ball = np.clip(radius + 0.5 - np.hypot(x - ball_x, y - ball_y), 0, 1)[..., None]
    shade = 0.75 + 0.25 * np.clip((ball_y - y) / radius, -1, 1)[..., None]
    image = image * (1 - ball) + ball * shade * np.array([0.95, 0.45, 0.15])
    bar_x = 330 - 30 * t
    bar = (np.clip(26 + 0.5 - np.abs(x - bar_x), 0, 1) * np.clip(70 + 0.5 - np.abs(y - 180), 0, 1))[..., None]
    image = image * (1 - bar) + bar * np.array([0.2, 0.6, 0.3])
    return (np.clip(image, 0, 1) * 255).round().astype(np.uint8)


def main() -> None:
    out = Path(__file__).resolve().parent
    for i in (0, 1):
        path = out / f"frame{i}.png"
        Image.fromarray(frame(float(i))).save(path, optimize=True)
        print(f"wrote {path} ({WIDTH}x{HEIGHT}, {path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
