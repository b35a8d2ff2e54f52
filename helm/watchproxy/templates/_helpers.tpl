{{- define "watchproxy.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "watchproxy.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "watchproxy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "watchproxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "watchproxy.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "watchproxy.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "watchproxy.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "watchproxy.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Whether the API is served over TLS: a standalone release unless tls.enabled is false; a sidecar listens on loopback in plain text. */}}
{{- define "watchproxy.servesTLS" -}}
{{- if and .Values.tls.enabled (not .Values.sidecar.enabled) }}true{{ end }}
{{- end }}

{{/* Whether cert-manager makes the certificates: as tls.certManager.enabled says, "auto" when the cluster serves cert-manager.io/v1. */}}
{{- define "watchproxy.certManager" -}}
{{- $want := toString .Values.tls.certManager.enabled }}
{{- if and (include "watchproxy.servesTLS" .) (or (eq $want "true") (and (eq $want "auto") (.Capabilities.APIVersions.Has "cert-manager.io/v1"))) }}true{{ end }}
{{- end }}

{{- define "watchproxy.tlsSecret" -}}
{{- default (printf "%s-tls" (include "watchproxy.fullname" .)) .Values.tls.secretName }}
{{- end }}

{{- define "watchproxy.clientCASecret" -}}
{{- default (printf "%s-client-ca" (include "watchproxy.fullname" .)) .Values.tls.clientCA.secretName }}
{{- end }}

{{/* The config.yaml watchproxy reads: the user's config plus what the chart owns. */}}
{{- define "watchproxy.config" -}}
{{- $config := deepCopy .Values.config }}
{{- $api := ternary "127.0.0.1" "0.0.0.0" .Values.sidecar.enabled }}
{{- $_ := set $config "listen" (printf "%s:%v" $api .Values.ports.grpc) }}
{{- $_ := set $config "metrics_listen" (printf "0.0.0.0:%v" .Values.ports.metrics) }}
{{- $_ := set $config "health_listen" (printf "0.0.0.0:%v" .Values.ports.health) }}
{{- if not .Values.sidecar.enabled }}
{{- $_ := set $config "continue_token_key_file" "/etc/watchproxy/continue-token/key" }}
{{- end }}
{{- if include "watchproxy.servesTLS" . }}
{{- $tls := dict "cert_file" (printf "/etc/watchproxy/tls/%s" .Values.tls.certKey) "key_file" (printf "/etc/watchproxy/tls/%s" .Values.tls.keyKey) }}
{{- if .Values.tls.clientAuth }}
{{- $_ := set $tls "client_ca_file" (printf "/etc/watchproxy/client-ca/%s" .Values.tls.clientCA.key) }}
{{- $_ := set $tls "client_auth" .Values.tls.clientAuth }}
{{- end }}
{{- $_ := set $config "tls" $tls }}
{{- end }}
{{- $auth := deepCopy (default (dict) $config.auth) }}
{{- if and (not .Values.sidecar.enabled) (not (hasKey $auth "anonymous")) }}
{{- $_ := set $auth "anonymous" false }}
{{- end }}
{{- if $auth }}
{{- $_ := set $config "auth" $auth }}
{{- else }}
{{- $_ := unset $config "auth" }}
{{- end }}
{{- if or .Values.auth.tokensSecret.name .Values.auth.jwksSecret.name }}
{{- $auth := deepCopy (default (dict) $config.auth) }}
{{- if .Values.auth.tokensSecret.name }}
{{- $_ := set $auth "tokens_file" (printf "/etc/watchproxy/tokens/%s" .Values.auth.tokensSecret.key) }}
{{- end }}
{{- if .Values.auth.jwksSecret.name }}
{{- $jwt := deepCopy (required "config.auth.jwt (issuer, audiences) is required with auth.jwksSecret" $auth.jwt) }}
{{- $_ := set $jwt "jwks_file" (printf "/etc/watchproxy/jwks/%s" .Values.auth.jwksSecret.key) }}
{{- $_ := set $auth "jwt" $jwt }}
{{- end }}
{{- $_ := set $config "auth" $auth }}
{{- end }}
{{- $testCert := and (include "watchproxy.servesTLS" .) .Values.tls.clientAuth (include "watchproxy.certManager" .) (not .Values.helmTest.tokenSecret.name) }}
{{- if and .Values.helmTest.enabled (not .Values.sidecar.enabled) $testCert $config.authorization }}
{{- $resource := .Values.helmTest.resource | default (index .Values.config.resources 0).name }}
{{- $rule := dict "subjects" (list (printf "user:%s" .Values.helmTest.user)) "resources" (list $resource) "namespaces" (list "*") "verbs" (list "list") }}
{{- $authorization := deepCopy $config.authorization }}
{{- $_ := set $authorization "rules" (append $authorization.rules $rule) }}
{{- $_ := set $config "authorization" $authorization }}
{{- end }}
{{- if .Values.etcdTLS.enabled }}
{{- $tls := dict "ca_file" (printf "/etc/watchproxy/etcd-tls/%s" .Values.etcdTLS.caKey) "cert_file" (printf "/etc/watchproxy/etcd-tls/%s" .Values.etcdTLS.certKey) "key_file" (printf "/etc/watchproxy/etcd-tls/%s" .Values.etcdTLS.keyKey) }}
{{- if .Values.etcdTLS.serverName }}
{{- $_ := set $tls "server_name" .Values.etcdTLS.serverName }}
{{- end }}
{{- $_ := set $config.etcd "tls" $tls }}
{{- end }}
{{- if .Values.upstreamTLS.enabled }}
{{- $tls := dict "ca_file" (printf "/etc/watchproxy/upstream-tls/%s" .Values.upstreamTLS.caKey) }}
{{- if and .Values.upstreamTLS.certKey .Values.upstreamTLS.keyKey }}
{{- $_ := set $tls "cert_file" (printf "/etc/watchproxy/upstream-tls/%s" .Values.upstreamTLS.certKey) }}
{{- $_ := set $tls "key_file" (printf "/etc/watchproxy/upstream-tls/%s" .Values.upstreamTLS.keyKey) }}
{{- end }}
{{- if .Values.upstreamTLS.serverName }}
{{- $_ := set $tls "server_name" .Values.upstreamTLS.serverName }}
{{- end }}
{{- $_ := set $config "upstream_tls" $tls }}
{{- end }}
{{- if .Values.upstreamToken.secretName }}
{{- $_ := set $config "upstream_token_file" (printf "/etc/watchproxy/upstream-token/%s" .Values.upstreamToken.key) }}
{{- end }}
{{- toYaml $config }}
{{- end }}

