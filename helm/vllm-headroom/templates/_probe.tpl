{{/*
The probe Job (probe-job.yaml, probe-pvc.yaml): `vllm-headroom probe` against the release's own
vLLM Service, off by default (docs/probe.md, "In Kubernetes"). tests/test_helm_probe.py parses the
rendered arguments with the CLI's own parser.
*/}}

{{/* The vLLM Service's URL, as the probe reaches it. */}}
{{- define "vllm-headroom.probe.target" -}}
{{- printf "http://%s.%s.svc:%d" (include "vllm-headroom.fullname" .) .Release.Namespace (int .Values.vllm.service.port) -}}
{{- end -}}

{{/* --max-num-seqs as vllm.args gives it ("--max-num-seqs N" or "--max-num-seqs=N"); "" if not. */}}
{{- define "vllm-headroom.probe.argsMaxNumSeqs" -}}
{{- $next := false -}}
{{- $found := "" -}}
{{- range .Values.vllm.args -}}
{{- $arg := toString . -}}
{{- if $next -}}{{- $found = $arg -}}{{- $next = false -}}{{- end -}}
{{- if eq $arg "--max-num-seqs" -}}{{- $next = true -}}{{- end -}}
{{- if hasPrefix "--max-num-seqs=" $arg -}}{{- $found = trimPrefix "--max-num-seqs=" $arg -}}{{- end -}}
{{- end -}}
{{- $found -}}
{{- end -}}

{{/* Seconds the Job may run: the wait for vLLM, the shape's window, the sweep, its drain, a margin. */}}
{{- define "vllm-headroom.probe.deadline" -}}
{{- $p := .Values.probe -}}
{{- if include "vllm-headroom.isSet" $p.activeDeadlineSeconds -}}
{{- int64 $p.activeDeadlineSeconds -}}
{{- else -}}
{{- $sum := addf $p.waitForVllmSeconds $p.shape.windowSeconds $p.maxDurationSeconds $p.drainSeconds 300 -}}
{{- int64 (ceil $sum) -}}
{{- end -}}
{{- end -}}

{{/*
The probe's arguments, as a JSON list: `vllm-headroom <these>`. $(POD_NAME) is the pod's name,
which Kubernetes substitutes (the report's file name).
*/}}
{{- define "vllm-headroom.probe.args" -}}
{{- $p := .Values.probe -}}
{{- $args := list "probe" "--target" (include "vllm-headroom.probe.target" .) "--client" "builtin" -}}
{{- if $p.sendLoadWhileServing -}}{{- $args = append $args "--i-know-this-sends-load" -}}{{- end -}}
{{- $args = concat $args (list "--mode" $p.mode) -}}
{{- if $p.levels -}}
{{- $levels := list -}}
{{- range $p.levels -}}{{- $levels = append $levels (include "vllm-headroom.settingValue" .) -}}{{- end -}}
{{- $args = concat $args (list "--levels" (join "," $levels)) -}}
{{- end -}}
{{- $numbers := list
  (list "--step-seconds" $p.stepSeconds)
  (list "--settle-seconds" $p.settleSeconds)
  (list "--past-knee" $p.pastKnee)
  (list "--max-duration" $p.maxDurationSeconds)
  (list "--max-requests" $p.maxRequests)
  (list "--drain-seconds" $p.drainSeconds)
  (list "--baseline-requests" $p.baselineRequests)
  (list "--seed" $p.seed)
  (list "--prompt-tokens" $p.shape.promptTokens)
  (list "--output-tokens" $p.shape.outputTokens)
  (list "--shape-samples" $p.shape.samples)
  (list "--max-preemptions-per-request" $p.limits.maxPreemptionsPerRequest)
  (list "--max-waiting" $p.limits.maxWaiting)
  (list "--ttft-p95" $p.limits.ttftP95Seconds)
  (list "--tpot-p95" $p.limits.tpotP95Seconds)
  (list "--stop-preemptions" $p.limits.stopPreemptions)
  (list "--stop-waiting" $p.limits.stopWaiting)
-}}
{{- range $numbers -}}
{{- if include "vllm-headroom.isSet" (index . 1) -}}
{{- $args = concat $args (list (index . 0) (include "vllm-headroom.settingValue" (index . 1))) -}}
{{- end -}}
{{- end -}}
{{- with $p.shape.from -}}{{- $args = concat $args (list "--shape-from" .) -}}{{- end -}}
{{- if and $p.shape.windowSeconds (not (include "vllm-headroom.isSet" $p.shape.promptTokens)) -}}
{{- $args = concat $args (list "--shape-window" (include "vllm-headroom.settingValue" $p.shape.windowSeconds)) -}}
{{- end -}}
{{- $maxNumSeqs := include "vllm-headroom.probe.argsMaxNumSeqs" . -}}
{{- if include "vllm-headroom.isSet" $p.maxNumSeqs -}}{{- $maxNumSeqs = include "vllm-headroom.settingValue" $p.maxNumSeqs -}}{{- end -}}
{{- with $maxNumSeqs -}}{{- $args = concat $args (list "--max-num-seqs" .) -}}{{- end -}}
{{- with $p.model -}}{{- $args = concat $args (list "--model" .) -}}{{- end -}}
{{- $args = append $args "--json" -}}
{{- if ne $p.report.format "json" -}}
{{- $args = concat $args (list "--report" (printf "%s/$(POD_NAME).%s" $p.report.mountPath $p.report.format)) -}}
{{- end -}}
{{- toJson $args -}}
{{- end -}}

