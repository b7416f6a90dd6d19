"""TorchServe glue: the two halves as TorchServe services, and TorchServe instances to run them.

* :mod:`.worker`: a worker's settings (model-config.yaml ``handler:``), device and threads;
* :mod:`.fields`: the HTTP side of a request: form fields, bodies, content types;
* :mod:`.services`: :class:`~.services.CloudService` and :class:`~.services.EdgeService`, request by request;
* :mod:`.handler`: the one TorchServe handler class that ``handlers/*.py`` subclass (imports TorchServe);
* :mod:`.launcher`: start and stop TorchServe instances (tests, benchmarks, the container).

Only :mod:`.handler` imports TorchServe, so the rest runs and is tested without it.
"""
