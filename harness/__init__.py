"""What the tests and benchmarks of the checkout need around eden-serve, and the installed package does
not: TorchServe instances on free ports in temporary directories (:mod:`.servers`), and two network
hosts joined by a rate-limited link (:mod:`.netns`). Not installed; the tests find it through
pytest's ``pythonpath``, the benchmarks through their own directory's parent.
"""
