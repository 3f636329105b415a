{{/* Name of the chart's component, used in labels. */}}
{{- define "infergate.name" -}}
{{- default "infergate-operator" .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name of the release's objects: <release>-operator unless overridden. */}}
{{- define "infergate.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-operator" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "infergate.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* metrics.auth, `kubernetes` for a release made before the key existed (helm upgrade --reuse-values). */}}
{{- define "infergate.metricsAuth" -}}
{{- .Values.metrics.auth | default "kubernetes" -}}
{{- end -}}

{{/*
"true" when the metrics port serves HTTPS: metrics.tls.enabled when set; else on with a
certificate Secret or with metrics.auth kubernetes (Prometheus's token must not cross the
network in clear), off with none. A release upgraded with --reuse-values from before
metrics.tls has no such map: it gets the default.
*/}}
{{- define "infergate.metricsTLS" -}}
{{- $tls := .Values.metrics.tls | default dict -}}
{{- if kindIs "bool" $tls.enabled -}}
{{- if and (not $tls.enabled) $tls.certSecret -}}
{{- fail "metrics.tls.certSecret needs metrics.tls.enabled: a certificate for a port told to serve plain HTTP (drop one of them)" -}}
{{- end -}}
{{- $tls.enabled -}}
{{- else if $tls.certSecret -}}
true
{{- else -}}
{{- eq (include "infergate.metricsAuth" .) "kubernetes" -}}
{{- end -}}
{{- end -}}

{{/* Where the metrics certificate Secret is mounted. */}}
{{- define "infergate.metricsTLSDir" -}}
/etc/infergate/metrics-tls
{{- end -}}

{{- define "infergate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "infergate.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "infergate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "infergate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "infergate.labels" -}}
{{ include "infergate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: infergate
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Settings that cannot be expressed in values.schema.json. */}}
{{- define "infergate.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.leaderElection.enabled) -}}
{{- fail "replicaCount > 1 needs leaderElection.enabled: without a leader, replicas would reconcile against each other" -}}
{{- end -}}
{{- end -}}

{{/* The global router's objects: <release>-global-router. */}}
{{- define "infergate.globalRouter.fullname" -}}
{{- printf "%s-global-router" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "infergate.globalRouter.selectorLabels" -}}
app.kubernetes.io/name: infergate-global-router
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "infergate.globalRouter.labels" -}}
{{ include "infergate.globalRouter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: global-router
app.kubernetes.io/part-of: infergate
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The global router's global.yaml: `globalRouter.config` with `listen` and `admin` from
`globalRouter.ports`, after the checks the schema cannot express. */}}
{{- define "infergate.globalRouter.config" -}}
{{- $g := .Values.globalRouter -}}
{{- $c := deepCopy $g.config -}}
{{- if not (hasKey $c "auth") -}}
{{- fail "globalRouter.config.auth is required: configure jwt and/or apiKeys, or write `auth: none` to run the router without authentication" -}}
{{- end -}}
{{- if not $c.clusters -}}
{{- fail "globalRouter.config.clusters needs at least one cluster" -}}
{{- end -}}
{{- range $k := list "listen" "admin" -}}
{{- if hasKey $c $k -}}
{{- fail (printf "globalRouter.config.%s is set by the chart from globalRouter.ports: leave it out" $k) -}}
{{- end -}}
{{- end -}}
{{- $public := ne $g.service.type "ClusterIP" -}}
{{- if and $public (eq (toString $c.auth) "none") (not $g.allowUnauthenticated) -}}
{{- fail (printf "globalRouter.service.type %s with globalRouter.config.auth: none would expose an unauthenticated front door outside the cluster: configure auth, or set globalRouter.allowUnauthenticated: true" $g.service.type) -}}
{{- end -}}
{{- if and (gt (int $g.replicaCount) 1) $c.quotas (not $c.quotas.redis) -}}
{{- fail "globalRouter.replicaCount > 1 with globalRouter.config.quotas needs globalRouter.config.quotas.redis: without it each replica counts alone and the fleet admits replicaCount times every limit" -}}
{{- end -}}
{{- $_ := set $c "listen" (printf "0.0.0.0:%d" (int $g.ports.http)) -}}
{{- $_ := set $c "admin" (printf "0.0.0.0:%d" (int $g.ports.admin)) -}}
{{- toYaml $c -}}
{{- end -}}

{{/* The uninstall hook's objects: <full name>-uninstall, the full name shortened so the suffix
always fits (cut, the name could equal the operator's own ClusterRole, which the hook's
before-hook-creation policy would then delete). */}}
{{- define "infergate.uninstallHook.fullname" -}}
{{- printf "%s-uninstall" (include "infergate.fullname" . | trunc 53 | trimSuffix "-") -}}
{{- end -}}

{{/* Not the operator's selector labels: the metrics Service and the PodDisruptionBudget must not
select the hook's pod. */}}
{{- define "infergate.uninstallHook.labels" -}}
app.kubernetes.io/name: infergate-uninstall
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: uninstall-hook
app.kubernetes.io/part-of: infergate
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Hook annotations of the uninstall hook's objects; `weight` orders them (RBAC first). */}}
{{- define "infergate.uninstallHook.annotations" -}}
helm.sh/hook: pre-delete
helm.sh/hook-weight: {{ .weight | quote }}
helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
{{- end -}}
