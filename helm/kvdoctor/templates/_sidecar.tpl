{{/*
The kvdoctor sidecar, as named templates that the chart's engine Deployment uses and that a
parent chart can include in its own engine pods (README.md, "Sidecar only").

Every template takes one dict:
  sidecar    the `sidecar` values of this chart (required)
  image      the `image` values of this chart (required)
  tag        image tag when image.tag is empty (this chart passes its appVersion)
  engineUrl  the engine's /metrics URL when sidecar.engineUrl is empty (default http://127.0.0.1:8000/metrics)
  webConfigSecret  the Secret with the sidecar's web config when sidecar.web is on and has no
             existingSecret (this chart passes the one it makes; a parent chart sets sidecar.web.existingSecret)
  model      the served model when sidecar.model is empty (this chart passes engine.model)
  modelVolume  the pod volume with the models when sidecar.modelVolume.name is empty (this chart
             passes its engine's model-cache)

In a parent chart with kvdoctor as a dependency:
  {{- $kv := dict "sidecar" .Values.kvdoctor.sidecar "image" .Values.kvdoctor.image }}
  containers:
    - name: my-engine
      ...
      lifecycle: {{- include "kvdoctor.engine.lifecycle" $kv | nindent 8 }}
      volumeMounts: {{- include "kvdoctor.engine.volumeMounts" $kv | nindent 8 }}
    {{- include "kvdoctor.sidecar.container" $kv | nindent 4 }}
  volumes: {{- include "kvdoctor.sidecar.volumes" $kv | nindent 4 }}
*/}}

{{/* Where the engine writes the UUIDs of its GPUs for the sidecar (an emptyDir shared by both). */}}
{{- define "kvdoctor.gpuListDir" -}}/var/run/kvdoctor{{- end }}
{{- define "kvdoctor.gpuListFile" -}}/var/run/kvdoctor/engine-gpus{{- end }}

{{/*
The --gpu-filter value for sidecar.gpuVisibility.
*/}}
{{- define "kvdoctor.gpuFilter" -}}
{{- $gv := .sidecar.gpuVisibility }}
{{- if eq $gv.mode "engineFile" }}
{{- printf "file:%s" (include "kvdoctor.gpuListFile" .) }}
{{- else if eq $gv.mode "engineProcesses" }}
{{- print "engine-processes" }}
{{- else if eq $gv.mode "uuids" }}
{{- if not $gv.uuids }}
{{- fail "sidecar.gpuVisibility.uuids: mode uuids needs at least one GPU UUID" }}
{{- end }}
{{- printf "uuids:%s" (join "," $gv.uuids) }}
{{- else if has $gv.mode (list "all" "auto") }}
{{- print $gv.mode }}
{{- else }}
{{- fail (printf "sidecar.gpuVisibility.mode: unknown mode %q (engineFile, engineProcesses, uuids, all, auto)" $gv.mode) }}
{{- end }}
{{- end }}

{{/*
Whether sidecar.web asks for a web config (TLS, basic auth or a whole file): "true" or empty.
*/}}
{{- define "kvdoctor.web.enabled" -}}
{{- $w := .sidecar.web | default dict }}
{{- if or (dig "tls" "enabled" false $w) $w.basicAuthUsers $w.existingSecret }}true{{ end }}
{{- end }}

{{/*
The Secret holding web-config.yml: sidecar.web.existingSecret, else the one this chart makes.
*/}}
{{- define "kvdoctor.web.secretName" -}}
{{- $w := .sidecar.web | default dict }}
{{- $name := $w.existingSecret | default .webConfigSecret }}
{{- if not $name }}
{{- fail "sidecar.web.existingSecret: the sidecar template needs a Secret with web-config.yml (outside this chart)" }}
{{- end }}
{{- $name }}
{{- end }}

{{/*
The exporter-toolkit web config the chart writes from sidecar.web (paths of the mounted TLS Secret).
*/}}
{{- define "kvdoctor.web.config" -}}
{{- $w := .web }}
{{- $cfg := dict }}
{{- if $w.tls.enabled }}
{{- if not $w.tls.secretName }}
{{- fail "sidecar.web.tls.secretName: TLS needs a kubernetes.io/tls Secret (tls.crt, tls.key), or sidecar.web.existingSecret" }}
{{- end }}
{{- $tls := dict "cert_file" "/etc/kvdoctor/tls/tls.crt" "key_file" "/etc/kvdoctor/tls/tls.key" "min_version" $w.tls.minVersion "client_auth_type" $w.tls.clientAuthType }}
{{- if ne $w.tls.clientAuthType "NoClientCert" }}
{{- $_ := set $tls "client_ca_file" "/etc/kvdoctor/tls/ca.crt" }}
{{- end }}
{{- $_ := set $cfg "tls_server_config" $tls }}
{{- end }}
{{- with $w.basicAuthUsers }}
{{- $_ := set $cfg "basic_auth_users" . }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}

