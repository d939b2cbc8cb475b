{{- define "goodput.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "goodput.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "goodput.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "goodput.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "goodput.selectorLabels" -}}
app.kubernetes.io/name: {{ include "goodput.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: {{ .Values.mode }}
{{- end -}}

{{- define "goodput.replicas" -}}
{{- if eq .Values.mode "sidecar" }}{{ .Values.vllm.replicaCount }}{{ else }}{{ .Values.replicaCount }}{{ end -}}
{{- end -}}

{{- define "goodput.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "goodput.servedModel" -}}
{{- default .Values.vllm.model .Values.vllm.servedModelName -}}
{{- end -}}

{{/* goodput's config: generated listeners, backends and scorer, with goodput.config over them. */}}
{{- define "goodput.config" -}}
{{- $cfg := dict "listen" (printf "0.0.0.0:%v" .Values.goodput.port) "admin_listen" (printf "0.0.0.0:%v" .Values.goodput.adminPort) -}}
{{- if eq .Values.mode "sidecar" -}}
{{- $_ := set $cfg "backends" (list (dict "name" "vllm" "url" (printf "http://127.0.0.1:%v" .Values.vllm.port) "models" (list (include "goodput.servedModel" .)))) -}}
{{- else -}}
{{- $_ := set $cfg "backends" .Values.router.backends -}}
{{- end -}}
{{- if .Values.scorer.enabled -}}
{{- $ppl := dict "model_dir" (printf "/models/%s" .Values.scorer.model.dir) "device" (ternary "cuda:0" "cpu" .Values.scorer.gpu) "threads" .Values.scorer.threads "intra_op_threads" .Values.scorer.intraOpThreads -}}
{{- $_ := set $cfg "quality" (dict "sample_rate" .Values.scorer.sampleRate "max_cpu" .Values.scorer.maxCpu "perplexity" $ppl) -}}
{{- end -}}
{{- $cfg = mustMergeOverwrite $cfg (deepCopy .Values.goodput.config) -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* The goodput container, shared by both modes. */}}
{{- define "goodput.container" -}}
- name: goodput
  image: {{ include "goodput.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args: ["serve", "--config", "/etc/goodput/goodput.yaml", "--shutdown-grace-secs", {{ .Values.goodput.shutdownGraceSeconds | quote }}]
  env:
    - name: RUST_LOG
      value: {{ .Values.goodput.logLevel | quote }}
    - name: GOODPUT_LOG_FORMAT
      value: {{ .Values.goodput.logFormat | default "text" | quote }}
    {{- if .Values.goodput.requestLog }}
    # Every metered request's record, one JSON line each, on stdout (logs stay on stderr).
    - name: GOODPUT_REQUEST_LOG
      value: "-"
    {{- end }}
    {{- with .Values.goodput.adminTokenSecret.name }}
    # /admin/* requires this bearer token (the admin port listens on the pod network).
    - name: GOODPUT_ADMIN_TOKEN
      valueFrom:
        secretKeyRef: {name: {{ . | quote }}, key: {{ $.Values.goodput.adminTokenSecret.key | quote }}}
    {{- end }}
  {{- if gt (int .Values.goodput.preStopSleepSeconds) 0 }}
  # A terminating pod leaves its Service's endpoints while SIGTERM is on its way, and the
  # kube-proxies and ingresses follow seconds later: serve what they still send, then drain.
  lifecycle:
    preStop:
      exec:
        command: ["sleep", {{ .Values.goodput.preStopSleepSeconds | quote }}]
  {{- end }}
  ports:
    - {name: http, containerPort: {{ .Values.goodput.port }}, protocol: TCP}
    - {name: admin, containerPort: {{ .Values.goodput.adminPort }}, protocol: TCP}
  startupProbe:
    httpGet: {path: /healthz, port: admin}
    periodSeconds: 2
    failureThreshold: {{ div (add .Values.goodput.startupSeconds 1) 2 | max 1 }}
  livenessProbe:
    httpGet: {path: /healthz, port: admin}
    periodSeconds: 10
    failureThreshold: 3
  readinessProbe:
    httpGet: {path: /readyz, port: admin}
    periodSeconds: 5
    failureThreshold: 2
  resources:
    {{- $res := .Values.goodput.resources }}
    {{- if .Values.scorer.enabled }}{{ $res = .Values.scorer.resources }}{{ end }}
    {{- if and .Values.scorer.enabled .Values.scorer.gpu }}
    {{- $res = mustMergeOverwrite (deepCopy $res) (dict "limits" (dict "nvidia.com/gpu" 1)) }}
    {{- end }}
    {{- toYaml $res | nindent 4 }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  volumeMounts:
    - {name: config, mountPath: /etc/goodput, readOnly: true}
    - {name: tmp, mountPath: /tmp}
    {{- if .Values.scorer.enabled }}
    - {name: models, mountPath: /models, readOnly: true}
    {{- end }}
{{- end -}}

{{/* Volumes and the model init container, shared by both modes. */}}
{{- define "goodput.volumes" -}}
- name: config
  configMap:
    name: {{ include "goodput.fullname" . }}
- name: tmp
  emptyDir: {sizeLimit: 64Mi}
{{- if .Values.scorer.enabled }}
{{- if eq .Values.scorer.model.source "pvc" }}
- name: models
  persistentVolumeClaim:
    claimName: {{ required "scorer.model.pvc.claimName is required with scorer.model.source=pvc" .Values.scorer.model.pvc.claimName }}
    readOnly: true
{{- else }}
- name: models
  emptyDir: {sizeLimit: 2Gi}
{{- end }}
{{- end }}
{{- end -}}

{{- define "goodput.initContainers" -}}
{{- if and .Values.scorer.enabled (eq .Values.scorer.model.source "initContainer") }}
initContainers:
  - name: scorer-model
    image: {{ printf "%s:%s" .Values.scorer.model.image.repository (default .Chart.AppVersion .Values.scorer.model.image.tag) }}
    imagePullPolicy: {{ .Values.image.pullPolicy }}
    command: ["cp", "-r", "/models/.", "/target/"]
    securityContext:
      {{- toYaml .Values.securityContext | nindent 6 }}
    resources:
      requests: {cpu: 100m, memory: 64Mi}
      limits: {cpu: 500m, memory: 256Mi}
    volumeMounts:
      - {name: models, mountPath: /target}
{{- end }}
{{- end -}}

{{- define "goodput.podExtras" -}}
# goodput serves through its preStop sleep, then drains in-flight streams for
# shutdownGraceSeconds; in sidecar mode vLLM then exits. The kubelet must wait for all of it.
terminationGracePeriodSeconds: {{ add .Values.goodput.preStopSleepSeconds .Values.goodput.shutdownGraceSeconds (ternary 15 5 (eq .Values.mode "sidecar")) }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- range . }}
  {{- $c := deepCopy . }}
  {{- if not (hasKey $c "labelSelector") }}
  {{- $_ := set $c "labelSelector" (dict "matchLabels" (include "goodput.selectorLabels" $ | fromYaml)) }}
  {{- end }}
  - {{- toYaml $c | nindent 4 }}
  {{- end }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- end -}}
