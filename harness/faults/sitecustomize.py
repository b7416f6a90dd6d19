"""Faults at chosen points of a TorchServe worker (or of ``eden-serve page``), for tests: this
directory goes first on the PYTHONPATH of the server (``torchserve(..., env=faults.environment(folder))``,
``page_server(..., env=...)``), so every Python process it starts (the workers, the decoder sandbox's
zygote) imports this file first, and it patches the package's modules as they are imported. A fault
is armed by a file in ``$EDEN_FAULT_DIR`` and fires once: the process that fires it renames the file
``fired-NAME``.

- ``edge-kill`` holding ``before``, ``between`` or ``after``: the edge worker kills itself (SIGKILL)
  when a call with a streamed request starts, once the first middle of a request of two or more
  pairs was sent with more to come, or when the call is done with every middle sent and the end
  records not yet.
- ``edge-oom`` holding ``batch``: the edge's next forward of two or more pairs runs out of device
  memory for real (it asks the allocator for twice the device's memory), so that the batch is
  tried again in halves (on a GPU; a CPU's allocator fails otherwise).
- ``edge-device-assert`` holding ``next``: the edge's next forward triggers a device-side assert
  (an index out of bounds in a CUDA kernel), a sticky error: the worker answers 503 and exits (on
  a GPU only).
- Packets whose first starts with ``EDEN-CRASH`` or ``EDEN-HANG`` make ``eden_serve.sandbox.decoder.decode``
  and a sandbox child's own decoder (``eden_serve.sandbox.kept.decode``, which goes on from a kept
  stream without calling the other) crash (SIGSEGV) or hang, as a hostile bitstream could make libavcodec do (always armed); with
  ``EDEN-CONFIDE`` or ``EDEN-THREADS`` it behaves as a compromised decoder would (harness/standins.py's
  ``confide`` and ``threads``: secrets and forged metric lines in its refusal and on its output,
  threads without end). The zygote is given ``$EDEN_FAULT_DIR`` (its environment is otherwise fixed).
- ``page-hold`` holding ``run``: the next run of ``eden-serve page`` holds its chunks after the first
  until it is cancelled (its page closed, or stopped), however fast the machine computes the rest.
- ``clip-hold`` holding a pair's index N: the next clip run of the process (``eden-serve interpolate``
  or ``client`` on a clip) holds its chunks whose first pair is N or later, at any factor level,
  until the run stops (a signal's exception sets its ``cancel`` on the way out, clips/workers.py),
  however fast the machine computes the rest: a test's signal finds it running. It fires as the
  run starts.
"""

import importlib.abc
import importlib.util
import os
import signal
import sys
import threading
import time

FOLDER = os.environ.get("EDEN_FAULT_DIR")


def fire(name: str, point: str) -> None:
    armed = os.path.join(FOLDER, name)
    try:
        with open(armed) as file:
            if file.read().strip() != point:
                return
        os.rename(armed, os.path.join(FOLDER, f"fired-{name}"))
    except OSError:
        return
    os.kill(os.getpid(), signal.SIGKILL)


def taken(name: str, point: str) -> bool:
    """Whether the fault ``name`` is armed at ``point``: then it is fired (once, by this process)."""
    armed = os.path.join(FOLDER, name)
    try:
        with open(armed) as file:
            if file.read().strip() != point:
                return False
        os.rename(armed, os.path.join(FOLDER, f"fired-{name}"))
    except OSError:
        return False
    return True


def patch_edge(module) -> None:
    model = module.EdgeModel
    forward = model.forward

    def faulty_forward(self, inputs, *args, **kwargs):
        torch = sys.modules["torch"]
        if inputs.batch > 1 and taken("edge-oom", "batch"):
            torch.empty(2 * torch.cuda.get_device_properties(self.device).total_memory, dtype=torch.uint8, device=self.device)
        if taken("edge-device-assert", "next"):
            torch.zeros(2, device=self.device)[torch.tensor([7], device=self.device)]
            torch.cuda.synchronize(self.device)
        return forward(self, inputs, *args, **kwargs)

    model.forward = faulty_forward


def patch_services(module) -> None:
    edge = module.EdgeService
    inference = edge.inference

    def faulty_inference(self, jobs):
        streamed = any(getattr(job, "stream", None) for job in jobs)
        if streamed:
            fire("edge-kill", "before")
        results = inference(self, jobs)
        if streamed:
            fire("edge-kill", "after")
        return results

    edge.inference = faulty_inference


