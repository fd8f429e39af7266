{{/*
Names, labels, images and the render-time checks of values that the schema cannot express.
*/}}

{{- define "vllm-headroom.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's base name: <release>-vllm-headroom, or the release alone when it says so. */}}
{{/*
The objects' base name. Helm takes release names with dots ("llama3.1"), which Service names
may not hold: they become dashes. What is left must be a DNS-1035 label (a Service's name), or
the render fails naming the fix, rather than the API server refusing the install half-way.
*/}}
{{- define "vllm-headroom.fullname" -}}
{{- $full := "" -}}
{{- if .Values.fullnameOverride -}}
{{- $full = .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- $release := .Release.Name | replace "." "-" -}}
{{- if contains $name $release -}}
{{- $full = $release | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $full = printf "%s-%s" $release $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $full) -}}
{{- fail (printf "the objects' name %q is not a DNS-1035 label (lowercase letters, digits and '-', starting with a letter), as a Service's name must be: install under a release name that starts with a letter, or set fullnameOverride" $full) -}}
{{- end -}}
{{- $full -}}
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

{{/*
Labels of a pod template: (list $ "vllm") or (list $ "exporter"). Only what stays the same across
chart versions (no helm.sh/chart, no app.kubernetes.io/version): a chart upgrade that changes
nothing in the pod must not restart vLLM and reload its model.
*/}}
{{- define "vllm-headroom.podLabels" -}}
{{- $root := index . 0 -}}
{{ include "vllm-headroom.selectorLabels" . }}
app.kubernetes.io/part-of: vllm-headroom
{{- with $root.Values.commonLabels }}
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

{{/*
The port vLLM listens on in its pod: vllm.port (shape vllm), else the port of sidecar.target,
the URL the sidecar polls vLLM at from inside the pod (its scheme's default when it names none).
*/}}
{{- define "vllm-headroom.vllmPort" -}}
{{- if eq .Values.shape "vllm" -}}
{{- .Values.vllm.port | int -}}
{{- else -}}
{{- $url := urlParse (toString .Values.sidecar.target) -}}
{{- $port := regexFind ":[0-9]+$" $url.host | trimPrefix ":" -}}
{{- if not (and (has $url.scheme (list "http" "https")) $url.hostname) -}}
{{- fail (printf "sidecar.target %q is not an http(s) URL: give vLLM's URL from inside the pod, e.g. http://127.0.0.1:8000" (toString .Values.sidecar.target)) -}}
{{- else if not $port -}}
{{- ternary 443 80 (eq $url.scheme "https") -}}
{{- else -}}
{{- $port | int -}}
{{- end -}}
{{- end -}}
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
{{- $strategy := $v.vllm.strategy -}}
{{- if not (has $strategy.type (list "RollingUpdate" "Recreate")) -}}
{{- fail (printf "vllm.strategy.type %q is not a Deployment strategy: use RollingUpdate or Recreate" (toString $strategy.type)) -}}
{{- end -}}
{{- if and (eq $strategy.type "RollingUpdate") $strategy.rollingUpdate -}}
{{- $surge := $strategy.rollingUpdate.maxSurge | default 0 | toString -}}
{{- $unavailable := $strategy.rollingUpdate.maxUnavailable | default 0 | toString -}}
{{- if and (has $surge (list "0" "0%")) (has $unavailable (list "0" "0%")) -}}
{{- fail "vllm.strategy.rollingUpdate: maxSurge and maxUnavailable are both 0, so a rollout could never replace a pod: set maxUnavailable: 1 (no extra GPU needed) or maxSurge: 1 (needs a spare GPU)" -}}
{{- end -}}
{{- end -}}
{{- $autoscaled := ne $v.autoscaling.kind "none" -}}
{{- $fewest := ternary (max 1 (int $v.autoscaling.minReplicas)) (int $v.vllm.replicas) $autoscaled -}}
{{- $fewestFrom := ternary "autoscaling.minReplicas" "vllm.replicas" $autoscaled -}}
{{- $pdb := $v.vllm.podDisruptionBudget -}}
{{- if $pdb.enabled -}}
{{- $min := include "vllm-headroom.isSet" $pdb.minAvailable -}}
{{- $max := include "vllm-headroom.isSet" $pdb.maxUnavailable -}}
{{- if and $min $max -}}
{{- fail "vllm.podDisruptionBudget: set either minAvailable or maxUnavailable, not both (set the other to null)" -}}
{{- else if not (or $min $max) -}}
{{- fail "vllm.podDisruptionBudget.enabled=true needs maxUnavailable (e.g. 1) or minAvailable" -}}
{{- end -}}
{{- $blocks := false -}}
{{- if $max -}}
{{- $blocks = has (toString $pdb.maxUnavailable) (list "0" "0%") -}}
{{- else if hasSuffix "%" (toString $pdb.minAvailable) -}}
{{- $blocks = eq (toString $pdb.minAvailable) "100%" -}}
{{- else -}}
{{- $blocks = ge (int $pdb.minAvailable) (int $fewest) -}}
{{- end -}}
{{- if $blocks -}}
{{- fail (printf "vllm.podDisruptionBudget would allow no eviction at all with %d replica(s), and every node drain would hang: use maxUnavailable: 1 (or a minAvailable below %s)" (int $fewest) $fewestFrom) -}}
{{- end -}}
{{- end -}}
{{- $vllmUid := include "vllm-headroom.effectiveUid" (list $v.vllm.securityContext $v.podSecurityContext) -}}
{{- $sidecarUid := include "vllm-headroom.effectiveUid" (list $v.exporter.securityContext $v.podSecurityContext) -}}
{{- if or (eq $vllmUid $sidecarUid) (eq $sidecarUid "0") -}}
{{- fail (printf "exporter.securityContext.runAsUser (%s) must be a non-root UID other than vLLM's (%s): in the shared process namespace one UID would let the sidecar read vLLM's environment (HF_TOKEN, VLLM_API_KEY) in /proc/<pid>/environ; keep the default 65533" $sidecarUid $vllmUid) -}}
{{- end -}}
{{- end -}}
{{- $a := $v.autoscaling -}}
{{- if ne $a.kind "none" -}}
{{- if eq $v.shape "fleet" -}}
{{- fail (printf "autoscaling.kind=%s does not fit shape=fleet: it scales the vLLM workload whose pods carry the sidecar (shape vllm, or shape sidecar with sidecar.workload)" $a.kind) -}}
{{- end -}}
{{- if and (eq $v.shape "sidecar") (not $v.sidecar.workload.name) -}}
{{- fail (printf "autoscaling.kind=%s with shape=sidecar needs sidecar.workload.name: the Deployment (or LeaderWorkerSet) the deployer scales, e.g. llama3-predictor for KServe's InferenceService llama3 (docs/kubernetes.md, \"Recipes\")" $a.kind) -}}
{{- end -}}
{{- if and (eq $v.shape "sidecar") (ne (include "vllm-headroom.workloadApiVersion" $v.sidecar.workload.kind) $v.sidecar.workload.apiVersion) -}}
{{- fail (printf "sidecar.workload: kind %s has apiVersion %s, not %s" $v.sidecar.workload.kind (include "vllm-headroom.workloadApiVersion" $v.sidecar.workload.kind) $v.sidecar.workload.apiVersion) -}}
{{- end -}}
{{- if lt (int $a.maxReplicas) (max 1 (int $a.minReplicas)) -}}
{{- fail (printf "autoscaling.maxReplicas (%d) is below autoscaling.minReplicas (%d): raise maxReplicas" (int $a.maxReplicas) (int $a.minReplicas)) -}}
{{- end -}}
{{- if eq (int $a.minReplicas) 0 -}}
{{- if ne $a.kind "keda" -}}
{{- fail "autoscaling.minReplicas=0 needs autoscaling.kind=keda: a HorizontalPodAutoscaler keeps at least 1 replica (its scale to zero is behind the alpha HPAScaleToZero gate)" -}}
{{- end -}}
{{- if not $a.keda.wakeTriggers -}}
{{- fail "autoscaling.minReplicas=0 needs autoscaling.keda.wakeTriggers: with no vLLM running there is no headroom to read, so a trigger that sees requests arrive (a gateway's queue, a cron) must wake the model" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if eq $v.shape "sidecar" -}}
{{- $pdb := $v.sidecar.podDisruptionBudget -}}
{{- if $pdb.enabled -}}
{{- $fewest := ternary (max 1 (int $v.autoscaling.minReplicas)) 1 (ne $v.autoscaling.kind "none") -}}
{{- $problem := include "vllm-headroom.pdbProblem" (list $pdb $fewest) -}}
{{- if $problem -}}
{{- fail (printf "sidecar.podDisruptionBudget: %s" $problem) -}}
{{- end -}}
{{- end -}}
{{- if not $v.sidecar.podSelector -}}
{{- fail "sidecar.podSelector is required with shape=sidecar: the labels of the vLLM pods you add the sidecar to (the PodMonitor and NetworkPolicy select them)" -}}
{{- end -}}
{{- $_ := include "vllm-headroom.vllmPort" $ -}}
{{- if $v.serviceMonitor.enabled -}}
{{- fail "serviceMonitor.enabled=true does not fit shape=sidecar: another chart's Service has no port for the sidecar; use podMonitor.enabled=true" -}}
{{- end -}}
{{- end -}}
{{- if eq $v.gpu.discovery "process" -}}
{{- fail "gpu.discovery=process is no longer offered: it gave the sidecar NVML on every GPU of the node (NVIDIA_VISIBLE_DEVICES=all, which runbook VllmHeadroomGpuForeignMemory forbids on vLLM nodes) and vLLM's environment; use gpu.discovery=none (the default; GPU memory from dcgm-exporter, exporter.settings.gpu_memory_bytes for sizing) or gpu.discovery=uuids with vLLM's GPU UUIDs (docs/kubernetes.md, \"Which GPUs the sidecar watches\")" -}}
{{- end -}}
{{- if and (ne $v.shape "fleet") (eq (include "vllm-headroom.gpuDiscovery" $) "uuids") (not $v.gpu.uuids) -}}
{{- fail "gpu.discovery=uuids needs gpu.uuids: the GPU UUIDs (GPU-... or MIG-...) vLLM uses, as nvidia-smi -L lists them" -}}
{{- end -}}
{{- if and (eq $v.shape "fleet") (eq $v.gpu.source "dcgm") -}}
{{- if not (contains "$(NODE_IP)" $v.gpu.dcgm.url) -}}
{{- fail "gpu.dcgm.url must hold $(NODE_IP) with shape=fleet and gpu.source=dcgm: each target's dcgm-exporter is the one on its own node, at the pod's host IP (a Service with internalTrafficPolicy Local would route to the fleet exporter's node)" -}}
{{- end -}}
{{- if $v.gpu.uuids -}}
{{- fail "gpu.uuids does not fit shape=fleet: each target's GPUs are those dcgm-exporter's pod mapping gives its pod; unset gpu.uuids" -}}
{{- end -}}
{{- end -}}
{{- if and (ne $v.shape "fleet") (eq $v.gpu.source "nvml") (ne (include "vllm-headroom.gpuDiscovery" $) "uuids") -}}
{{- fail "gpu.source=nvml needs gpu.discovery=uuids and gpu.uuids: the chart gives the sidecar only the GPUs it lists (never every GPU of the node); or use gpu.source=dcgm" -}}
{{- end -}}
{{- if eq $v.gpu.source "dcgm" -}}
{{- range $v.gpu.uuids -}}
{{- if hasPrefix "MIG-" . -}}
{{- fail (printf "gpu.uuids entry %q: dcgm-exporter names MIG instances by their GPU's UUID and GPU_I_ID, never by MIG UUID; list GPU-... UUIDs with gpu.source=dcgm, or rely on its pod mapping" .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $v.gpu.uuids -}}
{{- if not (regexMatch "^(GPU|MIG)-[0-9A-Fa-f-]+$" .) -}}
{{- fail (printf "gpu.uuids entry %q is not a GPU UUID: use the GPU-... or MIG-... form nvidia-smi -L prints" .) -}}
{{- end -}}
{{- end -}}
{{- $memory := include "vllm-headroom.quantityBytes" $v.exporter.resources.limits.memory -}}
{{- if and $memory (lt (int64 $memory) 33554432) -}}
{{- fail (printf "exporter.resources.limits.memory (%s) is under 32Mi: the exporter reads its limit and refuses to start with less; give it 32Mi or more (256Mi by default)" (include "vllm-headroom.settingValue" $v.exporter.resources.limits.memory)) -}}
{{- end -}}
{{- /* The schema bounds these as numbers only; --set gives 0.5 as the text "0.5". */ -}}
{{- $textBounds := dict
  "poll_interval_seconds" (list 0.05 86400.0)
  "poll_timeout_seconds" (list 0.01 86400.0)
  "context_window_seconds" (list 0.1 86400.0)
  "context_max_window_seconds" (list 0.1 86400.0)
  "rate_window_seconds" (list 0.1 86400.0)
  "context_refresh_seconds" (list 0.0 86400.0)
  "probe_target_ttl_seconds" (list 0.1 86400.0)
-}}
{{- range $name, $bounds := $textBounds -}}
{{- $given := index $v.exporter.settings $name -}}
{{- if kindIs "string" $given -}}
{{- if or (lt (float64 $given) (index $bounds 0)) (gt (float64 $given) (index $bounds 1)) -}}
{{- fail (printf "exporter.settings.%s (%s) is not from %v to %v seconds: the exporter refuses to start so" $name $given (index $bounds 0) (index $bounds 1)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $interval := $v.exporter.settings.poll_interval_seconds | default 5.0 | float64 -}}
{{- $timeout := $v.exporter.settings.poll_timeout_seconds | default 3.0 | float64 -}}
{{- if gt $timeout $interval -}}
{{- fail (printf "exporter.settings.poll_timeout_seconds (%v) must not exceed poll_interval_seconds (%v): the exporter refuses to start so; lower the timeout or raise the interval" $timeout $interval) -}}
{{- end -}}
{{- if hasKey $v.exporter.settings "context_max_window_seconds" -}}
{{- $window := $v.exporter.settings.context_window_seconds | default 600.0 | float64 -}}
{{- $longest := $v.exporter.settings.context_max_window_seconds | float64 -}}
{{- if lt $longest $window -}}
{{- fail (printf "exporter.settings.context_max_window_seconds (%v) must not be shorter than context_window_seconds (%v): the exporter refuses to start so; raise it, or set context_min_requests to 0 to keep the window fixed" $longest $window) -}}
{{- end -}}
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
{{- $np := $v.networkPolicy -}}
{{- if $np.enabled -}}
{{- if and (eq $v.shape "sidecar") (not (kindIs "slice" $np.extraIngress)) -}}
{{- fail "networkPolicy.enabled=true with shape=sidecar needs networkPolicy.extraIngress: the chart admits vLLM's port (sidecar.target's) and cannot know what else the owner's pods serve (a proxy, KV transfer peers; helm/examples/ has each deployer's); set it to their ingress rules, or [] when vLLM's port is all" -}}
{{- end -}}
{{- range $i, $rule := $np.extraIngress -}}
{{- $opensExporter := not $rule.ports -}}
{{- range $rule.ports -}}
{{- if or (not .port) (eq (toString .port) (toString $v.exporter.port)) (eq (toString .port) "headroom") (and .endPort (le (int .port) (int $v.exporter.port)) (ge (int .endPort) (int $v.exporter.port))) -}}
{{- $opensExporter = true -}}
{{- end -}}
{{- end -}}
{{- if and $opensExporter (not $rule.from) (not $np.vllmFrom) -}}
{{- fail (printf "networkPolicy.extraIngress[%d] admits everyone to every port or to the exporter's (%v), which the policy exists to restrict: give it ports without %v, or from (the peers that use it)" $i $v.exporter.port $v.exporter.port) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $monitored := list -}}
{{- if $v.podMonitor.enabled -}}{{- $monitored = append $monitored (list "podMonitor" "PodMonitor" $v.podMonitor.labels) -}}{{- end -}}
{{- if $v.serviceMonitor.enabled -}}{{- $monitored = append $monitored (list "serviceMonitor" "ServiceMonitor" $v.serviceMonitor.labels) -}}{{- end -}}
{{- if $v.prometheusRule.enabled -}}{{- $monitored = append $monitored (list "prometheusRule" "PrometheusRule" $v.prometheusRule.labels) -}}{{- end -}}
{{- if and (ne $v.shape "fleet") (eq $v.autoscaling.kind "hpa") -}}{{- $monitored = append $monitored (list "prometheusRule" "PrometheusRule of autoscaling.kind=hpa (the replicas the HPA reads)" $v.prometheusRule.labels) -}}{{- end -}}
{{- if and (eq $v.shape "fleet") (ne $v.fleet.discovery.kind "none") -}}{{- $monitored = append $monitored (list "fleet.discovery" $v.fleet.discovery.kind $v.fleet.discovery.labels) -}}{{- end -}}
{{- range $monitored -}}
{{- if not (index . 2) -}}
{{- fail (printf "%s.labels is empty, so a Prometheus that selects by label never loads the %s: set %s.labels.release=<your kube-prometheus-stack's Helm release name> (what a default kube-prometheus-stack selects), or the labels your Prometheus selects" (index . 0) (index . 1) (index . 0)) -}}
{{- end -}}
{{- end -}}
{{- if and $v.podMonitor.enabled $v.serviceMonitor.enabled -}}
{{- fail "podMonitor.enabled and serviceMonitor.enabled are both true: Prometheus would scrape every target twice and the alerts would see every series twice; keep one" -}}
{{- end -}}
{{- if and $v.vllmMetrics.enabled $v.vllmMetrics.job -}}
{{- fail (printf "vllmMetrics.job=%s names another scrape of vLLM's /metrics, but vllmMetrics.enabled=true scrapes it as well (every series twice): set vllmMetrics.enabled=false" $v.vllmMetrics.job) -}}
{{- end -}}
{{- $scoped := and $v.prometheusRule.enabled (eq ($v.prometheusRule.scope | default "release") "release") (not $v.prometheusRule.selector) -}}
{{- if and $scoped (not $v.vllmMetrics.enabled) (not $v.vllmMetrics.job) -}}
{{- fail "vllmMetrics.enabled=false needs vllmMetrics.job: the preemption, KV and SLO alerts read vLLM's /metrics, and this release's rules read only its own jobs; name the job label of the scrape that reads vLLM (or set prometheusRule.selector)" -}}
{{- end -}}
{{- end -}}

{{/*
checkov's skip annotations for the findings the chart keeps on purpose: (list $ "vllm"),
(list $ "exporter") or (list $ "test"). Each names the value that removes the finding, and is
rendered only while the finding holds. docs/kubernetes.md ("Policy scanners") lists them, and
tests/test_checkov.py fails on any finding without one.
*/}}
{{- define "vllm-headroom.checkovSkips" -}}
{{- $root := index . 0 -}}
{{- $what := index . 1 -}}
{{- $v := $root.Values -}}
{{- $skips := list -}}
{{- $images := list $v.exporter.image -}}
{{- if eq $what "vllm" -}}{{- $images = append $images $v.vllm.image -}}{{- end -}}
{{- $undigested := list -}}
{{- $pulling := list -}}
{{- range $images -}}
{{- if not .digest -}}{{- $undigested = append $undigested . -}}{{- end -}}
{{- if ne .pullPolicy "Always" -}}{{- $pulling = append $pulling . -}}{{- end -}}
{{- end -}}
{{- if $undigested -}}
{{- $skips = append $skips "CKV_K8S_43=an image is pinned by tag, not digest: set exporter.image.digest (and vllm.image.digest) to the digest you pushed and signed" -}}
{{- end -}}
{{- if $pulling -}}
{{- $skips = append $skips "CKV_K8S_15=imagePullPolicy IfNotPresent: a pinned image does not change, and pulling it at every restart of a GPU pod adds a registry outage to the pod's failures; set the pullPolicy values to Always if your policy requires it" -}}
{{- end -}}
{{- if eq $what "vllm" -}}
{{- $skips = append $skips "CKV_K8S_9=vLLM has its readiness probe; the vllm-headroom sidecar has none on purpose, so that it never takes vLLM out of its Service" -}}
{{- if not (and $v.vllm.resources.limits $v.vllm.resources.limits.cpu) -}}
{{- $skips = append $skips "CKV_K8S_11=vLLM requests its CPUs and has no CPU limit, since CFS throttling stalls its engine loop; the sidecar has one; set vllm.resources.limits.cpu to cap vLLM" -}}
{{- end -}}
{{- if or $v.vllm.hfToken.secretName $v.vllm.apiKey.secretName -}}
{{- $skips = append $skips "CKV_K8S_35=vLLM reads HF_TOKEN and VLLM_API_KEY from its environment only; the sidecar reads its token from a file" -}}
{{- end -}}
{{- end -}}
{{- if and (ne $what "test") (not $v.networkPolicy.enabled) -}}
{{- $skips = append $skips "CKV2_K8S_6=the chart's NetworkPolicy is opt-in (networkPolicy.enabled), since it must fit your cluster's own policies" -}}
{{- end -}}
{{- if eq $what "test" -}}
{{- $skips = append $skips "CKV_K8S_8=a one-shot helm test pod: it checks the exporter for a few seconds and exits" -}}
{{- $skips = append $skips "CKV_K8S_9=a one-shot helm test pod: it checks the exporter for a few seconds and exits" -}}
{{- $skips = append $skips "CKV2_K8S_6=a one-shot helm test pod that accepts no connection; it only connects to the exporter" -}}
{{- end -}}
{{- range $i, $skip := $skips }}
checkov.io/skip{{ add1 $i }}: {{ $skip | quote }}
{{- end -}}
{{- end -}}

{{/*
Why a PodDisruptionBudget (list $pdb $fewestReplicas) is refused, or "" when it is fine: shape
sidecar's check (the chart does not know the deployer's replicas: 1 unless autoscaled).
*/}}
{{- define "vllm-headroom.pdbProblem" -}}
{{- $pdb := index . 0 -}}
{{- $fewest := index . 1 -}}
{{- $min := include "vllm-headroom.isSet" $pdb.minAvailable -}}
{{- $max := include "vllm-headroom.isSet" $pdb.maxUnavailable -}}
{{- if and $min $max -}}
set either minAvailable or maxUnavailable, not both (set the other to null)
{{- else if not (or $min $max) -}}
enabled=true needs maxUnavailable (e.g. 1) or minAvailable
{{- else if $max -}}
{{- if has (toString $pdb.maxUnavailable) (list "0" "0%") -}}
maxUnavailable 0 would allow no eviction at all, and every node drain would hang: use maxUnavailable: 1
{{- end -}}
{{- else if hasSuffix "%" (toString $pdb.minAvailable) -}}
{{- if eq (toString $pdb.minAvailable) "100%" -}}
minAvailable 100% would allow no eviction at all, and every node drain would hang: use maxUnavailable: 1
{{- end -}}
{{- else if ge (int $pdb.minAvailable) (int $fewest) -}}
minAvailable {{ $pdb.minAvailable }} would allow no eviction with {{ $fewest }} replica(s), and every node drain would hang: use maxUnavailable: 1
{{- end -}}
{{- end -}}

{{/* The apiVersion of a workload kind autoscaling may target. */}}
{{- define "vllm-headroom.workloadApiVersion" -}}
{{- ternary "leaderworkerset.x-k8s.io/v1" "apps/v1" (eq . "LeaderWorkerSet") -}}
{{- end -}}

{{/*
The workload autoscaling scales, as JSON: apiVersion, kind, name, and pods (a PromQL regex of its
pods' names). Shape vllm: the chart's Deployment; shape sidecar: sidecar.workload.
*/}}
{{- define "vllm-headroom.autoscaling.workload" -}}
{{- $w := dict "apiVersion" "apps/v1" "kind" "Deployment" "name" (include "vllm-headroom.fullname" .) -}}
{{- if eq .Values.shape "sidecar" -}}
{{- $w = pick .Values.sidecar.workload "apiVersion" "kind" "name" -}}
{{- end -}}
{{- /* A Deployment's pod is <name>-<template hash>-<5 random>, but Kubernetes cuts the part before
the random one at 58 characters: a long name loses the hash's end and its dash, or more. */ -}}
{{- $base := printf "%s-" $w.name -}}
{{- $pods := printf "%s[a-z0-9]{1,10}-?[a-z0-9]{5}" $base -}}
{{- if ge (len $base) 58 -}}
{{- $pods = printf "%s[a-z0-9]{5}" (trunc 58 $base) -}}
{{- end -}}
{{- if eq $w.kind "StatefulSet" -}}
{{- $pods = printf "%s-[0-9]+" $w.name -}}
{{- else if eq $w.kind "LeaderWorkerSet" -}}
{{- $pods = printf "%s-[0-9]+(-[0-9]+)?" $w.name -}}
{{- end -}}
{{- toJson (merge (dict "pods" $pods) $w) -}}
{{- end -}}

{{/* "true" when a value is given: not null and not the empty string. */}}
{{- define "vllm-headroom.isSet" -}}
{{- if and (not (kindIs "invalid" .)) (ne (toString .) "") -}}true{{- end -}}
{{- end -}}

{{/* A setting value as an environment variable's string: maps and lists as JSON. */}}
{{/*
A Kubernetes memory quantity in bytes (256Mi, 0.5Gi, 32M, 268435456), or "" for a form this does
not read (an exponent, milli-bytes): those are left to the API server.
*/}}
{{- define "vllm-headroom.quantityBytes" -}}
{{- $text := include "vllm-headroom.settingValue" . -}}
{{- $units := dict "" 1.0 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 -}}
{{- $form := "^([0-9]+(\\.[0-9]+)?)([A-Za-z]*)$" -}}
{{- if regexMatch $form $text -}}
{{- $unit := regexReplaceAll $form $text "${3}" -}}
{{- if hasKey $units $unit -}}
{{- mulf (float64 (regexReplaceAll $form $text "${1}")) (index $units $unit) | floor | int64 -}}
{{- end -}}
{{- end -}}
{{- end -}}

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

{{/*
The replicas the model needs, in PromQL: (list $ gated). Over every pod of the release's vLLM
Deployment (<fullname>-<template hash>-<suffix>, the pod label the chart's monitors add):
  demand      = sum(p95 ceiling - p95 available) + sum(requests waiting)   (p95 sequences)
  per replica = sum(p95 ceiling) / replicas reporting one                  (0: no answer)
  needed      = max((demand + reserveSequences) / per replica,
                    demand / per replica / (1 - reserveRatio))
so that a target of 1 per replica keeps at least reserveSequences, and reserveRatio of the
ceiling, free. Gated (scale to zero): 0 while nothing runs or waits. Empty while no replica
reports a ceiling: the autoscaler then holds its replicas. docs/kubernetes.md, "Autoscaling on
headroom"; tests/test_autoscaling.py evaluates it with promtool.
*/}}
{{- define "vllm-headroom.autoscaling.replicasNeeded" -}}
{{- $root := index . 0 -}}
{{- $gated := index . 1 -}}
{{- $a := $root.Values.autoscaling -}}
{{- $pods := (include "vllm-headroom.autoscaling.workload" $root | fromJson).pods -}}
{{- $sel := printf "{namespace=%q,pod=~%q}" $root.Release.Namespace $pods -}}
{{- $sum := "sum by (namespace, model_name)" -}}
{{- $ceiling := printf "%s (headroom_p95_ceiling_sequences%s)" $sum $sel -}}
{{- $replicas := printf "count by (namespace, model_name) (count by (namespace, model_name, instance) (headroom_p95_ceiling_sequences%s))" $sel -}}
{{- $perReplica := printf "((%s > 0) / %s)" $ceiling $replicas -}}
{{- $demand := printf "(%s - %s (headroom_p95_available_sequences%s) + %s (headroom_requests_waiting%s))" $ceiling $sum $sel $sum $sel -}}
{{- $bySequences := printf "(%s + %v) / %s" $demand $a.reserveSequences $perReplica -}}
{{- $byRatio := printf "%s / %s / (1 - %v)" $demand $perReplica $a.reserveRatio -}}
{{- $needed := printf "((%s >= %s) or %s)" $bySequences $byRatio $byRatio -}}
{{- if $gated -}}
{{- printf "%s * (%s > bool 0)" $needed $demand -}}
{{- else -}}
{{- $needed -}}
{{- end -}}
{{- end -}}

{{/*
prometheus-adapter's external rule serving headroom_model_replicas_needed from the recording rule
of autoscaling.yaml (field names of its pkg/config: DiscoveryRule). The same for every release:
the HPA selects its Deployment by headroom_deployment, the adapter adds the HPA's namespace.
*/}}
{{- define "vllm-headroom.autoscaling.adapterRule" -}}
seriesQuery: 'headroom:model_replicas_needed:p95_reserve{namespace!="",headroom_deployment!=""}'
resources:
  overrides:
    namespace:
      resource: namespace
name:
  matches: ^headroom:model_replicas_needed:p95_reserve$
  as: headroom_model_replicas_needed
metricsQuery: max by (namespace, headroom_deployment) (<<.Series>>{<<.LabelMatchers>>})
{{- end -}}
