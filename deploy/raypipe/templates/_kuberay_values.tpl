{{/*
KubeRay's chart value names (kuberay-operator v1.7). A platform team moving from KubeRay brings
its values file: where a KubeRay value means what a raypipe value means, it is honoured (and
wins over raypipe's default, since only a user's file sets it); the others are listed in NOTES
("raypipe.kuberayIgnored") and never refused. values.schema.json admits exactly KubeRay's names
besides raypipe's own, so a misspelt value is still refused.
*/}}

{{- define "raypipe.replicas" -}}
{{- if hasKey .Values "replicas" }}{{ .Values.replicas }}{{ else }}{{ .Values.replicaCount }}{{ end -}}
{{- end -}}

{{- define "raypipe.concurrency" -}}
{{- if hasKey .Values "reconcileConcurrency" }}{{ .Values.reconcileConcurrency }}{{ else }}{{ .Values.concurrency }}{{ end -}}
{{- end -}}

{{/* The watched namespaces as a JSON list: KubeRay's watchNamespace, else watchNamespaces. */}}
{{- define "raypipe.watchNamespaces" -}}
{{- if .Values.watchNamespace }}{{ toJson .Values.watchNamespace }}{{ else }}{{ toJson (.Values.watchNamespaces | default list) }}{{ end -}}
{{- end -}}

{{- define "raypipe.leaderElection" -}}
{{- if hasKey .Values "leaderElectionEnabled" }}{{ .Values.leaderElectionEnabled }}{{ else }}{{ .Values.leaderElection.enabled }}{{ end -}}
{{- end -}}

{{/* logging.stdoutEncoder (json or console) is KubeRay's logFormat (json or text). */}}
{{- define "raypipe.logFormat" -}}
{{- $encoder := "" -}}
{{- with .Values.logging }}{{ $encoder = .stdoutEncoder | default "" }}{{ end -}}
{{- if eq $encoder "console" }}text{{ else if eq $encoder "json" }}json{{ else }}{{ .Values.logFormat }}{{ end -}}
{{- end -}}

{{/* featureGates: raypipe's "A=true,B=false" string, or KubeRay's list of {name, enabled}. */}}
{{- define "raypipe.featureGates" -}}
{{- if kindIs "slice" .Values.featureGates -}}
{{- $gates := list -}}
{{- range .Values.featureGates }}{{ $gates = append $gates (printf "%s=%t" .name (.enabled | default false)) }}{{ end -}}
{{- join "," $gates -}}
{{- else -}}
{{- .Values.featureGates | default "" -}}
{{- end -}}
{{- end -}}

{{/* KubeRay's metrics.enabled: its control-plane series, raypipe's --kuberay-metrics. */}}
{{- define "raypipe.kuberayMetrics" -}}
{{- .Values.metrics.enabled | default false -}}
{{- end -}}

{{/* The ServiceMonitor: raypipe's serviceMonitor.*, or KubeRay's metrics.serviceMonitor.*. */}}
{{- define "raypipe.serviceMonitor" -}}
{{- $kuberay := dict -}}
{{- with .Values.metrics }}{{ with .serviceMonitor }}{{ $kuberay = . }}{{ end }}{{ end -}}
{{- $labels := merge (dict) (.Values.serviceMonitor.labels | default dict) ($kuberay.additionalLabels | default dict) -}}
{{- toJson (dict
  "enabled" (or .Values.serviceMonitor.enabled ($kuberay.enabled | default false))
  "interval" ($kuberay.interval | default .Values.serviceMonitor.interval)
  "namespace" ($kuberay.namespace | default "")
  "labels" $labels) -}}
{{- end -}}

{{/* The operator image, unless it is KubeRay's own operator (which cannot run raypipe). */}}
{{- define "raypipe.kuberayImage" -}}
{{- if regexMatch "(^|/)kuberay/operator$" (.Values.image.repository | default "") }}true{{ end -}}
{{- end -}}

