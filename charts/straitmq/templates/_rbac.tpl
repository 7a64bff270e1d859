{{/*
RBAC rules of the operator, shared by the ClusterRole (all namespaces) and the per-namespace
Roles (operator.watchNamespaces). Each rule says what needs it.
*/}}

{{/* Rules on namespaced objects: a ClusterRole grants them everywhere, a Role in one namespace. */}}
{{- define "straitmq.operator.namespacedRules" -}}
# The custom resources: kopf watches them and patches its annotations and finalizers in.
- apiGroups: [straitmq.io]
  resources: [mqclusters, topics]
  verbs: [get, list, watch, patch, update]
# Status and conditions; finalizers so that owner references with blockOwnerDeletion
# may point at an MQCluster (OwnerReferencesPermissionEnforcement).
- apiGroups: [straitmq.io]
  resources: [mqclusters/status, topics/status, mqclusters/finalizers, topics/finalizers]
  verbs: [get, patch, update]
- apiGroups: [straitmq.io]
  resources: [mqclusters/scale]
  verbs: [get]
# What an MQCluster is rendered into.
- apiGroups: [apps]
  resources: [statefulsets]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [""]
  resources: [services, configmaps]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, patch, update, delete]
# Rolling restarts delete one pod at a time; pod readiness drives scaling and restarts.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, delete]
# Volume claims of brokers removed by a scale-down are deleted once they are drained.
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get, list, delete]
# kopf reports handler progress and errors as events on the resources.
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end -}}

{{/* Cluster-scoped reads, needed in both modes. */}}
{{- define "straitmq.operator.clusterRules" -}}
# kopf scans and watches CRDs to find the resources it serves (and notice them change).
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [get, list, watch]
{{- end -}}
