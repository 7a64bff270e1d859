{{/*
RBAC rules of the operator, shared by the ClusterRole (all namespaces) and the per-namespace
Roles (operator.watchNamespaces). Each rule says what needs it.
*/}}

{{/* Rules on namespaced objects: a ClusterRole grants them everywhere, a Role in one namespace. */}}
{{- define "straitmq.operator.namespacedRules" -}}
# The custom resources: kopf watches them and patches its annotations and finalizers in.
- apiGroups: [straitmq.io]
  resources: [mqclusters, topics, users]
  verbs: [get, list, watch, patch, update]
# Status and conditions; finalizers so that owner references with blockOwnerDeletion
# may point at an MQCluster or a User (OwnerReferencesPermissionEnforcement).
- apiGroups: [straitmq.io]
  resources: [mqclusters/status, topics/status, users/status, mqclusters/finalizers,
              topics/finalizers, users/finalizers]
  verbs: [get, patch, update]
# A User's credentials Secret (created, then patched on rotation; it goes with its
# owner reference), and the password Secret a User may name (read by name only: no
# list or watch, so no Secret is read that no User names).
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create, patch]
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
# External listeners of type ingress (spec.listeners.external): one Ingress per broker
# and a bootstrap one, deleted with their listener or broker.
- apiGroups: [networking.k8s.io]
  resources: [ingresses]
  verbs: [get, list, watch, create, patch, update, delete]
# Rolling restarts delete one pod at a time; pod readiness drives scaling and restarts;
# a manual roll of an MQCluster is moved onto its pods as their annotation (patch).
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, patch, delete]
# Events on MQClusters and Topics (kopf posts core/v1 events, and only creates them).
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- if .Values.rbac.rackAwareness }}
# The broker pods' service account, bound to the node reader when the cluster is rack-aware.
- apiGroups: [""]
  resources: [serviceaccounts]
  verbs: [get, create, patch]
{{- end }}
{{- end -}}

{{/* Cluster-scoped rules, needed in both modes. */}}
{{- define "straitmq.operator.clusterRules" -}}
# kopf scans and watches CRDs to find the resources it serves (and notice them change).
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [get, list, watch]
{{- if .Values.rbac.rackAwareness }}
# Rack awareness: one ClusterRoleBinding per rack-aware MQCluster gives its broker pods
# the node reader (they read their Node's rack label). Bindings are cluster-scoped; the
# operator may bind that one ClusterRole and no other. It lists them at startup to delete
# those of MQClusters deleted while it was not running (MQClusters have no finalizer).
- apiGroups: [rbac.authorization.k8s.io]
  resources: [clusterrolebindings]
  verbs: [get, list, create, patch, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [clusterroles]
  verbs: [bind]
  resourceNames: [{{ include "straitmq.nodeReaderName" . }}]
{{- end }}
{{- end -}}

{{/* The ClusterRole rack-aware broker pods are bound to. */}}
{{- define "straitmq.nodeReaderName" -}}
{{- printf "%s-node-reader" (include "straitmq.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end -}}
