{{/*
The vllm-headroom sidecar: one definition for the vllm shape's pod and for the patch that adds the
sidecar to another chart's pods (shape sidecar). Each template takes the chart's root context.

What the sidecar can reach of vLLM (docs/kubernetes.md, "What the sidecar can read of vLLM"):
the pod shares its process namespace, so that the sidecar reads vLLM's command line
(/proc/<pid>/cmdline: --max-num-seqs and the other scheduler flags, parsed by name) and vLLM's
PIDs. The sidecar runs under a UID of its own (65533, not vLLM's 65532 nor root), so the kernel
refuses it vLLM's /proc/<pid>/environ, root, cwd and fd: no HF_TOKEN, no VLLM_API_KEY, no
mounted secret of vLLM's. The chart refuses one UID for both in shape vllm.

GPU visibility (docs/kubernetes.md, "Which GPUs the sidecar watches"; the runbook
VllmHeadroomGpuForeignMemory: never NVIDIA_VISIBLE_DEVICES=all on vLLM nodes):
- gpu.discovery=none (the default): NVIDIA_VISIBLE_DEVICES=void, the runtime injects no GPU and
  no driver library; no NVML figures (GPU memory from exporter.settings.gpu_memory_bytes for
  the sizing model, used memory from dcgm-exporter).
- gpu.discovery=uuids: the sidecar is given and watches exactly gpu.uuids (NVML only).
- gpu.discovery=process: refused (it needed NVIDIA_VISIBLE_DEVICES=all and vLLM's environment).
- gpu.source=dcgm: NVIDIA_VISIBLE_DEVICES=void too; the sidecar reads the node's dcgm-exporter
  (gpu.dcgm.url, NODE_IP from status.hostIP) and picks this pod's GPUs by dcgm-exporter's pod
  mapping: its own name, namespace and node come from the downward API (no RBAC, no secret).
*/}}

{{/* The GPU discovery in effect: gpu.discovery, none when empty. */}}
{{- define "vllm-headroom.gpuDiscovery" -}}
{{- .Values.gpu.discovery | default "none" -}}
{{- end -}}

{{/* The GPU source in effect: gpu.source, else nvml with discovery=uuids and none otherwise. */}}
{{- define "vllm-headroom.gpuSource" -}}
{{- if .Values.gpu.source -}}
{{- .Values.gpu.source -}}
{{- else if eq (include "vllm-headroom.gpuDiscovery" .) "uuids" -}}
nvml
{{- else -}}
none
{{- end -}}
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
{{- $source := include "vllm-headroom.gpuSource" . }}
{{- if eq $source "dcgm" }}
- name: HEADROOM_GPU_SOURCE
  value: dcgm
# Kubernetes expands $(NODE_IP) in the URL: defined first.
- name: NODE_IP
  valueFrom:
    fieldRef:
      fieldPath: status.hostIP
- name: HEADROOM_DCGM_URL
  value: {{ .Values.gpu.dcgm.url | quote }}
- name: HEADROOM_POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: HEADROOM_POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: HEADROOM_NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
{{- if eq $discovery "uuids" }}
- name: HEADROOM_GPU_DISCOVERY
  value: settings
- name: HEADROOM_GPUS
  value: {{ join "," .Values.gpu.uuids | quote }}
{{- else }}
- name: HEADROOM_GPU_DISCOVERY
  value: none
{{- end }}
- name: NVIDIA_VISIBLE_DEVICES
  value: void
{{- else if eq .Values.gpu.source "none" }}
- name: HEADROOM_GPU_SOURCE
  value: none
- name: HEADROOM_GPU_DISCOVERY
  value: none
- name: NVIDIA_VISIBLE_DEVICES
  value: void
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
- name: HEADROOM_MODEL_ROOTS
  value: {{ .Values.vllm.modelVolume.mountPath | quote }}
{{- else }}
{{- if .Values.sidecar.modelVolume.name }}
{{- /* vLLM's /v1/models root is read only inside the mounted model volume. */}}
- name: HEADROOM_MODEL_ROOTS
  value: {{ .Values.sidecar.modelVolume.mountPath | quote }}
{{- end }}
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
  # A start-up error (a bad setting) waits, answering 503 with it, instead of exiting: a
  # container that exits backs off, and vLLM's whole pod is unready meanwhile.
  args: [serve, --on-start-error=wait]
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
