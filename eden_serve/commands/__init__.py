"""The front ends: the ``eden-serve`` command (:mod:`.cli`), what the command line and the page
share (:mod:`.shared`), and the benchmarks that ship with it (:mod:`.bench`, ``eden-serve bench``;
:mod:`.bench_wire`, ``python -m eden_serve.commands.bench_wire``). The page is ``eden_serve.page``."""
