{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "specdec-exporter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: the release name, or release-chart when they differ. */}}
{{- define "specdec-exporter.fullname" -}}
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
{{- end }}

{{/* Labels that select the exporter's pods. */}}
{{- define "specdec-exporter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "specdec-exporter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Common labels of every object. */}}
{{- define "specdec-exporter.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "specdec-exporter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The image reference: registry/repository, then @digest when pinned, else :tag. */}}
{{- define "specdec-exporter.image" -}}
{{- $repo := .Values.image.repository }}
{{- if .Values.image.registry }}{{ $repo = printf "%s/%s" .Values.image.registry $repo }}{{ end }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repo .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repo (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/* The pods' ServiceAccount: the created one, a named existing one, or the default. */}}
{{- define "specdec-exporter.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "specdec-exporter.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Every shard's base URL in ordinal order, through the headless Service (SPECDEC_PEERS). */}}
{{- define "specdec-exporter.peers" -}}
{{- $full := include "specdec-exporter.fullname" . }}
{{- $urls := list }}
{{- range $i := until (int .Values.shards) }}
{{- $urls = append $urls (printf "http://%s-%d.%s-headless.%s.svc:%v" $full $i $full $.Release.Namespace $.Values.service.port) }}
{{- end }}
{{- join "," $urls }}
{{- end }}

{{/* Name of the Secret holding the marker token. */}}
{{- define "specdec-exporter.secretName" -}}
{{- default (include "specdec-exporter.fullname" .) .Values.token.existingSecret }}
{{- end }}
