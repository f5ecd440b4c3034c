{{/* Names, labels and RBAC rules shared by the templates. */}}

{{- define "raypipe.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "raypipe.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "raypipe.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "raypipe.labels" -}}
app.kubernetes.io/name: {{ include "raypipe.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "raypipe.selectorLabels" -}}
app.kubernetes.io/name: {{ include "raypipe.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "raypipe.serviceAccountName" -}}
{{- default (include "raypipe.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "raypipe.webhookServiceName" -}}
{{- printf "%s-webhook" (include "raypipe.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "raypipe.webhookSecretName" -}}
{{- default (printf "%s-webhook-cert" (include "raypipe.fullname" .)) .Values.webhook.certificate.secretName -}}
{{- end -}}

{{- define "raypipe.webhookConfigurationName" -}}
{{- include "raypipe.fullname" . -}}
{{- end -}}

{{/*
Permissions the enabled controllers need in the namespaces they watch: nothing more. Verbs
follow what each controller does: reads through watches (get, list, watch), writes through
server-side apply (patch; create and update for the few plain writes), status subresources,
and Events.
*/}}
{{- define "raypipe.controllerRules" -}}
{{- $c := .Values.controllers -}}
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- if has "servepipeline" $c }}
- apiGroups: [raypipe.dev]
  resources: [servepipelines]
  # patch: removing a rollout command (annotation) once it is carried out.
  verbs: [get, list, watch, patch]
- apiGroups: [raypipe.dev]
  resources: [servepipelines/status]
  verbs: [get, patch, update]
- apiGroups: [ray.io]
  resources: [rayservices]
  verbs: [get, list, watch, create, patch]
# A pipeline in a Kueue queue reports its clusters' admission (read only).
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [get, list]
{{- end }}
{{- if or (has "servepipeline" $c) (has "raycluster" $c) }}
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, list, watch{{ if has "raycluster" $c }}, create, patch{{ end }}]
{{- end }}
{{- if has "raycluster" $c }}
- apiGroups: [ray.io]
  resources: [rayclusters]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [ray.io]
  resources: [rayclusters/status]
  verbs: [get, patch, update]
- apiGroups: [ray.io]
  resources: [rayclusters/finalizers]
  verbs: [update]
- apiGroups: [""]
  resources: [pods, services]
  verbs: [get, list, watch, create, update, patch, delete, deletecollection]
- apiGroups: [""]
  resources: [pods/status, services/status]
  verbs: [get]
# The autoscaler's Role grants this; RBAC lets the operator grant only what it holds itself.
- apiGroups: [""]
  resources: [pods/resize]
  verbs: [patch]
- apiGroups: [""]
  resources: [serviceaccounts, persistentvolumeclaims]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, delete]
- apiGroups: [networking.k8s.io]
  resources: [ingresses, networkpolicies]
  verbs: [get, list, watch, create, update, patch, delete]
# mTLS (gate RayClusterMTLS): the cluster's cert-manager PKI.
- apiGroups: [cert-manager.io]
  resources: [issuers, certificates]
  verbs: [get, list, watch, create, update, patch]
{{- end }}
{{- if or (has "raycluster" $c) (has "rayjob" $c) }}
{{- $batch := include "raypipe.batchScheduler" . }}
{{- if eq $batch "volcano" }}
# batchScheduler volcano: the PodGroups of RayClusters and RayJobs.
- apiGroups: [scheduling.volcano.sh]
  resources: [podgroups]
  verbs: [get, list, watch, create, update]
{{- else if eq $batch "scheduler-plugins" }}
# batchScheduler scheduler-plugins: the RayClusters' PodGroups.
- apiGroups: [scheduling.x-k8s.io]
  resources: [podgroups]
  verbs: [get, list, watch, create]
{{- end }}
{{- end }}
{{- if has "rayservice" $c }}
- apiGroups: [ray.io]
  resources: [rayservices]
  verbs: [get, list, watch, update, patch]
- apiGroups: [ray.io]
  resources: [rayservices/status]
  verbs: [get, patch, update]
- apiGroups: [ray.io]
  resources: [rayservices/finalizers]
  verbs: [update]
- apiGroups: [ray.io]
  resources: [rayclusters]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, patch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
# NewClusterWithIncrementalUpgrade (KubeRay's rule).
- apiGroups: [gateway.networking.k8s.io]
  resources: [gateways, httproutes]
  verbs: [get, list, watch, create, update, patch, delete]
{{- end }}
{{- if has "rayjob" $c }}
- apiGroups: [ray.io]
  resources: [rayjobs]
  verbs: [get, list, watch, update, patch, delete]
- apiGroups: [ray.io]
  resources: [rayjobs/status]
  verbs: [get, patch, update]
- apiGroups: [ray.io]
  resources: [rayjobs/finalizers]
  verbs: [update]
- apiGroups: [ray.io]
  resources: [rayclusters]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
# The dashboard token of clusters with token authentication.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
{{- end }}
{{- if has "raycronjob" $c }}
- apiGroups: [ray.io]
  resources: [raycronjobs]
  verbs: [get, list, watch]
- apiGroups: [ray.io]
  resources: [raycronjobs/status]
  verbs: [get, patch, update]
# Owner references with blockOwnerDeletion on the RayJobs it creates.
- apiGroups: [ray.io]
  resources: [raycronjobs/finalizers]
  verbs: [update]
- apiGroups: [ray.io]
  resources: [rayjobs]
  verbs: [get, list, watch, create, delete]
{{- end }}
{{- $console := .Values.console | default dict }}
{{- if $console.enabled }}
# The console (console.enabled) reads in the same namespaces: the pipelines (a watch), their
# RayServices and Events, and for the dashboard front each RayCluster and its Ray auth token
# Secret. Only what the controllers above do not grant already.
- apiGroups: [""]
  resources: [events]
  verbs: [list]
{{- if not (has "servepipeline" $c) }}
- apiGroups: [raypipe.dev]
  resources: [servepipelines]
  verbs: [get, list, watch]
{{- end }}
{{- if not (or (has "servepipeline" $c) (has "rayservice" $c)) }}
- apiGroups: [ray.io]
  resources: [rayservices]
  verbs: [get]
{{- end }}
{{- if ne (toString $console.dashboards) "false" }}
{{- if not (or (has "raycluster" $c) (has "rayservice" $c) (has "rayjob" $c)) }}
- apiGroups: [ray.io]
  resources: [rayclusters]
  verbs: [get]
{{- end }}
{{- if not (or (has "servepipeline" $c) (has "raycluster" $c) (has "rayjob" $c)) }}
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
"true" when any field of KubeRay's configuration file is set (rendered as a ConfigMap and
passed with --config); empty otherwise.
*/}}
{{- define "raypipe.configured" -}}
{{- with .Values.configuration -}}
{{- if and (ne (toString .enabled) "false") (or .defaultContainerEnvs .defaultPodLabels .defaultPodAnnotations .headSidecarContainers .workerSidecarContainers) -}}
true
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The history storage variables (history.storageEnv) as a JSON list, for the operator container
(history.record) and the history-api container (history.api.enabled). Either needs the storage
named: the render fails without a STORAGE_BACKEND entry rather than installing an operator that
cannot start.
*/}}
{{- define "raypipe.historyStorageEnv" -}}
{{- $history := .Values.history | default dict -}}
{{- $api := $history.api | default dict -}}
{{- $env := $history.storageEnv | default list -}}
{{- $wanted := list -}}
{{- if $history.record }}{{ $wanted = append $wanted "history.record" }}{{ end -}}
{{- if $api.enabled }}{{ $wanted = append $wanted "history.api.enabled" }}{{ end -}}
{{- if $wanted -}}
{{- $backend := false -}}
{{- range $env }}{{ if eq (toString .name) "STORAGE_BACKEND" }}{{ $backend = true }}{{ end }}{{ end -}}
{{- if not $backend -}}
{{- fail (printf "%s set, but history.storageEnv has no STORAGE_BACKEND entry: add one (s3, gcs, azureblob, aliyunoss or local) and that backend's variables (docs/history.md)" (join " and " $wanted)) -}}
{{- end -}}
{{- end -}}
{{- toJson $env -}}
{{- end -}}