{{/*
One probe of the sidecar: GET path (HTTPS with TLS), or a TCP check when client certificates are
required (the kubelet presents none). The probe paths need no basic auth.
*/}}
{{- define "kvdoctor.sidecar.probe" -}}
{{- $tls := dig "web" "tls" dict .sidecar }}
{{- if and $tls.enabled (eq $tls.clientAuthType "RequireAndVerifyClientCert") }}
tcpSocket:
  port: kvdoctor-metrics
{{- else }}
httpGet:
  path: {{ .path }}
  port: kvdoctor-metrics
  {{- if $tls.enabled }}
  scheme: HTTPS
  {{- end }}
{{- end }}
{{- end }}

{{/*
The sidecar container (one item of a pod's `containers` list).
*/}}
{{- define "kvdoctor.sidecar.container" -}}
{{- $s := .sidecar }}
{{- $tag := default .tag .image.tag }}
{{- if not $tag }}
{{- fail "kvdoctor.sidecar.container: set image.tag (the kvdoctor image tag)" }}
{{- end -}}
- name: kvdoctor
  image: {{ printf "%s:%s" .image.repository $tag | quote }}
  imagePullPolicy: {{ .image.pullPolicy | default "IfNotPresent" }}
  command: ["kvdoctor", "exporter"]
  args:
    - {{ printf "--engine-url=%s" (default .engineUrl $s.engineUrl | default "http://127.0.0.1:8000/metrics") | quote }}
    - {{ printf "--engine=%s" $s.engine | quote }}
    - {{ printf "--host=%s" $s.host | quote }}
    - {{ printf "--port=%d" (int $s.port) | quote }}
    - {{ printf "--interval=%d" (int $s.interval) | quote }}
    - {{ printf "--gpu-filter=%s" (include "kvdoctor.gpuFilter" .) | quote }}
    - {{ printf "--log-level=%s" $s.logLevel | quote }}
    {{- if include "kvdoctor.web.enabled" . }}
    - "--web.config.file=/etc/kvdoctor/web/web-config.yml"
    {{- end }}
    {{- with $s.dcgmUrl }}
    - {{ printf "--dcgm-url=%s" . | quote }}
    {{- end }}
    {{- with default .model $s.model }}
    - {{ printf "--served-model=%s" . | quote }}
    {{- end }}
    {{- range $s.extraArgs }}
    - {{ . | quote }}
    {{- end }}
  env:
    # Adds the pod label to every series.
    - name: KVDOCTOR_POD
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    {{- if $s.dcgmUrl }}
    # The node's address, for a dcgmUrl of the form http://$(HOST_IP):9400/metrics.
    - name: HOST_IP
      valueFrom:
        fieldRef:
          fieldPath: status.hostIP
    {{- end }}
    {{- if $s.gpuVisibility.exposeNodeGpus }}
    # See the node's GPUs through NVML only (no CUDA), to pick the engine's (--gpu-filter).
    - name: NVIDIA_VISIBLE_DEVICES
      value: all
    - name: NVIDIA_DRIVER_CAPABILITIES
      value: utility
    {{- end }}
    {{- if include "kvdoctor.modelVolume" . }}
    # The Hugging Face cache of the engine's model volume, where the served model's config.json is.
    - name: HF_HOME
      value: {{ $s.modelVolume.hfHome | default "/models/huggingface" | quote }}
    {{- end }}
    {{- with $s.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    - name: kvdoctor-metrics
      containerPort: {{ int $s.port }}
      protocol: TCP
  livenessProbe:
    {{- include "kvdoctor.sidecar.probe" (merge (dict "path" "/healthz") .) | nindent 4 }}
    periodSeconds: 10
    timeoutSeconds: 3
    failureThreshold: 3
  readinessProbe:
    {{- include "kvdoctor.sidecar.probe" (merge (dict "path" "/readyz") .) | nindent 4 }}
    periodSeconds: 5
    timeoutSeconds: 3
    failureThreshold: 3
  resources:
    {{- toYaml $s.resources | nindent 4 }}
  securityContext:
    {{- toYaml $s.securityContext | nindent 4 }}
  volumeMounts:
    - name: kvdoctor-tmp
      mountPath: /tmp
    {{- if include "kvdoctor.web.enabled" . }}
    - name: kvdoctor-web
      mountPath: /etc/kvdoctor/web
      readOnly: true
    {{- if dig "web" "tls" "secretName" "" $s }}
    - name: kvdoctor-tls
      mountPath: /etc/kvdoctor/tls
      readOnly: true
    {{- end }}
    {{- end }}
    {{- if eq $s.gpuVisibility.mode "engineFile" }}
    - name: kvdoctor-run
      mountPath: {{ include "kvdoctor.gpuListDir" . }}
      readOnly: true
    {{- end }}
    {{- with include "kvdoctor.modelVolume" . }}
    - name: {{ . }}
      mountPath: {{ $s.modelVolume.mountPath | default "/models" }}
      readOnly: true
    {{- end }}
{{- end }}

{{/*
The pod volume with the engine's models that the sidecar mounts read-only: sidecar.modelVolume.name,
else the one the including chart passes (this chart's engine model-cache); empty: none.
*/}}
{{- define "kvdoctor.modelVolume" -}}
{{- $name := dig "modelVolume" "name" "" .sidecar }}
{{- if $name }}{{ $name }}{{ else if .modelVolume }}{{ .modelVolume }}{{ end }}
{{- end }}

{{/*
The pod volumes the sidecar needs (items of the pod's `volumes` list).
*/}}
{{- define "kvdoctor.sidecar.volumes" -}}
- name: kvdoctor-tmp
  emptyDir:
    sizeLimit: 64Mi
{{- if include "kvdoctor.web.enabled" . }}
- name: kvdoctor-web
  secret:
    secretName: {{ include "kvdoctor.web.secretName" . }}
{{- with dig "web" "tls" "secretName" "" .sidecar }}
- name: kvdoctor-tls
  secret:
    secretName: {{ . }}
{{- end }}
{{- end }}
{{- if eq .sidecar.gpuVisibility.mode "engineFile" }}
- name: kvdoctor-run
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
{{- end }}
{{- end }}

{{/*
The engine container's volume mounts for the sidecar (items of its `volumeMounts`); empty unless
gpuVisibility.mode is engineFile.
*/}}
{{- define "kvdoctor.engine.volumeMounts" -}}
{{- if eq .sidecar.gpuVisibility.mode "engineFile" -}}
- name: kvdoctor-run
  mountPath: {{ include "kvdoctor.gpuListDir" . }}
{{- end }}
{{- end }}

{{/*
The engine container's `lifecycle` for gpuVisibility.mode engineFile: a postStart hook that writes
the UUIDs of the GPUs the engine container was given, as the engine itself sees them
(nvidia-smi; else the device plugin's NVIDIA_VISIBLE_DEVICES, or the files of its volume-mounts
strategy), to the shared file, atomically. It never fails: a failing postStart hook would kill
the engine. When neither source exists it writes nothing, and the sidecar reports the NVML
source down (gpu_filter_pending) rather than guessing.
*/}}
{{- define "kvdoctor.engine.lifecycle" -}}
{{- if eq .sidecar.gpuVisibility.mode "engineFile" -}}
postStart:
  exec:
    command:
      - /bin/sh
      - -c
      - |
        f="$1"; t="$1.tmp"
        if timeout 30 nvidia-smi --query-gpu=uuid --format=csv,noheader > "$t" 2>/dev/null; then :
        elif [ -d "${NVIDIA_VISIBLE_DEVICES:-}" ]; then ls "$NVIDIA_VISIBLE_DEVICES" > "$t" 2>/dev/null
        elif [ -n "${NVIDIA_VISIBLE_DEVICES+set}" ]; then printf '%s\n' "$NVIDIA_VISIBLE_DEVICES" > "$t" 2>/dev/null
        else rm -f "$t"; exit 0
        fi
        mv -f "$t" "$f" 2>/dev/null; exit 0
      - kvdoctor-gpu-list
      - {{ include "kvdoctor.gpuListFile" . }}
{{- end }}
{{- end }}
