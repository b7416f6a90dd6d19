"""The decoder sandbox's own processes (docs/errors-and-limits.md, "The decoder's sandbox"): the
zygote and the child it forks per payload (:mod:`.zygote`), their confinement (:mod:`.confine`)
and the decoder they run (:mod:`.decoder`). Nothing here imports PyTorch, only PyAV, Pillow, numpy
and :mod:`eden_serve.errors`, so the zygote starts in a fraction of a second and forks a small
process. The worker's side is :mod:`eden_serve.media.sandboxed`.
"""