{{/*
The watchproxy container. Other charts run watchproxy as a native sidecar by
adding this chart as a dependency with sidecar.enabled and, in their pod spec:
  initContainers:
    {{- include "watchproxy.sidecar.containers" .Subcharts.watchproxy | nindent 4 }}
  volumes:
    {{- include "watchproxy.sidecar.volumes" .Subcharts.watchproxy | nindent 4 }}
plus the ConfigMap this chart renders (it is rendered in sidecar mode too).
The application then dials 127.0.0.1:<ports.grpc>.
*/}}
{{- define "watchproxy.sidecar.containers" -}}
- name: watchproxy
  image: "{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  {{- if .Values.sidecar.enabled }}
  # A native sidecar: started before the application, stopped after it.
  restartPolicy: Always
  {{- end }}
  args: ["serve", "--config", "/etc/watchproxy/config/config.yaml", "--log-format", {{ .Values.logFormat | quote }}]
  env:
    - name: RUST_LOG
      value: {{ .Values.logLevel | quote }}
    {{- with .Values.env }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    - name: grpc
      containerPort: {{ .Values.ports.grpc }}
      protocol: TCP
    - name: metrics
      containerPort: {{ .Values.ports.metrics }}
      protocol: TCP
    - name: health
      containerPort: {{ .Values.ports.health }}
      protocol: TCP
  # Liveness asks only whether the process answers; readiness whether every
  # resource's cache is filled (NOT_SERVING also during shutdown).
  livenessProbe:
    grpc:
      port: {{ .Values.ports.health }}
      service: liveness
    periodSeconds: 10
    failureThreshold: 3
  readinessProbe:
    grpc:
      port: {{ .Values.ports.health }}
      service: watchproxy.v1.WatchProxy
    periodSeconds: 5
    failureThreshold: 2
  startupProbe:
    grpc:
      port: {{ .Values.ports.health }}
      service: liveness
    periodSeconds: 2
    failureThreshold: 30
  resources:
    {{- toYaml .Values.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  volumeMounts:
    - name: watchproxy-config
      mountPath: /etc/watchproxy/config
      readOnly: true
    {{- if not .Values.sidecar.enabled }}
    - name: watchproxy-continue-token
      mountPath: /etc/watchproxy/continue-token
      readOnly: true
    {{- end }}
    {{- if .Values.etcdTLS.enabled }}
    - name: watchproxy-etcd-tls
      mountPath: /etc/watchproxy/etcd-tls
      readOnly: true
    {{- end }}
    {{- if include "watchproxy.servesTLS" . }}
    - name: watchproxy-tls
      mountPath: /etc/watchproxy/tls
      readOnly: true
    {{- if .Values.tls.clientAuth }}
    - name: watchproxy-client-ca
      mountPath: /etc/watchproxy/client-ca
      readOnly: true
    {{- end }}
    {{- end }}
    {{- if .Values.auth.tokensSecret.name }}
    - name: watchproxy-tokens
      mountPath: /etc/watchproxy/tokens
      readOnly: true
    {{- end }}
    {{- if .Values.auth.jwksSecret.name }}
    - name: watchproxy-jwks
      mountPath: /etc/watchproxy/jwks
      readOnly: true
    {{- end }}
    {{- if .Values.upstreamTLS.enabled }}
    - name: watchproxy-upstream-tls
      mountPath: /etc/watchproxy/upstream-tls
      readOnly: true
    {{- end }}
    {{- if .Values.upstreamToken.secretName }}
    - name: watchproxy-upstream-token
      mountPath: /etc/watchproxy/upstream-token
      readOnly: true
    {{- end }}
{{- end }}

{{- define "watchproxy.sidecar.volumes" -}}
- name: watchproxy-config
  configMap:
    name: {{ include "watchproxy.fullname" . }}
{{- if not .Values.sidecar.enabled }}
- name: watchproxy-continue-token
  secret:
    secretName: {{ include "watchproxy.fullname" . }}-continue-token-key
    defaultMode: 0440
{{- end }}
{{- if .Values.etcdTLS.enabled }}
- name: watchproxy-etcd-tls
  secret:
    secretName: {{ required "etcdTLS.secretName is required when etcdTLS.enabled" .Values.etcdTLS.secretName }}
    defaultMode: 0440
{{- end }}
{{- if include "watchproxy.servesTLS" . }}
- name: watchproxy-tls
  secret:
    secretName: {{ include "watchproxy.tlsSecret" . }}
    defaultMode: 0440
{{- if .Values.tls.clientAuth }}
- name: watchproxy-client-ca
  secret:
    secretName: {{ include "watchproxy.clientCASecret" . }}
    defaultMode: 0440
    items:
      - key: {{ .Values.tls.clientCA.key }}
        path: {{ .Values.tls.clientCA.key }}
{{- end }}
{{- end }}
{{- if .Values.auth.tokensSecret.name }}
- name: watchproxy-tokens
  secret:
    secretName: {{ .Values.auth.tokensSecret.name }}
    defaultMode: 0440
{{- end }}
{{- if .Values.auth.jwksSecret.name }}
- name: watchproxy-jwks
  secret:
    secretName: {{ .Values.auth.jwksSecret.name }}
    defaultMode: 0440
{{- end }}
{{- if .Values.upstreamTLS.enabled }}
- name: watchproxy-upstream-tls
  secret:
    secretName: {{ required "upstreamTLS.secretName is required when upstreamTLS.enabled" .Values.upstreamTLS.secretName }}
    defaultMode: 0440
{{- end }}
{{- if .Values.upstreamToken.secretName }}
- name: watchproxy-upstream-token
  secret:
    secretName: {{ .Values.upstreamToken.secretName }}
    defaultMode: 0440
{{- end }}
{{- end }}
