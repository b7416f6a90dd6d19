"""TorchServe glue: the two halves as TorchServe services, and TorchServe instances to run them.

* :mod:`.worker`: a worker's settings (model-config.yaml ``handler:``), device and threads;
* :mod:`.fields`: the HTTP side of a request: form fields, bodies, content types;
* :mod:`.services`: a service request by request, and the edge's (:class:`~.services.EdgeService`);
  :mod:`.cloud_service`: the cloud's (:class:`~.cloud_service.CloudService`); :mod:`.sources`: its
  requests that name a server-side source;
* :mod:`.handler`: the one TorchServe handler class that ``torchserve/*_handler.py`` subclass (imports TorchServe);
* :mod:`.launcher`: start TorchServe on a configuration, wait until it is ready, stop it;
* :mod:`.node`: ``eden-serve serve``, one node in the foreground (the container's process);
* :mod:`.archive`: ``eden-serve archive``, the archives built in one process;
* :mod:`.tls`: the TLS a node serves;
* ``torchserve/``: what TorchServe reads: the archives' handler files and model-config.yaml, the
  workflow, and the base config.properties (package data).

Only :mod:`.handler` imports TorchServe, so the rest runs and is tested without it.
"""
