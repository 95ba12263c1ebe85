{{- define "replay-ingest.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "replay-ingest.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The version, as a label's value: the image's tag (or the app's version) with what a label
     may not hold (a semver build's `+`, over 63 characters, an end that is not a letter or digit)
     replaced or cut — the API server refused every object of the release for it. */}}
{{- define "replay-ingest.versionLabel" -}}
{{- $version := .Values.image.tag | default .Chart.AppVersion | toString -}}
{{- $version = regexReplaceAll "[^-A-Za-z0-9_.]" $version "_" | trunc 63 -}}
{{- regexReplaceAll "^[^A-Za-z0-9]+|[^A-Za-z0-9]+$" $version "" -}}
{{- end -}}

{{/* The recommended labels (kubernetes.io/docs/concepts/overview/working-with-objects/common-labels),
on every object and on the pod template. */}}
{{- define "replay-ingest.labels" -}}
{{ include "replay-ingest.selectorLabels" . }}
app.kubernetes.io/version: {{ include "replay-ingest.versionLabel" . | quote }}
app.kubernetes.io/component: consumer
app.kubernetes.io/part-of: {{ .Values.partOf | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "replay-ingest.selectorLabels" -}}
app.kubernetes.io/name: {{ include "replay-ingest.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "replay-ingest.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "replay-ingest.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* librdkafka properties, one per line (values may hold commas). Helm reads a YAML number
     as a float, which prints 1000000 as 1e+06 — and librdkafka reads that as 1: whole numbers
     are written as integers. */}}
{{- define "replay-ingest.kafkaProperties" -}}
{{- range $key, $value := .Values.kafkaProperties }}
{{- if and (kindIs "float64" $value) (eq $value (floor $value)) }}
{{ $key }}={{ int64 $value }}
{{- else }}
{{ $key }}={{ $value }}
{{- end }}
{{- end }}
{{- end -}}

{{/* KEDA's name for the SASL mechanism. */}}
{{- define "replay-ingest.kedaSasl" -}}
{{- $mechanism := default "" .Values.config.KAFKA_SASL_MECHANISM | upper -}}
{{- if eq $mechanism "PLAIN" -}}plaintext
{{- else if eq $mechanism "SCRAM-SHA-256" -}}scram_sha256
{{- else if eq $mechanism "SCRAM-SHA-512" -}}scram_sha512
{{- end -}}
{{- end -}}

{{/*
The service's DogStatsD tags: dogstatsd.tags, env:<dogstatsd.env>, and the pod's name (from
POD_NAME, set beside it).
*/}}
{{- define "replay-ingest.statsdTags" -}}
{{- $tags := .Values.dogstatsd.tags }}
{{- with .Values.dogstatsd.env }}
{{- $tags = append $tags (printf "env:%s" .) }}
{{- end }}
{{- $tags = append $tags "pod_name:$(POD_NAME)" }}
{{- join "," $tags }}
{{- end }}

{{/* The CPU request (resources.requests.cpu: "2", 2, "1500m"), in whole cores rounded up; 0
     without one. */}}
{{- define "replay-ingest.requestedCores" -}}
{{- $cpu := toString (dig "requests" "cpu" "" (.Values.resources | default dict)) -}}
{{- $cores := 0.0 -}}
{{- if hasSuffix "m" $cpu -}}
{{- $cores = divf (float64 (trimSuffix "m" $cpu)) 1000 -}}
{{- else -}}
{{- $cores = float64 $cpu -}}
{{- end -}}
{{- int (ceil $cores) -}}
{{- end -}}

{{/* The processing threads the pods run: config.PROCESSING_THREADS, else one per requested
     core. */}}
{{- define "replay-ingest.processingThreads" -}}
{{- if hasKey .Values.config "PROCESSING_THREADS" -}}
{{- int .Values.config.PROCESSING_THREADS -}}
{{- else -}}
{{- max 1 (int (include "replay-ingest.requestedCores" .)) -}}
{{- end -}}
{{- end -}}

{{/* The container's resources as set, with limits.memory, when unset, following the
     processing threads (values.yaml says why): 704Mi + 160Mi a thread, 1Gi at least. The
     chart's test checks each thread count from 1 to 16 against the bound the service computes. */}}
{{- define "replay-ingest.resources" -}}
{{- $resources := deepCopy (.Values.resources | default dict) -}}
{{- $limits := $resources.limits | default dict -}}
{{- if not $limits.memory -}}
{{- /* The settings the derived limit assumes at most (the service's defaults, values.yaml's
       for the first two): one raised past them raises the bound beyond what it counts. */ -}}
{{- $assumed := dict "BUFFER_MAX_BYTES" 268435456 "PREFETCH_KBYTES" 65536 "MAX_DECOMPRESSED_BYTES" 104857600 "MAX_MESSAGE_BYTES" 15000000 -}}
{{- range $key, $most := $assumed -}}
{{- if and (hasKey $.Values.config $key) (gt (int64 (index $.Values.config $key)) (int64 $most)) -}}
{{- fail (printf "config.%s is raised past %d and resources.limits.memory is not set: the limit the chart derives counts the processing threads only, with the other settings at most at their defaults; set resources.limits.memory to at least the memory_bound_bytes `replay-ingest check-config` prints with these settings, divided by 0.85 (the service warns at start past 85 percent)" $key (int64 $most)) -}}
{{- end -}}
{{- end -}}
{{- $threads := int (include "replay-ingest.processingThreads" .) -}}
{{- $_ := set $limits "memory" (printf "%dMi" (max 1024 (add 704 (mul 160 $threads)))) -}}
{{- $_ := set $resources "limits" $limits -}}
{{- end -}}
{{- toYaml $resources -}}
{{- end -}}

{{/* The service's settings, as `REPLAY_INGEST_*` variables (and the async runtime's threads),
     one YAML map: rendered into the pod spec's `env` (each ReplicaSet keeps its own), into a
     tool Job's (tool-job.yaml), and into the ConfigMap, a copy for kubectl and hand-made Jobs. */}}
{{- define "replay-ingest.settings" -}}
{{- range $key, $value := .Values.config }}
REPLAY_INGEST_{{ $key }}: {{ $value | toString | quote }}
{{- end }}
REPLAY_INGEST_HTTP_LISTEN: {{ printf "%s:%d" (default "0.0.0.0" .Values.http.bindAddress) (int .Values.http.port) | quote }}
{{- if not (hasKey .Values.config "PROCESSING_THREADS") }}
{{- /* One processing thread per requested core. Left to the service, it takes one per core
       of the node (the pod has no CPU limit), and each thread holds a decompression buffer:
       the memory limit would not cover a large node. */}}
REPLAY_INGEST_PROCESSING_THREADS: {{ include "replay-ingest.processingThreads" . | quote }}
{{- end }}
{{- /* The async runtime (the sinks' requests, the probes) would take a thread per core of the
       node too, each with an allocator arena the memory limit does not count: as many as the
       requested cores, two at least (extraEnv TOKIO_WORKER_THREADS overrides it). */}}
{{- $extra := list }}
{{- range .Values.extraEnv }}
{{- $extra = append $extra .name }}
{{- end }}
{{- if not (has "TOKIO_WORKER_THREADS" $extra) }}
TOKIO_WORKER_THREADS: {{ max 2 (int (include "replay-ingest.requestedCores" .)) | quote }}
{{- end }}
{{- with .Values.kafkaProperties }}
REPLAY_INGEST_KAFKA_PROPERTIES: {{ include "replay-ingest.kafkaProperties" $ | trim | quote }}
{{- end }}
{{- end -}}

{{/* The image, by digest when one is given. */}}
{{- define "replay-ingest.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* The pod's and the container's security context: the Deployment's and the tool Job's. */}}
{{- define "replay-ingest.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "replay-ingest.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* The mounted Secrets (secrets.*): the variables naming their files, the mounts and the
     volumes. */}}
{{- define "replay-ingest.secretEnv" -}}
{{- with .Values.secrets.clickhousePassword.existingSecret }}
- name: REPLAY_INGEST_CLICKHOUSE_PASSWORD_FILE
  value: /var/run/secrets/replay-ingest/clickhouse/{{ $.Values.secrets.clickhousePassword.key }}
{{- end }}
{{- with .Values.secrets.gcsCredentials.existingSecret }}
- name: GOOGLE_APPLICATION_CREDENTIALS
  value: /var/run/secrets/replay-ingest/gcs/{{ $.Values.secrets.gcsCredentials.key }}
{{- end }}
{{- with .Values.secrets.kafkaSaslPassword.existingSecret }}
- name: REPLAY_INGEST_KAFKA_SASL_PASSWORD_FILE
  value: /var/run/secrets/replay-ingest/kafka-sasl/{{ $.Values.secrets.kafkaSaslPassword.key }}
{{- end }}
{{- with .Values.secrets.kafkaCa.existingSecret }}
- name: REPLAY_INGEST_KAFKA_SSL_CA_LOCATION
  value: /var/run/secrets/replay-ingest/kafka-ca/{{ $.Values.secrets.kafkaCa.key }}
{{- end }}
{{- end -}}

{{- define "replay-ingest.secretVolumeMounts" -}}
{{- if .Values.secrets.clickhousePassword.existingSecret }}
- name: clickhouse-password
  mountPath: /var/run/secrets/replay-ingest/clickhouse
  readOnly: true
{{- end }}
{{- if .Values.secrets.gcsCredentials.existingSecret }}
- name: gcs-credentials
  mountPath: /var/run/secrets/replay-ingest/gcs
  readOnly: true
{{- end }}
{{- if .Values.secrets.kafkaSaslPassword.existingSecret }}
- name: kafka-sasl
  mountPath: /var/run/secrets/replay-ingest/kafka-sasl
  readOnly: true
{{- end }}
{{- if .Values.secrets.kafkaCa.existingSecret }}
- name: kafka-ca
  mountPath: /var/run/secrets/replay-ingest/kafka-ca
  readOnly: true
{{- end }}
{{- end -}}

{{- define "replay-ingest.secretVolumes" -}}
{{- range $name, $secret := dict "clickhouse-password" .Values.secrets.clickhousePassword "gcs-credentials" .Values.secrets.gcsCredentials "kafka-sasl" .Values.secrets.kafkaSaslPassword "kafka-ca" .Values.secrets.kafkaCa }}
{{- with $secret.existingSecret }}
- name: {{ $name }}
  secret:
    secretName: {{ . }}
    # Only the key the service reads (a shared Secret's other keys stay out of the pod), readable
    # by the pod's group (its fsGroup), not by others.
    items:
      - key: {{ $secret.key }}
        path: {{ $secret.key }}
    defaultMode: 288  # 0440
{{- end }}
{{- end }}
{{- end -}}

{{/* A tool Job's labels (templates/tool-job.yaml), given the chart's context and the tool: not
     the Deployment's selector labels (name and instance together), so that its
     PodDisruptionBudget, spread constraints and `kubectl get pods -l` never count a tool's pod
     as a consumer. */}}
{{- define "replay-ingest.toolLabels" -}}
app.kubernetes.io/name: {{ include "replay-ingest.name" .context }}-tool
app.kubernetes.io/instance: {{ .context.Release.Name }}
app.kubernetes.io/component: tool
app.kubernetes.io/part-of: {{ .context.Values.partOf | quote }}
replay-ingest/tool: {{ .tool }}
{{- end -}}
