"""Issues 32 and 39's goals at a small size against a real TorchServe and a real ``eden-serve page`` over
it (benchmarks/hostile_load.py runs them at the goals' size): every hostile request of harness/hostile's
catalogues, once, interleaved with good workflow pairs from a few clients, each answered as
documented, no good pair lost or wrong, no worker restarted, nothing outside the media root opened
or fetched, no line of a compromised decoder's in the server's logs; then clip runs over the split,
HTTP and gRPC, while the edge's and the encoder's workers are killed under load, each run complete
and equal to the in-process run."""

from __future__ import annotations

import pytest

from harness.browser import page_server
from harness.hostile import (MODELS, OpenWatch, PageTarget, bound, catalogue, forged_lines, media_root, page_catalogue, page_options,
                             recording_server, server_environment)
from harness.load import clip_and_expected, good_pairs, hostile_mix, kills_under_load, worker_pids
from harness.servers import build_archives, torchserve

pytestmark = pytest.mark.serving


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    """A server of both models and the workflow over a hostile media root, the faults' stand-in
    decoders on; the good pairs and the clip with their in-process middles."""
    folder = tmp_path_factory.mktemp("hostile")
    with recording_server() as (url, fetched):
        root = media_root(folder, url)
        store = bound(build_archives(folder / "store", media_root=root))
        pairs, clips = good_pairs(store, 4), clip_and_expected(store, folder / "clips", frames=6)
        hostiles = catalogue(folder) + page_catalogue(root)
        watch = OpenWatch(folder / "outside.mp4")
        with torchserve(store, models=MODELS, workflows=["eden.war"], env=server_environment(folder)) as server, \
                page_server(*page_options(server.inference_url, server.keys["inference"], root, folder / "page")) as page:
            yield server, folder, pairs, clips, hostiles, watch, fetched, PageTarget(page.origin, page.token, folder / "page")
        watch.close()


def test_hostile_requests_among_good_pairs(setting):
    server, _, pairs, _, hostiles, watch, fetched, page = setting
    before = worker_pids(server)
    tally, _ = hostile_mix(server, pairs, 24, hostiles, clients=3, page=page)
    assert tally.mismatched == []
    assert tally.hostile == len(hostiles)
    assert set(tally.by_class) == {"container", "work", "large", "decoder", "field", "size", "token", "page-source", "page-login",
                                   "page-bounds"}
    assert (tally.good, tally.lost, tally.wrong) == (24, [], 0), tally.lost
    assert worker_pids(server) == before
    assert watch.count() == 0 and fetched == []
    assert forged_lines(server) == []


def test_clip_runs_complete_while_workers_are_killed_under_load(setting):
    server, folder, pairs, clips, *_ = setting
    run = kills_under_load(server, clips, pairs, folder / "runs", kills=2, clients=4, interval=3)
    assert [kill.split()[0] for kill in run.kills] == ["eden_ditdec", "eden_encoder"]
    assert run.clips_failed == [] and run.clips_wrong == 0 and run.clip_runs >= 2
    assert run.pairs.lost == [] and run.pairs.wrong == 0 and run.pairs.good > 0
