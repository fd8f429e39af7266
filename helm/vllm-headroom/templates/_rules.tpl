{{/*
The rule groups of alerts/rules.py (files/alerts/ holds the copy that make docs generates from it,
python -m alerts.generate, with selector markers) with prometheusRule's values applied
structurally:
- an alert's {enabled: false} drops it; its for and severity replace the file's;
- a threshold's value replaces the expr of its recording rule headroom:threshold:<name> (group
  vllm-headroom-thresholds) with vector(<value>);
- scope release (the default): every series selector of every expr gets this release's
  matchers in place of its marker (other scopes drop the markers). What Prometheus scrapes
  (vllm:*, headroom_*, process_*, vLLM's http_requests_total, up; marker <scraped>) gets the
  selector (this release's scrape jobs); what the rules record (headroom:*:*, thresholds
  included; marker <recorded>) gets headroom_release="<namespace>/<fullname>", a label every
  recording rule and alert of the release carries. The annotations query recorded series by
  $labels.headroom_release.
- alertLabels on every alert (and model_name in the vllm shape); runbookUrl and grafanaUrl make
  the links of every alert absolute.
Names that match no alert or threshold of the file fail the render, listing the known ones.
tests/test_helm_rules.py applies the same values to the file in Python (with a PromQL lexer for
the scope) and compares, and runs two releases side by side under promtool.
*/}}

{{- define "vllm-headroom.rules.file" -}}files/alerts/vllm-headroom.rules.yml{{- end -}}

{{/* The job labels the chart's monitors give vLLM's and the exporter's targets. */}}
{{- define "vllm-headroom.job.vllm" -}}
{{- printf "%s/%s-vllm" .Release.Namespace (include "vllm-headroom.fullname" .) -}}
{{- end -}}
{{- define "vllm-headroom.job.exporter" -}}
{{- printf "%s/%s-exporter" .Release.Namespace (include "vllm-headroom.fullname" .) -}}
{{- end -}}

{{/* The value of headroom_release: <namespace>/<fullname>. */}}
{{- define "vllm-headroom.rules.release" -}}
{{- printf "%s/%s" .Release.Namespace (include "vllm-headroom.fullname" .) -}}
{{- end -}}

{{/*
The matchers of the series this release's rules read: prometheusRule.selector, else this
release's jobs, the exporter's and vLLM's. vLLM's is the chart's own monitors' job, or, with
vllmMetrics.enabled=false, vllmMetrics.job: the existing scrape of vLLM's /metrics.
*/}}
{{- define "vllm-headroom.rules.selector" -}}
{{- if .Values.prometheusRule.selector -}}
{{- .Values.prometheusRule.selector -}}
{{- else -}}
{{- $jobs := printf "%s/%s-(vllm|exporter)" .Release.Namespace (include "vllm-headroom.fullname" .) | replace "." "\\." -}}
{{- if not .Values.vllmMetrics.enabled -}}
{{- $jobs = printf "%s|%s" (include "vllm-headroom.job.exporter" . | regexQuoteMeta) (regexQuoteMeta .Values.vllmMetrics.job) -}}
{{- end -}}
{{- if eq .Values.shape "fleet" -}}
{{- printf "job=~%q" $jobs -}}
{{- else -}}
{{- printf "namespace=%q,job=~%q" .Release.Namespace $jobs -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Fill the selector markers of one expression: (list $expr $selector $release $scoped). The chart's
copy of the rules (generated from alerts/rules.py) writes every selector of a scraped series as
name{<scraped>} or name{<scraped>,...} and of a recorded series with <recorded>; scoped, the
markers become the selector and headroom_release="<release>", unscoped they go (with braces left
empty), as alerts/rules.py's fill does. Plain replace: no pattern touches the PromQL.
*/}}
{{- define "vllm-headroom.rules.fill" -}}
{{- $e := index . 0 -}}
{{- if index . 3 -}}
{{- $e = replace "<scraped>" (index . 1) $e -}}
{{- $e = replace "<recorded>" (printf "headroom_release=%q" (index . 2)) $e -}}
{{- else -}}
{{- $e = replace "{<scraped>}" "" $e | replace "<scraped>," "" | replace "{<recorded>}" "" | replace "<recorded>," "" -}}
{{- end -}}
{{- $e -}}
{{- end -}}

