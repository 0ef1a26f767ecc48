{{- define "onceflow.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "onceflow.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "onceflow.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "onceflow.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* Settings shared by every process (also inlined in the hook Job, which runs before
     the ConfigMap exists on first install). */}}
{{- define "onceflow.settings" -}}
ONCEFLOW_KAFKA_BOOTSTRAP_SERVERS: {{ .Values.kafka.bootstrapServers | quote }}
ONCEFLOW_JOBS_TOPIC: {{ .Values.kafka.jobsTopic | quote }}
ONCEFLOW_DLQ_TOPIC: {{ .Values.kafka.dlqTopic | quote }}
ONCEFLOW_TOPIC_PARTITIONS: {{ .Values.kafka.partitions | quote }}
ONCEFLOW_TOPIC_REPLICATION_FACTOR: {{ .Values.kafka.replicationFactor | quote }}
ONCEFLOW_CONSUMER_GROUP: {{ .Values.kafka.consumerGroup | quote }}
ONCEFLOW_ENGINE_WEBHOOKS: {{ .Values.webhooks.inEngine | quote }}
ONCEFLOW_WEBHOOK_CONCURRENCY: {{ .Values.webhooks.concurrency | quote }}
ONCEFLOW_WEBHOOK_RETRY_SECONDS: {{ .Values.webhooks.retrySeconds | quote }}
ONCEFLOW_WORKFLOW_MODULES: {{ .Values.workflowModules | toJson | quote }}
{{- with .Values.events }}
ONCEFLOW_LIFECYCLE_EVENTS: {{ .enabled | quote }}
ONCEFLOW_EVENTS_TOPIC: {{ .topic | quote }}
ONCEFLOW_EVENTS_RELAY: {{ .relay | quote }}
ONCEFLOW_EVENTS_OUTBOX_MAX_DEPTH: {{ .outboxMaxDepth | int64 | quote }}
ONCEFLOW_EVENTS_RELAY_INTERVAL_SECONDS: {{ .relayIntervalSeconds | quote }}
ONCEFLOW_EVENTS_RELAY_BUSY_INTERVAL_SECONDS: {{ .relayBusyIntervalSeconds | quote }}
ONCEFLOW_EVENTS_RELAY_BUSY_ROUND: {{ .relayBusyRound | int64 | quote }}
{{- end }}
ONCEFLOW_STATE_DIR: "/tmp/onceflow"
ONCEFLOW_LOG_FORMAT: "json"
{{- with .Values.tracing }}
{{- if .endpoint }}
ONCEFLOW_OTEL_EXPORTER_OTLP_ENDPOINT: {{ .endpoint | quote }}
{{- end }}
ONCEFLOW_OTEL_SAMPLING_RATIO: {{ .samplingRatio | quote }}
ONCEFLOW_OTEL_SERVICE_NAME_PREFIX: {{ .serviceNamePrefix | quote }}
{{- end }}
{{- range $key, $value := .Values.settings }}
{{ $key }}: {{ $value | quote }}
{{- end }}
{{- end -}}

{{- define "onceflow.databaseEnv" -}}
- name: ONCEFLOW_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.database.existingSecret }}
      key: {{ .Values.database.secretKey }}
{{- end -}}

{{/* The webhook allow-list (with its secrets) from its Secret, for every process. */}}
{{- define "onceflow.webhooksEnv" -}}
{{- if .Values.webhooks.existingSecret }}
- name: ONCEFLOW_WEBHOOK_ENDPOINTS
  valueFrom:
    secretKeyRef:
      name: {{ .Values.webhooks.existingSecret }}
      key: {{ .Values.webhooks.secretKey }}
{{- end }}
{{- end -}}

{{- define "onceflow.probes" -}}
livenessProbe:
  httpGet: {path: /healthz, port: metrics}
  periodSeconds: 10
  failureThreshold: 3
readinessProbe:
  httpGet: {path: /readyz, port: metrics}
  periodSeconds: 5
  failureThreshold: 2
{{- end -}}

{{- define "onceflow.podCommon" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets: {{ toYaml . | nindent 2 }}
{{- end }}
securityContext: {{ toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.nodeSelector }}
nodeSelector: {{ toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations: {{ toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity: {{ toYaml . | nindent 2 }}
{{- end }}
volumes:
  - name: tmp
    emptyDir: {}
{{- end -}}
