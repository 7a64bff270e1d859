"""The StraitMQ Kubernetes operator (kopf): MQCluster and Topic custom resources.

Imported as `straitmq.operator`; the code is in `operator/straitmq_operator/` because
`operator/` itself must never be a package: run from the repository root, it would
shadow the standard library's `operator` (and break `python -m venv`, for a start).
"""
