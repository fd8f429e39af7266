{{/*
The vllm-headroom sidecar: one definition for the vllm shape's pod and for the patch that adds the
sidecar to another chart's pods (shape sidecar). Each template takes the chart's root context.

GPU visibility (docs/kubernetes.md, "Which GPUs the sidecar watches"):
- gpu.discovery=process: the pod shares its process namespace; the sidecar reads vLLM's
  NVIDIA_VISIBLE_DEVICES (the GPU UUIDs the device plugin gave vLLM) from /proc/<pid>/environ
  and watches exactly those. For NVML to open them, the NVIDIA container runtime injects the
  driver's utility libraries and the GPU device nodes into the sidecar
  (NVIDIA_VISIBLE_DEVICES=all, NVIDIA_DRIVER_CAPABILITIES=utility: NVML, no CUDA); the sidecar
  requests no nvidia.com/gpu, so the scheduler counts none for it. If vLLM's list cannot be read
  (another UID, vLLM not found, vLLM sees "all"), HEADROOM_GPU_DISCOVERY=auto reads no GPU at all.
- gpu.discovery=uuids: the sidecar is given and watches exactly gpu.uuids.
- gpu.discovery=none: NVIDIA_VISIBLE_DEVICES=void (the runtime injects nothing), no GPU metrics.
*/}}

{{/*
The GPU discovery in effect: gpu.discovery, or when it is empty the one that works with the shape:
process in shape vllm (the chart runs vLLM under the sidecar's UID), none in shape sidecar
(another chart's vLLM usually runs as root, whose environment a non-root sidecar cannot read).
*/}}
{{- define "vllm-headroom.gpuDiscovery" -}}
{{- if .Values.gpu.discovery -}}
{{- .Values.gpu.discovery -}}
{{- else -}}
{{- ternary "process" "none" (eq .Values.shape "vllm") -}}
{{- end -}}
{{- end -}}

{{- define "vllm-headroom.sidecar.sharesProcesses" -}}
{{- if has (include "vllm-headroom.gpuDiscovery" .) (list "process" "uuids") -}}true{{- end -}}
{{- end -}}

{{- define "vllm-headroom.sidecar.target" -}}
{{- if eq .Values.shape "vllm" -}}
{{- printf "http://127.0.0.1:%d" (int .Values.vllm.port) -}}
{{- else -}}
{{- .Values.sidecar.target -}}
{{- end -}}
{{- end -}}

{{/* The API key secret the sidecar presents as its bearer token, if any. */}}
{{- define "vllm-headroom.sidecar.apiKey" -}}
{{- $key := ternary .Values.vllm.apiKey .Values.sidecar.apiKey (eq .Values.shape "vllm") -}}
{{- if $key.secretName -}}{{- toJson $key -}}{{- end -}}
{{- end -}}

{{- define "vllm-headroom.sidecar.env" -}}
- name: HEADROOM_MODE
  value: sidecar
- name: HEADROOM_TARGET
  value: {{ include "vllm-headroom.sidecar.target" . | quote }}
- name: HEADROOM_PORT
  value: {{ .Values.exporter.port | int | toString | quote }}
- name: HEADROOM_LOG_LEVEL
  value: {{ .Values.exporter.logLevel | quote }}
- name: HEADROOM_LOG_FORMAT
  value: json
# The windows' memory budget follows the container's limit (a quarter of it).
- name: HEADROOM_MEMORY_LIMIT_BYTES
  valueFrom:
    resourceFieldRef:
      containerName: vllm-headroom
      resource: limits.memory
{{- $discovery := include "vllm-headroom.gpuDiscovery" . }}
{{- if eq $discovery "process" }}
- name: HEADROOM_GPU_DISCOVERY
  value: auto
- name: HEADROOM_PROC_ROOT
  value: /proc
- name: NVIDIA_VISIBLE_DEVICES
  value: all
- name: NVIDIA_DRIVER_CAPABILITIES
  value: {{ .Values.gpu.driverCapabilities | quote }}
{{- else if eq $discovery "uuids" }}
- name: HEADROOM_GPU_DISCOVERY
  value: settings
- name: HEADROOM_GPUS
  value: {{ join "," .Values.gpu.uuids | quote }}
- name: HEADROOM_PROC_ROOT
  value: /proc
