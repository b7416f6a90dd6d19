"""The cloud half, near where the video is stored: E_cond and the scene cuts (:mod:`.encoder`), and
the videos it reads itself, under its media root (:mod:`.sources`)."""