{{/* The claim holding the reports: an existing one, the chart's, or "" (an emptyDir). */}}
{{- define "vllm-headroom.probe.claim" -}}
{{- $persistence := .Values.probe.report.persistence -}}
{{- if $persistence.enabled -}}
{{- default (include "vllm-headroom.suffixed" (list . "probe-reports")) $persistence.existingClaim -}}
{{- end -}}
{{- end -}}

{{/*
checkov's skips of the probe Job (docs/kubernetes.md, "Policy scanners"), each rendered only
while its finding holds, as vllm-headroom.checkovSkips does for the other workloads.
*/}}
{{- define "vllm-headroom.probe.checkovSkips" -}}
{{- $image := .Values.probe.image | default dict -}}
{{- if not $image.repository -}}{{- $image = .Values.exporter.image -}}{{- end -}}
{{- $skips := list -}}
{{- if not $image.digest -}}
{{- $skips = append $skips "CKV_K8S_43=an image is pinned by tag, not digest: set exporter.image.digest (or probe.image.digest) to the digest you pushed and signed" -}}
{{- end -}}
{{- if ne ($image.pullPolicy | default "IfNotPresent") "Always" -}}
{{- $skips = append $skips "CKV_K8S_15=imagePullPolicy IfNotPresent: a pinned image does not change; set exporter.image.pullPolicy (or probe.image.pullPolicy) to Always if your policy requires it" -}}
{{- end -}}
{{- $skips = append $skips "CKV2_K8S_6=a one-shot load-test Job that accepts no connection; it only connects to the release's vLLM Service" -}}
{{- range $i, $skip := $skips }}
checkov.io/skip{{ add1 $i }}: {{ $skip | quote }}
{{- end -}}
{{- end -}}

{{/* The probe's image: probe.image when its repository is set, else the sidecar's. */}}
{{- define "vllm-headroom.probe.image" -}}
{{- $image := .Values.probe.image | default dict -}}
{{- if $image.repository -}}
{{- include "vllm-headroom.imageRef" (list $image .Chart.AppVersion) -}}
{{- else -}}
{{- include "vllm-headroom.exporterImage" . -}}
{{- end -}}
{{- end -}}

{{/* Checks of the probe values (one line each), run by probe-job.yaml when probe.enabled. */}}
{{- define "vllm-headroom.probe.validate" -}}
{{- $v := .Values -}}
{{- $p := $v.probe -}}
{{- if ne $v.shape "vllm" -}}
{{- fail (printf "probe.enabled=true needs shape=vllm: the probe Job load-tests the vLLM Service this chart creates, and shape=%s creates none (run vllm-headroom probe --target against that vLLM instead, docs/probe.md)" (toString $v.shape)) -}}
{{- end -}}
{{- if or (ne $v.autoscaling.kind "none") (gt (int $v.vllm.replicas) 1) -}}
{{- fail "probe.enabled=true needs one vLLM replica (vllm.replicas=1, autoscaling.kind=none): the Service spreads the load over every pod while the probe reads one pod's /metrics, so its knee would be wrong" -}}
{{- end -}}
{{- if $v.vllm.apiKey.secretName -}}
{{- fail "probe.enabled=true does not fit vllm.apiKey.secretName: the probe sends no API key, so vLLM would refuse its requests; probe an instance without --api-key" -}}
{{- end -}}
{{- $prompt := include "vllm-headroom.isSet" $p.shape.promptTokens -}}
{{- $output := include "vllm-headroom.isSet" $p.shape.outputTokens -}}
{{- if ne $prompt $output -}}
{{- fail "probe.shape: set promptTokens and outputTokens together (every request the same lengths)" -}}
{{- end -}}
{{- $sources := 0 -}}
{{- if $prompt -}}{{- $sources = add1 $sources -}}{{- end -}}
{{- if $p.shape.from -}}{{- $sources = add1 $sources -}}{{- end -}}
{{- if $p.shape.fromTarget -}}{{- $sources = add1 $sources -}}{{- end -}}
{{- if eq $sources 0 -}}
{{- fail "probe.enabled=true needs a traffic shape: probe.shape.promptTokens and outputTokens, probe.shape.from (another vLLM's URL, e.g. production), or probe.shape.fromTarget=true once this release's vLLM has served traffic (a new one has no histograms to read)" -}}
{{- end -}}
{{- if gt $sources 1 -}}
{{- fail "probe.shape: give one traffic shape: promptTokens/outputTokens, from, or fromTarget=true" -}}
{{- end -}}
{{- if and $p.shape.windowSeconds $prompt -}}
{{- fail "probe.shape.windowSeconds reads histograms twice: use it with from or fromTarget, not with promptTokens" -}}
{{- end -}}
{{- if eq $p.mode "concurrency" -}}
{{- range $p.levels -}}
{{- if ne (float64 .) (floor (float64 .)) -}}
{{- fail (printf "probe.levels has %v: concurrency levels are whole numbers of requests (e.g. [1, 2, 4, 8])" .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if include "vllm-headroom.isSet" $p.activeDeadlineSeconds -}}
{{- if lt (float64 $p.activeDeadlineSeconds) (addf $p.maxDurationSeconds $p.drainSeconds) -}}
{{- fail (printf "probe.activeDeadlineSeconds (%v) is below probe.maxDurationSeconds + drainSeconds (%v): Kubernetes would kill the sweep before its own bound; raise it, or leave it null to have it computed" $p.activeDeadlineSeconds (addf $p.maxDurationSeconds $p.drainSeconds)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
