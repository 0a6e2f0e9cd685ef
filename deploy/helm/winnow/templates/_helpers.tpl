{{/* Chart name, trimmed to the 63 characters a label value allows. */}}
{{- define "winnow.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Resource names: the release name, plus "-winnow" unless it already contains it. */}}
{{- define "winnow.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "winnow.selectorLabels" -}}
app.kubernetes.io/name: {{ include "winnow.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "winnow.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "winnow.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: inference-server
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "winnow.image" -}}
{{- $tag := default (printf "%s-%s" .Chart.AppVersion .Values.image.flavor) .Values.image.tag -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}

{{/* The daemon's --config YAML: the user's settings plus the ones the chart owns. */}}
{{/* The winnow_release label every metric series of this release carries (--metrics-labels):
what the KEDA query selects on, whatever labels the scraper adds. */}}
{{- define "winnow.releaseLabel" -}}
{{- printf "%s/%s" .Release.Namespace (include "winnow.fullname" .) -}}
{{- end -}}

{{- define "winnow.config" -}}
{{- range $key := list "model" "host" "port" "http-port" "metrics-port" "metrics-labels" "drain-timeout" "config" "tls-cert" "tls-key" "tls-client-ca" "api-key-file" -}}
{{- if hasKey $.Values.config $key -}}
{{- fail (printf "config.%s is set by the chart; use the values model.*, ports.*, drain.*, tls.* or auth.* instead (metrics-labels: the chart's winnow_release label)" $key) -}}
{{- end -}}
{{- end -}}
{{- $owned := dict
      "model" (printf "/models/%s" .Values.model.file)
      "host" "0.0.0.0"
      "port" (int .Values.ports.grpc)
      "http-port" (int .Values.ports.http)
      "metrics-labels" (printf "winnow_release=%s" (include "winnow.releaseLabel" .))
      "drain-timeout" (printf "%ds" (int .Values.drain.timeoutSeconds)) -}}
{{- if .Values.ports.metrics -}}
{{- $_ := set $owned "metrics-port" (int .Values.ports.metrics) -}}
{{- end -}}
{{- if .Values.tls.secretName -}}
{{- $_ := set $owned "tls-cert" "/etc/winnow/tls/tls.crt" -}}
{{- $_ := set $owned "tls-key" "/etc/winnow/tls/tls.key" -}}
{{- if .Values.tls.clientCAKey -}}
{{- $_ := set $owned "tls-client-ca" (printf "/etc/winnow/tls/%s" .Values.tls.clientCAKey) -}}
{{- end -}}
{{- else if .Values.tls.clientCAKey -}}
{{- fail "tls.clientCAKey needs tls.secretName: mutual TLS is TLS first" -}}
{{- end -}}
{{- if .Values.auth.apiKeySecret.name -}}
{{- $_ := set $owned "api-key-file" (printf "/etc/winnow/auth/%s" .Values.auth.apiKeySecret.key) -}}
{{- end -}}
{{- toYaml (merge $owned .Values.config) -}}
{{- end -}}


{{/* The HTTP port's scheme: https when the chart mounts a TLS certificate. */}}
{{- define "winnow.httpScheme" -}}
{{- if .Values.tls.secretName -}}HTTPS{{- else -}}HTTP{{- end -}}
{{- end -}}

{{/* The container port Prometheus scrapes: the separate metrics port if any, else HTTP. */}}
{{- define "winnow.metricsPortName" -}}
{{- if .Values.ports.metrics -}}metrics{{- else -}}http{{- end -}}
{{- end -}}

{{- define "winnow.metricsPort" -}}
{{- if .Values.ports.metrics -}}{{ .Values.ports.metrics }}{{- else -}}{{ .Values.ports.http }}{{- end -}}
{{- end -}}

{{- define "winnow.eppServiceName" -}}
{{- default (printf "%s-epp" (include "winnow.fullname" .)) .Values.inferencePool.endpointPicker.serviceName -}}
{{- end -}}
