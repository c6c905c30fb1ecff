{{/*
Names, labels and the shared pieces of the kvdoctor chart.
*/}}

{{/*
The chart name, or nameOverride.
Truncated at 63 characters because some Kubernetes name fields are limited to that (DNS-1123 labels).
*/}}
{{- define "kvdoctor.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The fully qualified app name: <release>-<chart>, or the release name when it already contains the chart name.
Truncated at 63 characters because some Kubernetes name fields are limited to that (DNS-1123 labels).
*/}}
{{- define "kvdoctor.fullname" -}}
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

{{/*
The name of one component's objects: <fullname>-<component>, truncated at 63 characters
(Service names are DNS-1123 labels).
Usage: include "kvdoctor.componentName" (list . "dashboard")
*/}}
{{- define "kvdoctor.componentName" -}}
{{- $top := index . 0 }}
{{- printf "%s-%s" (include "kvdoctor.fullname" $top) (index . 1) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Chart name and version, for the helm.sh/chart label.
*/}}
{{- define "kvdoctor.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Common labels of every object.
*/}}
{{- define "kvdoctor.labels" -}}
helm.sh/chart: {{ include "kvdoctor.chart" . }}
{{ include "kvdoctor.selectorLabels" . }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kvdoctor
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Selector labels (stable across upgrades: never add a value that changes between releases).
*/}}
{{- define "kvdoctor.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvdoctor.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Labels of the pods that carry the sidecar: the chart's engine pods, or monitoring.podSelector.
*/}}
{{- define "kvdoctor.sidecarPodSelector" -}}
{{- if .Values.engine.enabled }}
{{- include "kvdoctor.selectorLabels" . }}
app.kubernetes.io/component: engine
{{- else if .Values.monitoring.podSelector }}
{{- toYaml .Values.monitoring.podSelector }}
{{- else }}
{{- fail "monitoring.podSelector: with engine.enabled=false, give the labels of your engine pods that carry the kvdoctor sidecar (the Service/PodMonitor select them)" }}
{{- end }}
{{- end }}

{{/*
The ServiceAccount name.
*/}}
{{- define "kvdoctor.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kvdoctor.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The kvdoctor sidecar image reference.
*/}}
{{- define "kvdoctor.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
The dashboard image reference (the Dockerfile's `dashboard` target).
*/}}
{{- define "kvdoctor.dashboardImage" -}}
{{- printf "%s:%s" .Values.dashboard.image.repository (default .Chart.AppVersion .Values.dashboard.image.tag) }}
{{- end }}

{{/*
A Prometheus duration from the exporter's interval in seconds: the one value that sets both the
exporter's collection interval and the scrape interval.
*/}}
{{- define "kvdoctor.scrapeInterval" -}}
{{- printf "%ds" (int .Values.sidecar.interval) }}
{{- end }}

{{/*
The context the sidecar templates take, built from this chart's values. A parent chart that has
kvdoctor as a dependency builds the same dict from its own values, e.g.
  (dict "sidecar" .Values.kvdoctor.sidecar "image" .Values.kvdoctor.image)
*/}}
{{- define "kvdoctor.sidecarContext" -}}
{{- $ctx := dict "sidecar" .Values.sidecar "image" .Values.image "tag" (default .Chart.AppVersion .Values.image.tag) }}
{{- $_ := set $ctx "engineUrl" (default (printf "http://127.0.0.1:%d/metrics" (int .Values.engine.port)) .Values.sidecar.engineUrl) }}
{{- $_ := set $ctx "webConfigSecret" (include "kvdoctor.componentName" (list . "web-config")) }}
{{- if .Values.engine.enabled }}
{{- $_ := set $ctx "model" .Values.engine.model }}
{{- $_ := set $ctx "modelVolume" "model-cache" }}
{{- end }}
{{- toYaml $ctx }}
{{- end }}

{{/*
How the ServiceMonitor/PodMonitor endpoints connect to the sidecars when sidecar.web is on
(scheme, tlsConfig, basicAuth), with the defaults and checks of values.yaml. Empty otherwise.
*/}}
{{- define "kvdoctor.scrapeClient" -}}
{{- $w := .Values.sidecar.web }}
{{- $c := .Values.monitoring.scrapeClient }}
{{- if $w.tls.enabled }}
{{- $tlsConfig := deepCopy ($c.tlsConfig | default dict) }}
{{- if not $tlsConfig }}
{{- if not $w.tls.secretName }}
{{- fail "monitoring.scrapeClient.tlsConfig: sidecar.web.tls is on without secretName: say how Prometheus checks the sidecar's certificate (ca, serverName)" }}
{{- end }}
{{- $serverName := printf "%s.%s.svc" (include "kvdoctor.componentName" (list . "metrics")) .Release.Namespace }}
{{- $tlsConfig = dict "ca" (dict "secret" (dict "name" $w.tls.secretName "key" "ca.crt")) "serverName" $serverName }}
{{- end }}
{{- if and (eq $w.tls.clientAuthType "RequireAndVerifyClientCert") (not (and $tlsConfig.cert $tlsConfig.keySecret)) }}
{{- fail "monitoring.scrapeClient.tlsConfig: sidecar.web.tls.clientAuthType RequireAndVerifyClientCert needs Prometheus's client certificate (cert and keySecret)" }}
{{- end }}
scheme: https
tlsConfig:
  {{- toYaml $tlsConfig | nindent 2 }}
{{- end }}
{{- if and $w.basicAuthUsers (not $c.basicAuth) }}
{{- fail "monitoring.scrapeClient.basicAuth: sidecar.web.basicAuthUsers is set: give the Secret keys of Prometheus's username and password" }}
{{- end }}
{{- with $c.basicAuth }}
basicAuth:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
