"""Write the bundled example pair, frame0.png and frame1.png (256 x 448), next to this script.

Two consecutive frames of eden_serve.model.synthetic.scene, so the repository ships no third-party images.
Run: .venv/bin/python examples/make_frames.py
"""

from pathlib import Path

from PIL import Image

from eden_serve.model.synthetic import scene

HEIGHT, WIDTH = 256, 448


def main() -> None:
    out = Path(__file__).resolve().parent
    for i in (0, 1):
        path = out / f"frame{i}.png"
        Image.fromarray(scene(HEIGHT, WIDTH, float(i))).save(path, optimize=True)
        print(f"wrote {path} ({WIDTH}x{HEIGHT}, {path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
