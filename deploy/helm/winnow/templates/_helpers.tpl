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

{{/* ---- Gateway API Inference Extension: the endpoint picker (EPP), HTTPRoute, Gateway ---- */}}

{{/* The EPP's labels. Its own app.kubernetes.io/name ("<chart>-epp"), so that no selector of
the daemon (Deployment, Services, PDB, InferencePool: name + instance) ever matches a picker
pod. */}}
{{- define "winnow.epp.selectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-epp" (include "winnow.name" .) }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "winnow.epp.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "winnow.epp.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.inferencePool.endpointPicker.image.tag | quote }}
app.kubernetes.io/component: endpoint-picker
app.kubernetes.io/part-of: {{ include "winnow.fullname" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "winnow.epp.image" -}}
{{- $img := .Values.inferencePool.endpointPicker.image -}}
{{- printf "%s:%s" $img.repository $img.tag -}}
{{- end -}}

{{/* How the EPP scrapes winnow's /metrics: https exactly when the daemon serves it on the
TLS HTTP port (tls.secretName set, no separate ports.metrics, which stays plaintext). */}}
{{- define "winnow.epp.metricsScheme" -}}
{{- if and .Values.tls.secretName (not .Values.ports.metrics) -}}https{{- else -}}http{{- end -}}
{{- end -}}

{{/* The EndpointPickerConfig (the EPP's --config-file): scorers for queue length, KV-cache
usage and prefix affinity, one profile, the highest score wins. endpointPicker.config
replaces it whole. */}}
{{- define "winnow.epp.config" -}}
{{- $epp := .Values.inferencePool.endpointPicker -}}
{{- if $epp.config -}}
{{- $epp.config -}}
{{- else -}}
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
  - type: queue-scorer
  - type: kv-cache-utilization-scorer
  - type: prefix-cache-scorer
  - type: single-profile-handler
  - type: max-score-picker
schedulingProfiles:
  - name: default
    plugins:
      - pluginRef: queue-scorer
        weight: {{ $epp.scorers.queue }}
      - pluginRef: kv-cache-utilization-scorer
        weight: {{ $epp.scorers.kvCacheUtilization }}
      - pluginRef: prefix-cache-scorer
        weight: {{ $epp.scorers.prefixCache }}
      - pluginRef: max-score-picker
{{- end -}}
{{- end -}}

{{/* The Gateway the chart renders (inferencePool.gateway.enabled). */}}
{{- define "winnow.gatewayName" -}}
{{- default (include "winnow.fullname" .) .Values.inferencePool.gateway.name -}}
{{- end -}}

{{/* The HTTPRoute's parent as a dict (name, namespace, sectionName; empty name: none known):
httpRoute.parentRef when it names one, else the chart's own Gateway and its listener. */}}
{{- define "winnow.routeParent" -}}
{{- $ref := .Values.inferencePool.httpRoute.parentRef -}}
{{- if $ref.name -}}
{{- toYaml (dict "name" $ref.name "namespace" (default .Release.Namespace $ref.namespace) "sectionName" ($ref.sectionName | default "")) -}}
{{- else if .Values.inferencePool.gateway.enabled -}}
{{- toYaml (dict "name" (include "winnow.gatewayName" .) "namespace" .Release.Namespace "sectionName" .Values.inferencePool.gateway.listener.name) -}}
{{- else -}}
{{- toYaml (dict "name" "") -}}
{{- end -}}
{{- end -}}

{{/* Scale to zero is refused: with no pod nothing exports winnow_requests_waiting, so neither
autoscaler could see the demand that should wake the release (docs/deploy.md, Autoscaling). */}}
{{- define "winnow.autoscaling.check" -}}
{{- if lt (int .Values.autoscaling.minReplicas) 1 -}}
{{- fail "autoscaling.minReplicas must be at least 1: scale to zero is not supported (docs/deploy.md, Autoscaling)" -}}
{{- end -}}
{{- end -}}
