{{/*
nftpolicy.image: repository:tag, with @digest when one is set (the tag
defaults to the chart's appVersion).
*/}}
{{- define "nftpolicy.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- .Values.image.repository }}:{{ $tag }}
{{- with .Values.image.digest }}@{{ . }}{{ end }}
{{- end }}

{{/*
nftpolicy.validate fails the rendering on values the agent would refuse at
start (a DaemonSet crash-looping on every node), so helm says it first.
*/}}
{{- define "nftpolicy.validate" -}}
{{- if not (has .Values.mode (list "hybrid" "queue" "kernel")) }}
{{- fail (printf "mode %q: want hybrid, queue or kernel" .Values.mode) }}
{{- end }}
{{- if not (has .Values.metrics.auth (list "none" "delegated")) }}
{{- fail (printf "metrics.auth %q: want none or delegated" .Values.metrics.auth) }}
{{- end }}
{{- with .Values.image.digest }}
{{- if not (regexMatch "^sha256:[0-9a-f]{64}$" .) }}
{{- fail (printf "image.digest %q: want sha256:<64 hex digits>" .) }}
{{- end }}
{{- end }}
{{- end }}
