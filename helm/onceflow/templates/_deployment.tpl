{{/* One Deployment for one process. Args: root, component, values, command, env, ports;
     image (optional: another image than the chart's, for engine.extraVersions). */}}
{{- define "onceflow.deployment" -}}
{{- $root := .root -}}
{{- $v := .values -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "onceflow.fullname" $root }}-{{ .component }}
  labels:
    {{- include "onceflow.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
spec:
  {{- if not .autoscaled }}
  replicas: {{ $v.replicas }}
  {{- end }}
  selector:
    matchLabels: {{- include "onceflow.selector" (dict "root" $root "component" .component) | nindent 6 }}
  template:
    metadata:
      labels: {{- include "onceflow.selector" (dict "root" $root "component" .component) | nindent 8 }}
      annotations:
        checksum/settings: {{ include "onceflow.settings" $root | sha256sum }}
    spec:
      {{- include "onceflow.podCommon" $root | nindent 6 }}
      terminationGracePeriodSeconds: 45
      containers:
        - name: {{ .component }}
          image: {{ .image | default (include "onceflow.image" $root) }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          args: {{ toJson .command }}
          envFrom:
            - configMapRef:
                name: {{ include "onceflow.fullname" $root }}-settings
          env:
            {{- include "onceflow.databaseEnv" $root | nindent 12 }}
            {{- include "onceflow.webhooksEnv" $root | nindent 12 }}
            {{- range $key, $value := .env }}
            - name: {{ $key }}
              value: {{ $value | quote }}
            {{- end }}
          ports:
            {{- range $name, $port := .ports }}
            - name: {{ $name }}
              containerPort: {{ $port }}
            {{- end }}
          {{- include "onceflow.probes" $root | nindent 10 }}
          resources: {{ toYaml $v.resources | nindent 12 }}
          securityContext: {{ toYaml $root.Values.securityContext | nindent 12 }}
          volumeMounts:
            - name: tmp
              mountPath: /tmp
{{- end -}}

{{- define "onceflow.pdb" -}}
{{- if .values.pdb.enabled }}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "onceflow.fullname" .root }}-{{ .component }}
  labels: {{- include "onceflow.labels" .root | nindent 4 }}
spec:
  {{- if hasKey .values.pdb "minAvailable" }}
  minAvailable: {{ .values.pdb.minAvailable }}
  {{- else }}
  maxUnavailable: {{ .values.pdb.maxUnavailable | default 1 }}
  {{- end }}
  selector:
    matchLabels: {{- include "onceflow.selector" (dict "root" .root "component" .component) | nindent 6 }}
{{- end }}
{{- end -}}

{{- define "onceflow.hpa" -}}
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: {{ include "onceflow.fullname" .root }}-{{ .component }}
  labels: {{- include "onceflow.labels" .root | nindent 4 }}
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: {{ include "onceflow.fullname" .root }}-{{ .component }}
  minReplicas: {{ .autoscaling.minReplicas }}
  maxReplicas: {{ .autoscaling.maxReplicas }}
  metrics:
    - type: Resource
      resource:
        name: cpu
        target:
          type: Utilization
          averageUtilization: {{ .autoscaling.targetCPUUtilizationPercentage }}
{{- end -}}
