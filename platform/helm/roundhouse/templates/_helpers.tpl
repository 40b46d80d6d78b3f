{{/* Names, labels and the pieces every pod of the platform shares. */}}

{{- define "roundhouse.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "roundhouse.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A component's resource name: (dict "root" $ "component" "frontend"). */}}
{{- define "roundhouse.componentName" -}}
{{- printf "%s-%s" (include "roundhouse.fullname" .root) .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "roundhouse.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels of a component: (dict "root" $ "component" "frontend"). */}}
{{- define "roundhouse.selectorLabels" -}}
app.kubernetes.io/name: {{ include "roundhouse.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* All labels of a component's objects: (dict "root" $ "component" "frontend"). */}}
{{- define "roundhouse.labels" -}}
helm.sh/chart: {{ include "roundhouse.chart" .root }}
{{ include "roundhouse.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end -}}

{{- define "roundhouse.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "roundhouse.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "roundhouse.secretName" -}}
{{- default (include "roundhouse.componentName" (dict "root" . "component" "secrets")) .Values.secrets.existingSecret -}}
{{- end -}}

{{- define "roundhouse.configMapName" -}}
{{- include "roundhouse.componentName" (dict "root" . "component" "config") -}}
{{- end -}}

{{- define "roundhouse.artifactsClaimName" -}}
{{- default (include "roundhouse.componentName" (dict "root" . "component" "artifacts")) .Values.artifacts.existingClaim -}}
{{- end -}}

{{/* repository:tag of an image dict, the tag defaulting to the chart's appVersion, and
     @digest when the dict pins one (make image writes it): the runtime pulls by digest. */}}
{{- define "roundhouse.image" -}}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag | toString) -}}
{{- with .image.digest }}@{{ . }}{{ end -}}
{{- end -}}

{{/* The image dict of a worker: (dict "root" $ "model" $model "gpus" $gpus). Its entry's image,
     then workerDefaults.image, over the CUDA build for GPU workers or the platform's image.
     An override naming a repository or tag does not inherit the base's digest. */}}
{{- define "roundhouse.workerImage" -}}
{{- $values := .root.Values -}}
{{- $base := deepCopy $values.image -}}
{{- if gt .gpus 0 -}}
{{- $base = merge (deepCopy $values.gpuImage) (dict "pullPolicy" $values.image.pullPolicy) -}}
{{- if not $base.tag -}}
{{- $_ := set $base "tag" (printf "%s-cuda" .root.Chart.AppVersion) -}}
{{- end -}}
{{- end -}}
{{- $override := merge (deepCopy (default dict .model.image)) (deepCopy (default dict $values.workerDefaults.image)) -}}
{{- if or $override.repository $override.tag -}}
{{- $_ := set $base "digest" "" -}}
{{- end -}}
{{- toYaml (merge $override $base) -}}
{{- end -}}

{{/* Pod annotations: config checksums (pods roll when settings change) and scrape hints.
     (dict "root" $ "metricsPort" 8000 "extra" $podAnnotations); metricsPort 0: no scraping. */}}
{{- define "roundhouse.podAnnotations" -}}
checksum/config: {{ include (print .root.Template.BasePath "/configmap.yaml") .root | sha256sum }}
{{- if not .root.Values.secrets.existingSecret }}
checksum/secret: {{ include (print .root.Template.BasePath "/secret.yaml") .root | sha256sum }}
{{- end }}
{{- if and .metricsPort .root.Values.metrics.podAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .metricsPort | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- with .extra }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The environment every platform process reads. */}}
{{- define "roundhouse.envFrom" -}}
- configMapRef:
    name: {{ include "roundhouse.configMapName" . }}
- secretRef:
    name: {{ include "roundhouse.secretName" . }}
{{- end -}}

{{/* The shared model store and a scratch /tmp: (dict "root" $ "readOnly" true). */}}
{{- define "roundhouse.volumeMounts" -}}
- name: artifacts
  mountPath: {{ .root.Values.artifacts.mountPath }}
  readOnly: {{ .readOnly }}
- name: tmp
  mountPath: /tmp
{{- end -}}

{{- define "roundhouse.volumes" -}}
- name: artifacts
  persistentVolumeClaim:
    claimName: {{ include "roundhouse.artifactsClaimName" . }}
- name: tmp
  emptyDir: {}
{{- end -}}

{{/* Scheduling fields of a pod spec from a dict with nodeSelector, tolerations, affinity. */}}
{{- define "roundhouse.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .spread }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Pods of one component spread over zones: (dict "root" $ "labels" <its selector labels>). */}}
{{- define "roundhouse.zoneSpread" -}}
{{- $spread := .root.Values.zoneSpread -}}
{{- if $spread.enabled -}}
- maxSkew: {{ $spread.maxSkew }}
  topologyKey: {{ $spread.topologyKey }}
  whenUnsatisfiable: {{ $spread.whenUnsatisfiable }}
  labelSelector:
    matchLabels:
      {{- toYaml .labels | nindent 6 }}
{{- end -}}
{{- end -}}

{{/* The deployment name every worker-level object of a model deployment is named after. */}}
{{- define "roundhouse.workerName" -}}
{{- include "roundhouse.componentName" (dict "root" .root "component" (printf "worker-%s" .model.name)) -}}
{{- end -}}

{{/*
SLO targets for the PrometheusRule, per objective (ttftSeconds, itlSeconds, availability): one
entry for each model deployment with its own objective in modelDeployments[].slo, then one for
every other deployment with the default of .Values.slo. An entry has the objective's value, a
label matcher to put first inside a selector's braces (`selector`, ending in ", ") and the same
matcher as a whole selector (`braces`); both are empty when no deployment has its own.
*/}}
{{- define "roundhouse.sloTargets" -}}
{{- $root := . -}}
{{- $result := dict -}}
{{- range $key := list "ttftSeconds" "itlSeconds" "availability" -}}
{{- $targets := list -}}
{{- $own := list -}}
{{- range $m := $root.Values.modelDeployments -}}
{{- if and $m.slo (hasKey $m.slo $key) -}}
{{- $matcher := printf "deployment=%q" $m.deploymentName -}}
{{- $targets = append $targets (dict "value" (get $m.slo $key) "selector" (printf "%s, " $matcher) "braces" (printf "{%s}" $matcher)) -}}
{{- $own = append $own $m.deploymentName -}}
{{- end -}}
{{- end -}}
{{- if $own -}}
{{- $matcher := printf "deployment!~%q" (join "|" $own) -}}
{{- $targets = append $targets (dict "value" (get $root.Values.slo $key) "selector" (printf "%s, " $matcher) "braces" (printf "{%s}" $matcher)) -}}
{{- else -}}
{{- $targets = append $targets (dict "value" (get $root.Values.slo $key) "selector" "" "braces" "") -}}
{{- end -}}
{{- $_ := set $result $key $targets -}}
{{- end -}}
{{- toYaml $result -}}
{{- end -}}

{{/* A worker node's weights cache: the hostPath volume, its mount and the settings naming it. */}}
{{- define "roundhouse.weightsCacheVolume" -}}
- name: weights-cache
  hostPath:
    path: {{ .Values.weightsCache.hostPath }}
    type: DirectoryOrCreate
{{- end -}}

{{/* The init container that hands the node's weights cache to the image's user: a hostPath is
     created root-owned. The only container of the chart that runs as root, with CAP_CHOWN
     alone. (dict "root" $ "image" $imageDict) */}}
{{- define "roundhouse.weightsCacheOwner" -}}
{{- $pod := default dict .root.Values.podSecurityContext -}}
- name: weights-cache-owner
  image: {{ include "roundhouse.image" (dict "root" .root "image" .image) }}
  imagePullPolicy: {{ .image.pullPolicy }}
  command:
    - chown
    - {{ printf "%v:%v" (default 10001 $pod.runAsUser) (default 10001 $pod.runAsGroup) | quote }}
    - {{ .root.Values.weightsCache.hostPath | quote }}
  securityContext:
    runAsUser: 0
    runAsNonRoot: false
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: [ALL]
      add: [CHOWN]
  volumeMounts:
    {{- include "roundhouse.weightsCacheMount" .root | nindent 4 }}
{{- end -}}

{{- define "roundhouse.weightsCacheMount" -}}
- name: weights-cache
  mountPath: {{ .Values.weightsCache.hostPath }}
{{- end -}}

{{- define "roundhouse.weightsCacheEnv" -}}
- name: ROUNDHOUSE_WEIGHTS_CACHE_DIR
  value: {{ .Values.weightsCache.hostPath | quote }}
- name: ROUNDHOUSE_WEIGHTS_CACHE_MAX_BYTES
  value: {{ .Values.weightsCache.maxBytes | int64 | quote }}
{{- end -}}
