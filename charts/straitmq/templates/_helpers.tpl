{{/*
Names, labels and small computed values shared by the templates.
*/}}

{{/* The chart's name, or nameOverride. */}}
{{- define "straitmq.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{/*
Base name of the release's objects. The release name alone if it already contains the
chart's name (release "straitmq" -> "straitmq", not "straitmq-straitmq"). 63 characters:
the DNS label limit of Service names.
*/}}
{{- define "straitmq.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Name of the operator's Deployment, Service and RBAC objects. */}}
{{- define "straitmq.operator.fullname" -}}
{{- printf "%s-operator" (include "straitmq.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{- define "straitmq.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{/*
Labels on every object of the chart. part-of: straitmq is what the ServiceMonitor selects.
*/}}
{{- define "straitmq.labels" -}}
helm.sh/chart: {{ include "straitmq.chart" . }}
{{ include "straitmq.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: straitmq
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "straitmq.selectorLabels" -}}
app.kubernetes.io/name: {{ include "straitmq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/*
The operator's labels. component: operator keeps its selector apart from the broker and
controller pods, which the operator labels name=straitmq, instance=<MQCluster name>.
*/}}
{{- define "straitmq.operator.labels" -}}
{{ include "straitmq.labels" . }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "straitmq.operator.selectorLabels" -}}
{{ include "straitmq.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "straitmq.operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "straitmq.operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end -}}

{{/*
The StraitMQ image: repository:tag, or repository@digest when a digest is given (a digest
pins the exact bytes; a tag can move). The tag defaults to the chart's appVersion.
*/}}
{{- define "straitmq.image" -}}
{{- $img := .Values.image }}
{{- if $img.digest }}
{{- printf "%s@%s" $img.repository $img.digest }}
{{- else }}
{{- printf "%s:%s" $img.repository (default .Chart.AppVersion $img.tag | toString) }}
{{- end }}
{{- end -}}

{{/* Name of the MQCluster the chart creates (cluster.enabled) and its Topics refer to. */}}
{{- define "straitmq.cluster.name" -}}
{{- default .Release.Name .Values.cluster.name }}
{{- end -}}

{{/*
Namespaces the operator watches, as a list; empty means all namespaces. Rejects a
string so that `--set operator.watchNamespaces=a` does not silently become
cluster-wide access.
*/}}
{{- define "straitmq.operator.watchNamespaces" -}}
{{- $ns := .Values.operator.watchNamespaces | default list }}
{{- if not (kindIs "slice" $ns) }}
{{- fail "operator.watchNamespaces must be a list, e.g. --set 'operator.watchNamespaces={team-a,team-b}'" }}
{{- end }}
{{- toJson (uniq $ns) }}
{{- end -}}
