{{/* The labels every object carries; the selector uses the first two only (they never change). */}}
{{- define "nodemedic.selector" -}}
app.kubernetes.io/name: nodemedic-agent
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "nodemedic.labels" -}}
{{ include "nodemedic.selector" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* The agent's configuration, with the two fields it cannot start without checked here. */}}
{{- define "nodemedic.config" -}}
{{- $_ := required "config.cluster is required: the stack's ClusterName (--set config.cluster=...)" .Values.config.cluster -}}
{{- $_ := required "config.event_bus is required: the stack output EventBusName (--set config.event_bus=...)" .Values.config.event_bus -}}
{{- $source := (.Values.config.kernel_log | default dict).source | default "kmsg" -}}
{{- if not (has $source (list "kmsg" "journal" "off")) -}}
{{- fail (printf "config.kernel_log.source must be kmsg, journal or off in a DaemonSet (got %q)" $source) -}}
{{- end -}}
{{ toToml .Values.config }}
{{- end }}
