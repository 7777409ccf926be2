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
{{- /* The storage check judges the spool directory's file system: the one host path the pod writes.
       Its own root and every other mount are read-only by design, and would read as FS_READONLY. */ -}}
{{- $config := deepCopy .Values.config -}}
{{- $spool := ($config.publish | default dict).spool_dir | default "/var/spool/nodemedic-agent" -}}
{{- $storage := $config.storage | default dict -}}
{{- $paths := $storage.paths | default (list $spool) -}}
{{- range $paths -}}
{{- if ne . $spool -}}
{{- fail (printf "config.storage.paths may name only the spool directory %s in a DaemonSet (got %q): the agent's own root and the host paths it mounts are read-only, and would read as FS_READONLY" $spool .) -}}
{{- end -}}
{{- end -}}
{{- $_ := set $storage "paths" $paths -}}
{{- $_ := set $config "storage" $storage -}}
{{ toToml $config }}
{{- end }}
