{{/*
Names, labels, images and the render-time checks of values that the schema cannot express.
*/}}

{{- define "vllm-headroom.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's base name: <release>-vllm-headroom, or the release alone when it says so. */}}
{{- define "vllm-headroom.fullname" -}}
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

{{/* A name derived from the fullname with a suffix, still within 63 characters. */}}
{{- define "vllm-headroom.suffixed" -}}
{{- $root := index . 0 -}}
{{- $suffix := index . 1 -}}
{{- $base := include "vllm-headroom.fullname" $root | trunc (int (sub 62 (len $suffix))) | trimSuffix "-" -}}
{{- printf "%s-%s" $base $suffix -}}
{{- end -}}

{{- define "vllm-headroom.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "vllm-headroom.labels" -}}
helm.sh/chart: {{ include "vllm-headroom.chart" . }}
app.kubernetes.io/name: {{ include "vllm-headroom.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: vllm-headroom
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of a component's pods: (list $ "vllm") or (list $ "exporter"). */}}
{{- define "vllm-headroom.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "vllm-headroom.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* repository:tag or repository@digest of an image block. */}}
{{- define "vllm-headroom.imageRef" -}}
{{- $image := index . 0 -}}
{{- $defaultTag := index . 1 -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image.repository (default $defaultTag $image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "vllm-headroom.exporterImage" -}}
{{- include "vllm-headroom.imageRef" (list .Values.exporter.image .Chart.AppVersion) -}}
{{- end -}}

{{/* The UID a container runs as: its own runAsUser, else the pod's. */}}
{{- define "vllm-headroom.effectiveUid" -}}
{{- $container := index . 0 | default dict -}}
{{- $pod := index . 1 | default dict -}}
{{- if hasKey $container "runAsUser" -}}{{ $container.runAsUser }}{{- else if hasKey $pod "runAsUser" -}}{{ $pod.runAsUser }}{{- else -}}unset{{- end -}}
{{- end -}}

{{/*
One allowlist entry checked as exporter/service/allowlist.py parses it; renders "" when valid, else why.
Entries: CIDR networks, IP addresses, host names or *.suffix patterns, each with an optional
:PORT ([IPv6]:PORT for IPv6).
*/}}
{{- define "vllm-headroom.allowEntryProblem" -}}
{{- $entry := trim . -}}
{{- $host := $entry -}}
{{- $port := "" -}}
{{- if not $entry -}}
empty entry
{{- else if contains "://" $entry -}}
give a host, IP or CIDR without a scheme
{{- else -}}
{{- if hasPrefix "[" $entry -}}
{{- $host = regexReplaceAll "^\\[([^\\]]*)\\].*$" $entry "${1}" -}}
{{- $rest := regexReplaceAll "^\\[[^\\]]*\\]" $entry "" -}}
{{- if $rest -}}{{- $port = trimPrefix ":" $rest -}}{{- if not (hasPrefix ":" $rest) -}}{{- $port = "bad" -}}{{- end -}}{{- end -}}
{{- else if eq (len (splitList ":" $entry)) 2 -}}
{{- $host = index (splitList ":" $entry) 0 -}}
{{- $port = index (splitList ":" $entry) 1 -}}
{{- end -}}
{{- $ipv4 := "^((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])$" -}}
{{- $ipv6 := "^[0-9A-Fa-f]{0,4}(:[0-9A-Fa-f]{0,4}){2,7}$" -}}
{{- $name := "^(\\*\\.)?[a-z0-9-]+(\\.[a-z0-9-]+)*\\.?$" -}}
{{- if and $port (not (regexMatch "^[0-9]{1,5}$" $port)) -}}
port must be a number from 1 to 65535
{{- else if and $port (or (lt (atoi $port) 1) (gt (atoi $port) 65535)) -}}
port must be a number from 1 to 65535
{{- else if contains "/" $host -}}
{{- $parts := splitList "/" $host -}}
{{- $address := index $parts 0 -}}
{{- $bits := index $parts 1 | default "x" -}}
{{- if or (ne (len $parts) 2) (not (regexMatch "^[0-9]{1,3}$" $bits)) -}}
not a valid CIDR network
{{- else if regexMatch $ipv4 $address -}}
{{- if gt (atoi $bits) 32 -}}not a valid CIDR network{{- end -}}
{{- else if regexMatch $ipv6 $address -}}
{{- if gt (atoi $bits) 128 -}}not a valid CIDR network{{- end -}}
{{- else -}}
not a valid CIDR network
{{- end -}}
{{- else if or (regexMatch $ipv4 $host) (regexMatch $ipv6 $host) -}}
{{- else if not (regexMatch $name (lower $host)) -}}
not a host name, *.suffix pattern, IP address or CIDR network
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Checks run once per render (from every template that renders objects): each failure is one
line naming the value and the fix.
*/}}
{{- define "vllm-headroom.validate" -}}
{{- $v := .Values -}}
{{- if not (has $v.shape (list "vllm" "sidecar" "fleet")) -}}
{{- fail (printf "shape %q is not a shape of this chart: use vllm (vLLM with the sidecar), sidecar (sidecar for another chart's pods) or fleet (one /probe exporter)" (toString $v.shape)) -}}
{{- end -}}
{{- if eq $v.shape "vllm" -}}
{{- if not $v.vllm.model -}}
{{- fail "vllm.model is required with shape=vllm: set it to a Hugging Face id (--set vllm.model=meta-llama/Llama-3.1-8B-Instruct) or a path inside vllm.modelVolume.mountPath" -}}
{{- end -}}
{{- if and (hasPrefix "/" $v.vllm.model) (not (hasPrefix (printf "%s/" (trimSuffix "/" $v.vllm.modelVolume.mountPath)) $v.vllm.model)) -}}
{{- fail (printf "vllm.model %s is a path outside vllm.modelVolume.mountPath (%s): the sidecar reads the model's config.json from that shared volume; put the model there" $v.vllm.model $v.vllm.modelVolume.mountPath) -}}
{{- end -}}
{{- if not (or $v.vllm.image.tag $v.vllm.image.digest) -}}
{{- fail "vllm.image needs a tag or a digest (a pinned vLLM version, e.g. --set vllm.image.tag=v0.32.0)" -}}
{{- end -}}
{{- if and (eq $v.vllm.modelVolume.type "existingClaim") (not $v.vllm.modelVolume.existingClaim) -}}
{{- fail "vllm.modelVolume.type=existingClaim needs vllm.modelVolume.existingClaim: the name of the PVC holding the models" -}}
{{- end -}}
{{- if eq $v.gpu.discovery "process" -}}
{{- $vllmUid := include "vllm-headroom.effectiveUid" (list $v.vllm.securityContext $v.podSecurityContext) -}}
{{- $sidecarUid := include "vllm-headroom.effectiveUid" (list $v.exporter.securityContext $v.podSecurityContext) -}}
{{- if ne $vllmUid $sidecarUid -}}
{{- fail (printf "gpu.discovery=process needs vLLM and the sidecar under one UID (the sidecar reads vLLM's environment), but vLLM runs as %s and the sidecar as %s: align vllm.securityContext/exporter.securityContext runAsUser, or use gpu.discovery=uuids" $vllmUid $sidecarUid) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if eq $v.shape "sidecar" -}}
{{- if not $v.sidecar.podSelector -}}
{{- fail "sidecar.podSelector is required with shape=sidecar: the labels of the vLLM pods you add the sidecar to (the PodMonitor and NetworkPolicy select them)" -}}
{{- end -}}
{{- if $v.serviceMonitor.enabled -}}
{{- fail "serviceMonitor.enabled=true does not fit shape=sidecar: another chart's Service has no port for the sidecar; use podMonitor.enabled=true" -}}
{{- end -}}
{{- end -}}
{{- if and (ne $v.shape "fleet") (eq $v.gpu.discovery "uuids") (not $v.gpu.uuids) -}}
{{- fail "gpu.discovery=uuids needs gpu.uuids: the GPU UUIDs (GPU-... or MIG-...) vLLM uses, as nvidia-smi -L lists them" -}}
{{- end -}}
{{- range $v.gpu.uuids -}}
{{- if not (regexMatch "^(GPU|MIG)-[0-9A-Fa-f-]+$" .) -}}
{{- fail (printf "gpu.uuids entry %q is not a GPU UUID: use the GPU-... or MIG-... form nvidia-smi -L prints" .) -}}
{{- end -}}
{{- end -}}
{{- $interval := $v.exporter.settings.poll_interval_seconds | default 5.0 | float64 -}}
{{- $timeout := $v.exporter.settings.poll_timeout_seconds | default 3.0 | float64 -}}
{{- if gt $timeout $interval -}}
{{- fail (printf "exporter.settings.poll_timeout_seconds (%v) must not exceed poll_interval_seconds (%v): the exporter refuses to start so; lower the timeout or raise the interval" $timeout $interval) -}}
{{- end -}}
{{- if eq $v.shape "fleet" -}}
{{- if not $v.fleet.allowlist -}}
{{- fail "fleet.allowlist is required with shape=fleet: the networks or hosts /probe may reach, e.g. --set 'fleet.allowlist={10.244.0.0/16}' for the pod network (an empty list would refuse every probe)" -}}
{{- end -}}
{{- range $v.fleet.allowlist -}}
{{- $problem := include "vllm-headroom.allowEntryProblem" . -}}
{{- if $problem -}}
{{- fail (printf "fleet.allowlist entry %q: %s (entries: 10.0.0.0/8, 10.1.2.3, vllm.ns.svc, *.ns.svc.cluster.local, any of them with :PORT)" (toString .) $problem) -}}
{{- end -}}
{{- end -}}
{{- if and (ne $v.fleet.discovery.kind "none") (not $v.fleet.discovery.podSelector) -}}
{{- fail (printf "fleet.discovery.podSelector is required with fleet.discovery.kind=%s: the labels of the vLLM pods to probe" $v.fleet.discovery.kind) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A setting value as an environment variable's string: maps and lists as JSON. */}}
{{- define "vllm-headroom.settingValue" -}}
{{- if or (kindIs "map" .) (kindIs "slice" .) -}}
{{- toJson . -}}
{{- else if kindIs "float64" . -}}
{{- if eq . (floor .) -}}{{- printf "%d" (int64 .) -}}{{- else -}}{{- toString . -}}{{- end -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end -}}

{{/* matchLabels as a Kubernetes label selector string: a=1,b=2 (sorted). */}}
{{- define "vllm-headroom.labelSelectorString" -}}
{{- $pairs := list -}}
{{- range $key := keys . | sortAlpha -}}
{{- $pairs = append $pairs (printf "%s=%s" $key (index $ $key | toString)) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}
