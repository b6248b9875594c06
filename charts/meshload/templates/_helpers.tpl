{{/* The chart's name, or nameOverride. */}}
{{- define "meshload.name" -}}
{{- .Values.nameOverride | default .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of the release's objects: fullnameOverride, else the release
name when it already contains the chart's name, else "<release>-<name>".
*/}}
{{- define "meshload.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "meshload.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "meshload.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "meshload.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels: never change them in an upgrade (selectors are immutable). */}}
{{- define "meshload.selectorLabels" -}}
app.kubernetes.io/name: {{ include "meshload.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "meshload.labels" -}}
helm.sh/chart: {{ include "meshload.chart" . }}
{{ include "meshload.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "meshload.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- .Values.serviceAccount.name | default (include "meshload.fullname" .) }}
{{- else }}
{{- .Values.serviceAccount.name | default "default" }}
{{- end }}
{{- end }}

{{/* The Lease the replicas elect a leader with, in the release's namespace. */}}
{{- define "meshload.leaderElectionID" -}}
{{- .Values.leaderElection.id | default (include "meshload.fullname" .) }}
{{- end }}

{{- define "meshload.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* The sidecar image the webhook injects. */}}
{{- define "meshload.sidecarImage" -}}
{{- printf "%s:%s" .Values.sidecar.image.repository (.Values.sidecar.image.tag | default .Chart.AppVersion) }}
{{- end }}
