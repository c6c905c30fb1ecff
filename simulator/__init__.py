"""kvdoctor.simulator: the simulated engine and GPU behind ``kvdoctor demo`` and the tests.

``scenarios`` (the workloads) drive ``physics`` (a vLLM-like scheduler whose steps cost what
``roofline`` says on the ``deployment``'s model and GPU); the engine counts in ``vllm_metrics``'s
layout, ``engine_server`` serves it as vLLM's ``/metrics``, and ``gpu`` is the simulated GPU
collector the demo plugs into the exporter.
"""
