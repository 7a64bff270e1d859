"""The StraitMQ Kubernetes operator (kopf): MQCluster and Topic custom resources.

Imported as `straitmq.operator`; the folder is `operator/` (never a top-level package,
which would shadow the standard library's `operator`).
"""