def patch_replies(module) -> None:
    replies = module.Replies
    send_ready = replies.send_ready

    def faulty_send_ready(self, idx, answer):
        send = self.send_part

        def send_then_die(i, body, content_type):
            send(i, body, content_type)
            if answer.next + 1 < len(answer.middles):  # the middle just sent is not the last
                fire("edge-kill", "between")

        self.send_part = send_then_die
        try:
            send_ready(self, idx, answer)
        finally:
            self.send_part = send

    replies.send_ready = faulty_send_ready


def patch_decoder(module) -> None:
    from harness import standins  # now: a sandboxed child can open no file to import it

    decode = module.decode

    def faulty_decode(parameters, packets, *args, **kwargs):
        if packets and packets[0].data.startswith(b"EDEN-CRASH"):
            os.kill(os.getpid(), signal.SIGSEGV)
        if packets and packets[0].data.startswith(b"EDEN-HANG"):
            while True:
                time.sleep(1)
        for name in ("confide", "threads"):
            if packets and packets[0].data.startswith(f"EDEN-{name.upper()}".encode()):
                return getattr(standins, name)(parameters, packets, *args, **kwargs)
        return decode(parameters, packets, *args, **kwargs)

    module.decode = faulty_decode


# A held chunk waits for its run's stop this long at most: only so that a test whose signal never
# comes ends (the run then finishes, and the test fails) rather than hangs.
HOLD_LIMIT = 600


def held(processor, cancel, first: int):
    """``processor`` whose chunks from pair ``first`` on wait until ``cancel`` is set (the run has
    stopped), or :data:`HOLD_LIMIT` has passed."""
    from eden_serve.clips.processors import Wrapper

    class Held(Wrapper):
        def __call__(self, index, frames, seed, arrived=None):
            if index >= first:
                cancel.wait(HOLD_LIMIT)
            return self.inner(index, frames, seed, arrived)

    return Held(processor)


def patch_page_runs(module) -> None:
    watch = module.Run.watch

    def held_watch(self, processor):
        watched = watch(self, processor)
        return held(watched, self.cancel, 1) if taken("page-hold", "run") else watched

    module.Run.watch = held_watch


def patch_clip_runs(module) -> None:
    from dataclasses import replace

    interpolate_clip = module.interpolate_clip

    def held_interpolate_clip(src, dst, processor, options=None, **given):
        armed = os.path.join(FOLDER, "clip-hold")
        try:
            with open(armed) as file:
                first = int(file.read().strip())
            os.rename(armed, os.path.join(FOLDER, "fired-clip-hold"))
        except (OSError, ValueError):
            return interpolate_clip(src, dst, processor, options, **given)
        options = replace(options, **given) if options is not None else module.ClipOptions(**given)
        cancel = options.cancel if options.cancel is not None else threading.Event()  # the one the run sets as it stops
        watch = options.watch
        holding = lambda processor: held(processor if watch is None else watch(processor), cancel, first)  # noqa: E731
        return interpolate_clip(src, dst, processor, replace(options, cancel=cancel, watch=holding))

    module.interpolate_clip = held_interpolate_clip


def patch_sandbox(module) -> None:
    """The zygote starts with none of the worker's environment: given the faults' folder, so that
    it imports this file and patches its decoder too."""
    environment = module.zygote_environment
    module.zygote_environment = lambda: {**environment(), "EDEN_FAULT_DIR": FOLDER}


PATCHES = {"eden_serve.serving.services": patch_services, "eden_serve.serving.replies": patch_replies,
           "eden_serve.sandbox.decoder": patch_decoder, "eden_serve.sandbox.kept": patch_decoder, "eden_serve.edge": patch_edge,
           "eden_serve.media.sandboxed": patch_sandbox, "eden_serve.page.runs": patch_page_runs,
           "eden_serve.clips.streaming": patch_clip_runs}


class Patcher(importlib.abc.MetaPathFinder):
    """Finds the modules of :data:`PATCHES` as the next finder would, and patches each once executed."""

    def find_spec(self, name, path, target=None):
        if name not in PATCHES:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None:
            return None
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            PATCHES[name](module)

        spec.loader.exec_module = exec_module
        return spec


if FOLDER:
    sys.meta_path.insert(0, Patcher())
