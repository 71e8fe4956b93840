{{/* Names ---------------------------------------------------------------- */}}
{{- define "kestrel.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kestrel.labels" -}}
app.kubernetes.io/name: kestrel
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* selector labels of one component: (dict "root" $ "name" "meter") */}}
{{- define "kestrel.selector" -}}
app.kubernetes.io/name: kestrel
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .name }}
{{- end -}}

{{- define "kestrel.image" -}}
{{- if not .Values.image.tag -}}
{{- fail "image.tag is required: the tag images/build.sh printed (kestrel.dev/kestrel:<key>)" -}}
{{- end -}}
{{- printf "%s:%s" .Values.image.repository .Values.image.tag -}}
{{- end -}}

{{- define "kestrel.storesSecret" -}}
{{- .Values.stores.existingSecret | default (printf "%s-stores" (include "kestrel.fullname" .)) -}}
{{- end -}}

{{- define "kestrel.tokenSecret" -}}
{{- .Values.operatorToken.existingSecret | default (printf "%s-operator-token" (include "kestrel.fullname" .)) -}}
{{- end -}}

{{/* Where a service answers, seen from another pod: (dict "root" $ "name" "meter") */}}
{{- /* The gateway's internal kestrel.v1.Replicas, through its own ClusterIP Service. */ -}}
{{- define "kestrel.replicasAddr" -}}
{{- if .Values.hostNetwork -}}
$(KESTREL_POD_IP):{{ .Values.gateway.replicasPort }}
{{- else -}}
{{ include "kestrel.fullname" . }}-replicas.{{ .Release.Namespace }}.svc:{{ .Values.gateway.replicasPort }}
{{- end -}}
{{- end -}}

{{- define "kestrel.addr" -}}
{{- $svc := index .root.Values .name -}}
{{- if .root.Values.hostNetwork -}}
$(KESTREL_POD_IP):{{ $svc.port }}
{{- else -}}
dns:///{{ include "kestrel.fullname" .root }}-{{ .name }}-pods.{{ .root.Release.Namespace }}.svc:{{ $svc.port }}
{{- end -}}
{{- end -}}

{{/* Environment every Kestrel container starts with. */}}
{{- define "kestrel.commonEnv" -}}
- name: KESTREL_POD_IP
  valueFrom: {fieldRef: {fieldPath: status.podIP}}
- name: KESTREL_BIND_HOST
  value: $(KESTREL_POD_IP)
- name: KESTREL_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
- name: HOME
  value: /tmp
{{- with .Values.kubernetes.apiServerHost }}
- name: KUBERNETES_SERVICE_HOST
  value: {{ . | quote }}
{{- end }}
{{- with .Values.kubernetes.apiServerPort }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ . | quote }}
{{- end }}
{{- end -}}

{{/* One key of the stores Secret as an env var: (dict "root" $ "key" "KESTREL_REDIS_URL") */}}
{{- define "kestrel.storeEnv" -}}
- name: {{ .key }}
  valueFrom:
    secretKeyRef:
      name: {{ include "kestrel.storesSecret" .root }}
      key: {{ .key }}
{{- end -}}

{{- define "kestrel.tokenEnv" -}}
- name: KESTREL_OPERATOR_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "kestrel.tokenSecret" . }}
      key: token
{{- end -}}
