"""Issues 32 and 39's goals under load, against one real TorchServe of eden-serve at tiny dimensions
holding the encoder, the edge and the workflow, and an ``eden-serve page`` through it over the same
media root (docs/errors-and-limits.md, "Under load"):

    .venv/bin/python benchmarks/hostile_load.py [--pairs 2000] [--clients 8] [--rounds 2] [--kills 4] [--interval 10]

1. The hostile mix: ``--pairs`` good workflow pairs (no retries) and every request of
   harness/hostile's catalogues (the server's and the page's) ``--rounds`` times, shuffled together,
   sent by ``--clients`` threads. Prints the good pairs answered, lost and wrong (against this
   process's middles), the hostile requests not answered as documented, the workers restarted, the
   opens of the file beside the media root that its playlists name, the requests to the URL they
   name, and the lines of the server's logs that a compromised decoder forged or filled with secrets.
2. Kills under load: clip runs over the split (``--cloud/--edge``, one thread over HTTP, one over
   gRPC) and good pairs from the other threads, with retries, while every ``--interval`` seconds
   the edge's and the encoder's workers are killed in turn, ``--kills`` in all. Prints the clip
   runs complete and equal to the in-process run, those that failed, and the pairs lost or wrong.

Writes benchmarks/results/NAME.csv (``--name``, default hostile_load). Stops every server it starts.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

CHECKOUT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(CHECKOUT))  # harness/ is in the checkout, not installed

from harness.browser import page_server
from harness.hostile import (MODELS, OpenWatch, PageTarget, bound, catalogue, forged_lines, media_root, page_catalogue, page_options,
                             recording_server, server_environment)
from harness.load import clip_and_expected, good_pairs, hostile_mix, kills_under_load, worker_pids
from harness.servers import build_archives, torchserve
import results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2, help="times each hostile request is sent")
    parser.add_argument("--kills", type=int, default=4)
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between kills")
    parser.add_argument("--name", default="hostile_load")
    args = parser.parse_args()
    print(f"CPU capability {torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}", flush=True)

    with tempfile.TemporaryDirectory(prefix="eden-hostile-") as tmp, recording_server() as (url, fetched):
        folder = Path(tmp)
        root = media_root(folder, url)
        store = bound(build_archives(folder / "store", media_root=root))
        pairs, clips = good_pairs(store), clip_and_expected(store, folder / "clips")
        hostiles = (catalogue(folder) + page_catalogue(root)) * args.rounds
        watch = OpenWatch(folder / "outside.mp4")
        with torchserve(store, models=MODELS, workflows=["eden.war"], env=server_environment(folder)) as server, \
                page_server(*page_options(server.inference_url, server.keys["inference"], root, folder / "page")) as page:
            before = worker_pids(server)
            tally, seconds = hostile_mix(server, pairs, args.pairs, hostiles, args.clients,
                                         page=PageTarget(page.origin, page.token, folder / "page"))
            after = worker_pids(server)
            restarts = sum(len(set(before[name]) - set(after[name])) for name in before)
            opened, forged = watch.count(), len(forged_lines(server))
            print(f"hostile mix, {args.clients} clients, {seconds:.0f} s: good pairs {tally.good} of {args.pairs}, "
                  f"lost {len(tally.lost)}, wrong {tally.wrong}; hostile requests {tally.hostile} "
                  f"({', '.join(f'{k} {v}' for k, v in sorted(tally.by_class.items()))}), not as documented "
                  f"{len(tally.mismatched)}; workers restarted {restarts}; opens of the file outside the root {opened}, "
                  f"requests to the URL {len(fetched)}; forged log lines {forged}", flush=True)
            for line in [*tally.lost[:10], *tally.mismatched]:
                print("  ", line)
            run = kills_under_load(server, clips, pairs, folder / "runs", args.kills, args.clients, args.interval)
            print(f"kills under load, {run.seconds:.0f} s: {len(run.kills)} kills ({', '.join(run.kills)}); clip runs complete "
                  f"{run.clip_runs}, wrong {run.clips_wrong}, failed {len(run.clips_failed)}, retries {run.clip_retries}; "
                  f"good pairs {run.pairs.good}, lost {len(run.pairs.lost)}, wrong {run.pairs.wrong}", flush=True)
            for line in [*run.clips_failed, *run.pairs.lost[:10]]:
                print("  ", line)
        watch.close()
    results.write(args.name, [{
        "clients": args.clients, "good_pairs": args.pairs, "answered": tally.good, "lost": len(tally.lost), "wrong": tally.wrong,
        "hostile": tally.hostile, "not_documented": len(tally.mismatched), "restarts": restarts, "outside_opens": opened,
        "url_requests": len(fetched), "forged_log_lines": forged, "mix_s": round(seconds, 1), "kills": len(run.kills), "clip_runs": run.clip_runs,
        "clips_wrong": run.clips_wrong, "clips_failed": len(run.clips_failed), "clip_retries": run.clip_retries,
        "kill_pairs": run.pairs.good, "kill_pairs_lost": len(run.pairs.lost), "kill_pairs_wrong": run.pairs.wrong,
        "kill_s": round(run.seconds, 1),
    }])


if __name__ == "__main__":
    main()
