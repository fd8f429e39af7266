{{/*
The rule groups of alerts/vllm-headroom.rules.yml (embedded through the files/alerts symlink,
never copied) with prometheusRule.alerts and .thresholds applied structurally:
- an alert's {enabled: false} drops it; its for and severity replace the file's;
- a threshold's value replaces the expr of its recording rule headroom:threshold:<name> (group
  vllm-headroom-thresholds) with vector(<value>).
Names that match no alert or threshold of the file fail the render, listing the known ones.
tests/test_helm.py applies the same values to the file in Python and compares.
*/}}

{{- define "vllm-headroom.rules.file" -}}files/alerts/vllm-headroom.rules.yml{{- end -}}

{{- define "vllm-headroom.rules.threshold" -}}
{{- if kindIs "string" . -}}
{{- . -}}
{{- else if and (kindIs "float64" .) (eq . (floor .)) (lt . 1e15) (gt . -1e15) -}}
{{- printf "%d" (int64 .) -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end -}}

{{- define "vllm-headroom.rules.groups" -}}
{{- $file := include "vllm-headroom.rules.file" . -}}
{{- $raw := .Files.Get $file -}}
{{- if not $raw -}}
{{- fail (printf "%s is missing or empty: the chart embeds alerts/vllm-headroom.rules.yml through the symlink helm/vllm-headroom/files/alerts; package the chart from the repository (helm package helm/vllm-headroom)" $file) -}}
{{- end -}}
{{- $doc := fromYaml $raw -}}
{{- if hasKey $doc "Error" -}}
{{- fail (printf "%s is not valid YAML: %s" $file $doc.Error) -}}
{{- end -}}
{{- $wanted := .Values.prometheusRule.alerts -}}
{{- $thresholds := .Values.prometheusRule.thresholds -}}
{{- $alertNames := list -}}
{{- $thresholdNames := list -}}
{{- $groups := list -}}
{{- range $group := $doc.groups -}}
{{- $rules := list -}}
{{- range $source := $group.rules -}}
{{- $rule := deepCopy $source -}}
{{- if hasKey $rule "alert" -}}
{{- $alertNames = append $alertNames $rule.alert -}}
{{- $knobs := index $wanted $rule.alert | default dict -}}
{{- if or (not (hasKey $knobs "enabled")) $knobs.enabled -}}
{{- if hasKey $knobs "for" -}}
{{- $_ := set $rule "for" $knobs.for -}}
{{- end -}}
{{- if hasKey $knobs "severity" -}}
{{- $labels := deepCopy ($rule.labels | default dict) -}}
{{- $_ := set $labels "severity" $knobs.severity -}}
{{- $_ := set $rule "labels" $labels -}}
{{- end -}}
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
{{- range $name, $_ := $thresholds -}}
{{- if not (has $name $thresholdNames) -}}
{{- fail (printf "prometheusRule.thresholds.%s: no threshold of that name (recording rule headroom:threshold:%s in group vllm-headroom-thresholds); the thresholds are: %s" $name $name (join ", " $thresholdNames)) -}}
{{- end -}}
{{- end -}}
{{- toYaml $groups -}}
{{- end -}}