{{- define "vllm-headroom.rules.threshold" -}}
{{- if kindIs "string" . -}}
{{- . -}}
{{- else if and (kindIs "float64" .) (eq . (floor .)) (lt . 1e15) (gt . -1e15) -}}
{{- printf "%d" (int64 .) -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end -}}

{{/* The thresholds the chart derives from other values, unless prometheusRule sets them. */}}
{{- define "vllm-headroom.rules.derivedThresholds" -}}
{{- $derived := dict -}}
{{- if eq .Values.shape "vllm" -}}
{{- $p := .Values.vllm.startupProbe | default dict -}}
{{- if and $p.periodSeconds $p.failureThreshold -}}
{{- $_ := set $derived "vllm_startup_seconds" (add (mul (int $p.periodSeconds) (int $p.failureThreshold)) (int ($p.initialDelaySeconds | default 0))) -}}
{{- end -}}
{{- end -}}
{{- toYaml $derived -}}
{{- end -}}

{{- define "vllm-headroom.rules.groups" -}}
{{- $file := include "vllm-headroom.rules.file" . -}}
{{- $raw := .Files.Get $file -}}
{{- if not $raw -}}
{{- fail (printf "%s is missing or empty: the chart ships a copy of alerts/vllm-headroom.rules.yml there; restore it (make docs in the repository) or use a released chart" $file) -}}
{{- end -}}
{{- if not (and (contains "<scraped>" $raw) (contains "<recorded>" $raw)) -}}
{{- fail (printf "%s has no selector markers (<scraped>, <recorded>): it must be the chart's copy generated from alerts/rules.py, not the unscoped alerts/vllm-headroom.rules.yml; regenerate it (make docs in the repository) or use a released chart" $file) -}}
{{- end -}}
{{- $doc := fromYaml $raw -}}
{{- if hasKey $doc "Error" -}}
{{- fail (printf "%s is not valid YAML: %s" $file $doc.Error) -}}
{{- end -}}
{{- $v := .Values.prometheusRule -}}
{{- $wanted := $v.alerts -}}
{{- $thresholds := merge (deepCopy ($v.thresholds | default dict)) (fromYaml (include "vllm-headroom.rules.derivedThresholds" .)) -}}
{{- $scoped := eq ($v.scope | default "release") "release" -}}
{{- $selector := include "vllm-headroom.rules.selector" . -}}
{{- $release := include "vllm-headroom.rules.release" . -}}
{{- $alertLabels := deepCopy ($v.alertLabels | default dict) -}}
{{- if $scoped -}}
{{- $_ := set $alertLabels "headroom_release" $release -}}
{{- end -}}
{{- if eq .Values.shape "vllm" -}}
{{- $_ := set $alertLabels "model_name" (.Values.vllm.servedModelName | default .Values.vllm.model) -}}
{{- end -}}
{{- $grafana := trimSuffix "/" ($v.grafanaUrl | default "") -}}
{{- $alertNames := list -}}
{{- $thresholdNames := list -}}
{{- $groups := list -}}
{{- range $group := $doc.groups -}}
{{- $rules := list -}}
{{- range $source := $group.rules -}}
{{- $rule := deepCopy $source -}}
{{- $expr := include "vllm-headroom.rules.fill" (list (toString $rule.expr) $selector $release $scoped) -}}
{{- if or (contains "<scraped>" $expr) (contains "<recorded>" $expr) -}}
{{- fail (printf "%s: a selector marker of rule %s is left after filling (write name{<scraped>} or name{<scraped>,label=\"value\"}, as alerts/rules.py does): %s" $file ($rule.alert | default $rule.record) $expr) -}}
{{- end -}}
{{- $_ := set $rule "expr" $expr -}}
{{- if hasKey $rule "alert" -}}
{{- $alertNames = append $alertNames $rule.alert -}}
{{- $knobs := index $wanted $rule.alert | default dict -}}
{{- if or (not (hasKey $knobs "enabled")) $knobs.enabled -}}
{{- if hasKey $knobs "for" -}}
{{- $_ := set $rule "for" $knobs.for -}}
{{- end -}}
{{- if hasKey $knobs "keepFiringFor" -}}
{{- $_ := set $rule "keep_firing_for" $knobs.keepFiringFor -}}
{{- end -}}
{{- $labels := deepCopy ($rule.labels | default dict) -}}
{{- $labels = merge $labels (deepCopy $alertLabels) -}}
{{- /* An alert whose expression keeps no target label: the release's namespace (Alertmanager
routes by it), or, unscoped, no namespace label at all. */ -}}
{{- if eq (toString (index $labels "namespace")) "<namespace>" -}}
{{- if $scoped -}}
{{- $_ := set $labels "namespace" $.Release.Namespace -}}
{{- else -}}
{{- $_ := unset $labels "namespace" -}}
{{- end -}}
{{- end -}}
{{- if hasKey $knobs "severity" -}}
{{- $_ := set $labels "severity" $knobs.severity -}}
{{- end -}}
{{- $_ := set $rule "labels" $labels -}}
{{- $annotations := deepCopy ($rule.annotations | default dict) -}}
{{- if $v.runbookUrl -}}
{{- $_ := set $annotations "runbook_url" (replace "{alertname}" $rule.alert $v.runbookUrl) -}}
{{- end -}}
{{- if and $grafana (hasPrefix "/" (toString $annotations.dashboard_url)) -}}
{{- $_ := set $annotations "dashboard_url" (printf "%s%s" $grafana $annotations.dashboard_url) -}}
{{- end -}}
{{- $_ := set $rule "annotations" $annotations -}}
{{- $rules = append $rules $rule -}}
{{- end -}}
{{- else -}}
{{- if and (eq $group.name "vllm-headroom-thresholds") (hasPrefix "headroom:threshold:" (toString $rule.record)) -}}
{{- $name := trimPrefix "headroom:threshold:" $rule.record -}}
{{- $thresholdNames = append $thresholdNames $name -}}
{{- if hasKey $thresholds $name -}}
{{- $_ := set $rule "expr" (printf "vector(%s)" (include "vllm-headroom.rules.threshold" (index $thresholds $name))) -}}
{{- end -}}
{{- end -}}
{{- if $scoped -}}
{{- $labels := deepCopy ($rule.labels | default dict) -}}
{{- $_ := set $labels "headroom_release" $release -}}
{{- $_ := set $rule "labels" $labels -}}
{{- end -}}
{{- $rules = append $rules $rule -}}
{{- end -}}
{{- end -}}
{{- $copy := deepCopy $group -}}
{{- $_ := set $copy "rules" $rules -}}
{{- $groups = append $groups $copy -}}
{{- end -}}
{{- range $name, $_ := $wanted -}}
{{- if not (has $name $alertNames) -}}
{{- fail (printf "prometheusRule.alerts.%s: no alert of that name in alerts/vllm-headroom.rules.yml; its alerts are: %s" $name (join ", " $alertNames)) -}}
{{- end -}}
{{- end -}}
{{- range $name, $_ := $v.thresholds -}}
{{- if not (has $name $thresholdNames) -}}
{{- fail (printf "prometheusRule.thresholds.%s: no threshold of that name (recording rule headroom:threshold:%s in group vllm-headroom-thresholds); the thresholds are: %s" $name $name (join ", " $thresholdNames)) -}}
{{- end -}}
{{- end -}}
{{- toYaml $groups -}}
{{- end -}}