- name: NVIDIA_VISIBLE_DEVICES
  value: {{ join "," .Values.gpu.uuids | quote }}
- name: NVIDIA_DRIVER_CAPABILITIES
  value: {{ .Values.gpu.driverCapabilities | quote }}
{{- else }}
- name: HEADROOM_GPU_DISCOVERY
  value: none
- name: NVIDIA_VISIBLE_DEVICES
  value: void
{{- end }}
{{- if eq .Values.shape "vllm" }}
- name: HEADROOM_MODEL
  value: {{ .Values.vllm.model | quote }}
- name: HEADROOM_HF_HOME
  value: {{ printf "%s/huggingface" (trimSuffix "/" .Values.vllm.modelVolume.mountPath) | quote }}
{{- else }}
{{- with .Values.sidecar.model }}
- name: HEADROOM_MODEL
  value: {{ . | quote }}
{{- end }}
{{- with .Values.sidecar.hfHome }}
- name: HEADROOM_HF_HOME
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- include "vllm-headroom.settingsEnv" . }}
{{- with .Values.exporter.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* exporter.settings as HEADROOM_<NAME> variables, in name order. */}}
{{- define "vllm-headroom.settingsEnv" -}}
{{- range $name := keys .Values.exporter.settings | sortAlpha }}
- name: {{ printf "HEADROOM_%s" (upper $name) }}
  value: {{ include "vllm-headroom.settingValue" (index $.Values.exporter.settings $name) | quote }}
{{- end }}
{{- end -}}

{{/* The sidecar container, as one item of a containers list. */}}
{{- define "vllm-headroom.sidecar.container" -}}
- name: vllm-headroom
  image: {{ include "vllm-headroom.exporterImage" . | quote }}
  imagePullPolicy: {{ .Values.exporter.image.pullPolicy }}
  args: [serve]
  ports:
    - name: headroom
      containerPort: {{ .Values.exporter.port | int }}
      protocol: TCP
  env:
    {{- include "vllm-headroom.sidecar.env" . | nindent 4 }}
  volumeMounts:
    - name: vllm-headroom-tmp
      mountPath: /tmp
    {{- if eq .Values.shape "vllm" }}
    - name: models
      mountPath: {{ .Values.vllm.modelVolume.mountPath }}
      readOnly: true
    {{- else if .Values.sidecar.modelVolume.name }}
    - name: {{ .Values.sidecar.modelVolume.name }}
      mountPath: {{ .Values.sidecar.modelVolume.mountPath }}
      {{- with .Values.sidecar.modelVolume.subPath }}
      subPath: {{ . }}
      {{- end }}
      readOnly: true
    {{- end }}
    {{- if include "vllm-headroom.sidecar.apiKey" . }}
    - name: vllm-headroom-secrets
      mountPath: /run/secrets/vllm-headroom
      readOnly: true
    {{- end }}
  resources:
    {{- toYaml .Values.exporter.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.exporter.securityContext | nindent 4 }}
  # Liveness only: no readiness (nor startup) probe, which would make vLLM's pod unready, and
  # take vLLM out of its Service, whenever the exporter is slow or failing.
  livenessProbe:
    {{- toYaml .Values.exporter.livenessProbe | nindent 4 }}
{{- end -}}

{{/* The sidecar's own volumes, as items of a volumes list. */}}
{{- define "vllm-headroom.sidecar.volumes" -}}
{{- /* Memory-backed: a tmpfs of at most 16Mi (writes beyond fail with ENOSPC) charged to the
sidecar's own memory limit. A disk-backed emptyDir over its sizeLimit gets the whole pod, vLLM
included, evicted by the kubelet. */}}
- name: vllm-headroom-tmp
  emptyDir:
    medium: Memory
    sizeLimit: 16Mi
{{- $apiKey := include "vllm-headroom.sidecar.apiKey" . }}
{{- with (and $apiKey ($apiKey | fromJson)) }}
- name: vllm-headroom-secrets
  secret:
    secretName: {{ .secretName }}
    # Readable by the sidecar's UID whatever the pod's fsGroup; only the sidecar mounts it.
    defaultMode: 0444
    items:
      - key: {{ .secretKey }}
        path: HEADROOM_BEARER_TOKEN
{{- end }}
{{- end -}}
