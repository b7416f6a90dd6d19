"""--resume against a journal and a partial output damaged at random (hypothesis): every resume
either finishes with exactly the output of an uninterrupted run, or is refused with one line (an
EdenError); nothing else, ever."""

from __future__ import annotations

import json
import shutil
import tempfile
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_resume import STAND_IN, average, contents, inputs, stop_at

from eden_serve.clips.processors import pairwise
from eden_serve.clips.streaming import interpolate_clip
from eden_serve.errors import EdenError

KINDS = ["directory", "apng", "gif"]
OPTIONS = dict(chunk=2, seed=3, fingerprint=STAND_IN, progress=False)


@pytest.fixture(scope="module")
def templates(tmp_path_factory):
    """Per kind: a folder holding a clip and a run of it stopped at pair 5, and the output of an
    uninterrupted run."""
    made = {}
    for kind in KINDS:
        folder = tmp_path_factory.mktemp(kind)
        src, dst = inputs(folder, kind)
        with warnings.catch_warnings(), pytest.raises(KeyboardInterrupt):
            warnings.simplefilter("ignore")
            interpolate_clip(src, dst, stop_at(5), resume=True, **OPTIONS)
        whole = tmp_path_factory.mktemp(f"{kind}-whole") / dst.name
        interpolate_clip(src, whole, pairwise(average), **OPTIONS)
        made[kind] = folder, src.name, dst.name, contents(whole)
    return made


JSON = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=6)


def keys(data, prefix=()):
    """Every key path of a JSON document."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield (*prefix, key)
            yield from keys(value, (*prefix, key))


@st.composite
def damage(draw):
    """A list of (what, how) steps: on the journal, on the partial output, or on one file in it."""
    journal = st.one_of(
        st.tuples(st.just("set"), st.integers(0, 50), JSON),
        st.tuples(st.just("delete"), st.integers(0, 50)),
        st.tuples(st.just("flip"), st.floats(0, 1), st.integers(1, 255)),
        st.tuples(st.just("truncate"), st.floats(0, 1)),
    )
    partial = st.one_of(
        st.tuples(st.just("flip"), st.integers(0, 30), st.floats(0, 1), st.integers(1, 255)),
        st.tuples(st.just("truncate"), st.integers(0, 30), st.floats(0, 1)),
        st.tuples(st.just("append"), st.integers(0, 30), st.binary(min_size=1, max_size=16)),
        st.tuples(st.just("unlink"), st.integers(0, 30)),
        st.tuples(st.just("replace"),),
    )
    steps = st.one_of(st.tuples(st.just("journal"), journal), st.tuples(st.just("partial"), partial))
    return draw(st.lists(steps, min_size=1, max_size=3))


def flip(path: Path, where: float, mask: int) -> None:
    data = bytearray(path.read_bytes())
    if data:
        data[min(int(where * len(data)), len(data) - 1)] ^= mask
        path.write_bytes(bytes(data))


def apply_to_journal(path: Path, step) -> None:
    what = step[0]
    if what in ("flip", "truncate"):
        data = path.read_bytes()
        if what == "flip":
            flip(path, step[1], step[2])
        else:
            path.write_bytes(data[: int(step[1] * len(data))])
        return
    try:
        document = json.loads(path.read_bytes())
    except ValueError:  # broken by an earlier step
        return
    paths = list(keys(document))
    if not paths:
        return
    *parents, last = paths[step[1] % len(paths)]
    target = document
    for key in parents:
        target = target[key]
    if what == "set":
        target[last] = step[2]
    else:
        del target[last]
    path.write_text(json.dumps(document))


def apply_to_partial(partial: Path, step) -> None:
    what = step[0]
    if what == "replace":
        if partial.is_dir():
            shutil.rmtree(partial)
            partial.write_bytes(b"")
        else:
            partial.unlink()
            partial.mkdir()
        return
    files = sorted(partial.iterdir()) if partial.is_dir() else [partial]
    if not files:
        return
    target = files[step[1] % len(files)]
    if what == "flip":
        flip(target, step[2], step[3])
    elif what == "truncate":
        target.write_bytes(target.read_bytes()[: int(step[2] * target.stat().st_size)])
    elif what == "append":
        with open(target, "ab") as file:
            file.write(step[2])
    else:
        target.unlink()


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=damage())
def test_a_damaged_resume_finishes_exactly_or_is_refused(templates, kind, steps):
    template, src_name, dst_name, expected = templates[kind]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(shutil.copytree(template, Path(tmp) / "run", symlinks=True))
        src, dst = folder / src_name, folder / dst_name
        base = f".{dst.stem}.partial-resume{'' if kind == 'directory' else dst.suffix}"
        partial, journal = folder / base, folder / f"{base}.journal"
        for where, step in steps:
            if where == "journal":
                apply_to_journal(journal, step)
            elif partial.exists():
                apply_to_partial(partial, step)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                interpolate_clip(src, dst, pairwise(average), resume=True, **OPTIONS)
        except EdenError as exc:
            assert "\n" not in str(exc) and not dst.exists(), str(exc)
            return
        assert contents(dst) == expected