{{- define "raypipe.image" -}}
{{- if include "raypipe.kuberayImage" . -}}
{{- printf "raypipe:%s" .Chart.AppVersion -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{/* Pod labels and annotations: raypipe's podLabels/podAnnotations plus KubeRay's labels/annotations. */}}
{{- define "raypipe.podLabels" -}}
{{- toJson (merge (dict) (.Values.podLabels | default dict) (.Values.labels | default dict)) -}}
{{- end -}}

{{- define "raypipe.podAnnotations" -}}
{{- toJson (merge (dict) (.Values.podAnnotations | default dict) (.Values.annotations | default dict)) -}}
{{- end -}}

{{/* Environment: raypipe's extraEnv, then KubeRay's env (later entries win in a container). */}}
{{- define "raypipe.extraEnv" -}}
{{- toJson (concat (.Values.extraEnv | default list) (.Values.env | default list)) -}}
{{- end -}}

{{/* The metrics Service: KubeRay's service.type and service.port. */}}
{{- define "raypipe.metricsServicePort" -}}
{{- if and .Values.service .Values.service.port }}{{ .Values.service.port }}{{ else }}{{ .Values.metrics.service.port }}{{ end -}}
{{- end -}}

{{- define "raypipe.metricsServiceType" -}}
{{- if and .Values.service .Values.service.type }}{{ .Values.service.type }}{{ else }}ClusterIP{{ end -}}
{{- end -}}

{{/* KubeRay's batchScheduler: name, or the deprecated enabled (Volcano); both is an error, as in
KubeRay (its operator refuses to start). Empty: none. */}}
{{- define "raypipe.batchSchedulerFlag" -}}
{{- with .Values.batchScheduler -}}
{{- if and .enabled .name -}}
{{- fail "batchScheduler: set name or the deprecated enabled, not both (KubeRay refuses both too)" -}}
{{- else if .enabled -}}
--enable-batch-scheduler
{{- else if .name -}}
--batch-scheduler={{ .name }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The batch scheduler the flag names ("volcano" for the deprecated switch). */}}
{{- define "raypipe.batchScheduler" -}}
{{- with .Values.batchScheduler -}}
{{- if .enabled }}volcano{{ else }}{{ .name | default "" }}{{ end -}}
{{- end -}}
{{- end -}}

{{/* KubeRay values set to something raypipe does not do, one line each (empty: none). */}}
{{- define "raypipe.kuberayIgnored" -}}
{{- $v := .Values -}}
{{- if include "raypipe.kuberayImage" . }}
- image {{ $v.image.repository }}:{{ $v.image.tag }} is KubeRay's operator, which cannot run raypipe; set image.repository and image.tag to raypipe's image (using {{ include "raypipe.image" . }})
{{- end }}
{{- with $v.componentOverride }}
- componentOverride: raypipe labels each object with its own component
{{- end }}
{{- with $v.logging }}
{{- if or .baseDir .fileName }}
- logging.baseDir/fileName: raypipe logs to standard output only
{{- end }}
{{- end }}
{{- with $v.operatorCommand }}
- operatorCommand ({{ . }}): raypipe's image has its own entrypoint
{{- end }}
{{- if $v.useKubernetesProxy }}
- useKubernetesProxy: raypipe reaches Ray dashboards directly (or through rayDashboardUrl)
{{- end }}
{{- if $v.singleNamespaceInstall }}
- singleNamespaceInstall: raypipe's chart needs cluster-scoped RBAC (CRD reads, webhook configuration); use watchNamespaces to limit what the controllers may touch
{{- end }}
{{- with $v.metrics }}{{ with .serviceMonitor }}
{{- if and (hasKey . "honorLabels") (not .honorLabels) }}
- metrics.serviceMonitor.honorLabels=false: raypipe's ServiceMonitor always keeps the series' own labels
{{- end }}
{{- end }}{{ end }}
{{- end -}}
