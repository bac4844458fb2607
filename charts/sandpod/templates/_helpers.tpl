{{/* Names, labels and shared fragments of the sandpod chart. */}}

{{- define "sandpod.name" -}}
{{- .Values.nameOverride | default .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* "<release>-sandpod", or the release name when it already contains the chart name. */}}
{{- define "sandpod.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := .Values.nameOverride | default .Chart.Name }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Name of one component's objects: "<fullname>-<component>". */}}
{{- define "sandpod.componentName" -}}
{{- printf "%s-%s" (include "sandpod.fullname" .root) .component | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object; call with (dict "root" $ "component" "operator"). */}}
{{- define "sandpod.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: sandpod
{{ include "sandpod.selectorLabels" . }}
{{- end }}

{{- define "sandpod.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sandpod.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- end }}

{{/* An image reference: a name with a "/" as it is, else <images.registry>/<name>:<tag>. */}}
{{- define "sandpod.image" -}}
{{- $images := .root.Values.images }}
{{- if contains "/" .name }}
{{- .name }}
{{- else }}
{{- printf "%s/%s:%s" (trimSuffix "/" $images.registry) .name (.tag | default $images.tag | default .root.Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/* The catalog file the operator and the gateway read, with image references resolved. */}}
{{- define "sandpod.catalog" -}}
{{- $languages := dict }}
{{- range $name, $language := .Values.catalog.languages }}
{{- $image := include "sandpod.image" (dict "root" $ "name" $language.image) }}
{{- $_ := set $languages $name (merge (dict "image" $image) (omit $language "image")) }}
{{- end }}
{{- toYaml (dict "languages" $languages) }}
{{- end }}

{{/*
The tenants' namespaces, each once (tenants may share one), as YAML:
{namespace: {create: bool, tenants: [names], narrowed: bool, egressCidrs: [cidrs]}}: narrowed
when every tenant there lists egress.allowedCidrs (then their union). Read it with fromYaml.
*/}}
{{- define "sandpod.tenantNamespaces" -}}
{{- $namespaces := dict }}
{{- range .Values.tenants }}
{{- $namespace := .namespace | default .name }}
{{- range (.egress | default dict).hostPresets | default list }}
{{- if not (hasKey $.Values.egressProxy.presets .) }}
{{- fail (printf "tenants: hostPresets names %q, which egressProxy.presets does not define" .) }}
{{- end }}
{{- end }}
{{- $create := ternary .createNamespace true (hasKey . "createNamespace") }}
{{- $entry := get $namespaces $namespace | default (dict "create" false "tenants" (list) "narrowed" true "egressCidrs" (list) "hostsNarrowed" true "egressHosts" (list)) }}
{{- $_ := set $entry "create" (or $entry.create $create) }}
{{- $_ := set $entry "tenants" (append $entry.tenants .name) }}
{{- if hasKey (.egress | default dict) "allowedCidrs" }}
{{- $_ := set $entry "egressCidrs" (concat $entry.egressCidrs .egress.allowedCidrs | uniq) }}
{{- else }}
{{- $_ := set $entry "narrowed" false }}
{{- end }}
{{- $egress := .egress | default dict }}
{{- if or (hasKey $egress "allowedHosts") (hasKey $egress "hostPresets") }}
{{- $hosts := $egress.allowedHosts | default list }}
{{- range $egress.hostPresets | default list }}
{{- $hosts = concat $hosts (get $.Values.egressProxy.presets .) }}
{{- end }}
{{- $_ := set $entry "egressHosts" (concat $entry.egressHosts $hosts | uniq) }}
{{- else }}
{{- $_ := set $entry "hostsNarrowed" false }}
{{- end }}
{{- with (.limits | default dict).maxStoredBytes }}
{{- $_ := set $entry "maxStoredBytes" (max (int64 .) (int64 ($entry.maxStoredBytes | default 0))) }}
{{- end }}
{{- $_ := set $namespaces $namespace $entry }}
{{- end }}
{{- toYaml $namespaces }}
{{- end }}

{{/* Each tenant namespace's bound on the bytes its executions keep, as YAML {namespace:
bytes or null (the operator's default)}: the largest its tenants set. */}}
{{- define "sandpod.storedBytesBounds" -}}
{{- $bounds := dict }}
{{- range $namespace, $entry := fromYaml (include "sandpod.tenantNamespaces" .) }}
{{- if hasKey $entry "maxStoredBytes" }}
{{- $_ := set $bounds $namespace $entry.maxStoredBytes }}
{{- else }}
{{- $_ := set $bounds $namespace nil }}
{{- end }}
{{- end }}
{{- toYaml $bounds }}
{{- end }}

{{/* The API keys Secret's name. */}}
{{- define "sandpod.apiKeysSecret" -}}
{{- .Values.apiKeys.existingSecret | default (include "sandpod.componentName" (dict "root" . "component" "api-keys")) }}
{{- end }}

{{/* The tenant `helm test` runs as: test.tenant, else the first tenant; empty without tenants. */}}
{{- define "sandpod.testTenant" -}}
{{- $names := list }}
{{- range .Values.tenants }}
{{- $names = append $names .name }}
{{- end }}
{{- with .Values.test.tenant }}
{{- if not (has . $names) }}
{{- fail (printf "test.tenant names %q, which is not in tenants" .) }}
{{- end }}
{{- . }}
{{- else }}
{{- first $names | default "" }}
{{- end }}
{{- end }}

{{/*
"true" when the chart makes the key `helm test` uses: the test is on, test.apiKey is empty,
the chart renders the keys Secret (no apiKeys.existingSecret) and there is a tenant to add it to.
*/}}
{{- define "sandpod.testKeyGenerated" -}}
{{- if and .Values.test.enabled .Values.gateway.enabled (not .Values.test.apiKey) (not .Values.apiKeys.existingSecret) (include "sandpod.testTenant" .) }}true{{ end }}
{{- end }}

{{/* "true" when the direct path is on (operator.directPort and a gateway to use it), else "". */}}
{{- define "sandpod.directPath" -}}
{{- if and .Values.operator.directPort .Values.gateway.enabled }}true{{ end }}
{{- end }}

{{- define "sandpod.testKeySecret" -}}
{{- include "sandpod.componentName" (dict "root" . "component" "test-api-key") }}
{{- end }}

{{/*
The generated test key: the one the chart generated before (its Secret, read with `lookup`, so
an upgrade keeps it), else a new random one. Each call without that Secret gives another key:
include it once per render and use the result (templates/api-keys-secret.yaml).
*/}}
{{- define "sandpod.generatedTestKey" -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "sandpod.testKeySecret" .) | default dict }}
{{- $generated := dig "metadata" "annotations" "sandpod.dev/chart-generated" "" $existing }}
{{- $previous := dig "data" "api-key" "" $existing }}
{{- if and (eq $generated "true") $previous }}
{{- $previous | b64dec }}
{{- else }}
{{- printf "sk-helm-test-%s" (randAlphaNum 40) }}
{{- end }}
{{- end }}

{{/*
Settings as environment variables: (dict "prefix" "SANDPOD_" "config" .Values.operator.config)
gives SANDPOD_MAX_MEMORY for maxMemory. Strings as they are, anything else as JSON (lists for
pydantic-settings; numbers without Helm's float formatting).
*/}}
{{- define "sandpod.settingsEnv" -}}
{{- range $key, $value := .config }}
- name: {{ printf "%s%s" $.prefix ($key | snakecase | upper) }}
  value: {{ ternary $value (toJson $value) (kindIs "string" $value) | quote }}
{{- end }}
{{- end }}

{{/* Pod-level fields shared by the chart's pods: pull secrets and security context. */}}
{{- define "sandpod.podSecurity" -}}
{{- with .Values.images.pullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- end }}

{{/* Scheduling fields of a component's pod; call with the component's values. */}}
{{- define "sandpod.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end }}

{{/* "true" when an entry of operator.watchNamespaces is a pattern (has a "*"): the namespaces
are not known at install time, so RBAC is cluster-wide and policies match by name. */}}
{{- define "sandpod.watchesByPattern" -}}
{{- range .Values.operator.watchNamespaces }}
{{- if contains "*" . }}true{{ end }}
{{- end }}
{{- end }}

{{/* A CEL expression: the request's namespace is one operator.watchNamespaces names or
matches ("*": any characters). For the admission policies' matchConditions. */}}
{{- define "sandpod.watchedNamespaceCondition" -}}
{{- $patterns := list }}
{{- range .Values.operator.watchNamespaces }}
{{- $patterns = append $patterns (printf "^%s$" (regexQuoteMeta . | replace "\\*" ".*")) }}
{{- end }}
{{- printf "%s.exists(p, request.namespace.matches(p))" (toJson $patterns) }}
{{- end }}

{{/* The kopf namespace flags: --all-namespaces, or one --namespace per watched namespace
(kopf takes "*" patterns as they are). */}}
{{- define "sandpod.operatorNamespaceArgs" -}}
{{- if .Values.operator.watchNamespaces }}
{{- range .Values.operator.watchNamespaces }}
- --namespace={{ . }}
{{- end }}
{{- else }}
- --all-namespaces
{{- end }}
{{- end }}

{{/* Name of a cluster-scoped RBAC object: "<namespace>-<fullname>-<component>" (releases of
the same name may live in several namespaces). */}}
{{- define "sandpod.clusterName" -}}
{{- printf "%s-%s-%s" .root.Release.Namespace (include "sandpod.fullname" .root) .component }}
{{- end }}

{{/* Egress to the API server's addresses; call with networkPolicies.apiServerEgress. */}}
{{- define "sandpod.apiServerEgressRule" -}}
- to:
    {{- range .cidrs }}
    - ipBlock:
        cidr: {{ . }}
    {{- end }}
  ports:
    {{- range .ports }}
    - protocol: TCP
      port: {{ . }}
    {{- end }}
{{- end }}

{{/* The API server's addresses and ports as pods reach them (after kube-proxy's DNAT), as
YAML {cidrs, ports}: networkPolicies.apiServerEgress and egress.apiServerCidrs when they name
any, else the `kubernetes` Service's endpoints as the cluster has them at install (none in
`helm template`). Read it with fromYaml. */}}
{{- define "sandpod.apiServerAddresses" -}}
{{- $egress := .Values.networkPolicies.apiServerEgress }}
{{- $cidrs := concat $egress.cidrs .Values.egress.apiServerCidrs | uniq }}
{{- $ports := $egress.ports }}
{{- if not $cidrs }}
{{- $ports = list }}
{{- range (lookup "discovery.k8s.io/v1" "EndpointSlice" "default" "").items }}
{{- if eq (index (.metadata.labels | default dict) "kubernetes.io/service-name") "kubernetes" }}
{{- $family := .addressType }}
{{- range .endpoints }}
{{- range .addresses }}
{{- $cidrs = append $cidrs (printf "%s/%s" . (ternary "128" "32" (eq $family "IPv6"))) }}
{{- end }}
{{- end }}
{{- range .ports }}
{{- $ports = append $ports .port }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- toYaml (dict "cidrs" ($cidrs | uniq) "ports" ($ports | uniq)) }}
{{- end }}

{{/* The selector labels as a label selector string: "k=v,k=v". */}}
{{- define "sandpod.selectorString" -}}
{{- $pairs := list }}
{{- range $key, $value := fromYaml (include "sandpod.selectorLabels" .) }}
{{- $pairs = append $pairs (printf "%s=%s" $key $value) }}
{{- end }}
{{- join "," $pairs }}
{{- end }}

{{/* The uninstall hook's (Cluster)RoleBinding: a RoleBinding when .namespace is set. */}}
{{- define "sandpod.uninstallBinding" -}}
apiVersion: rbac.authorization.k8s.io/v1
{{- if .namespace }}
kind: RoleBinding
metadata:
  name: {{ .name }}
  namespace: {{ .namespace }}
{{- else }}
kind: ClusterRoleBinding
metadata:
  name: {{ .clusterName }}
{{- end }}
  labels:
    {{- include "sandpod.labels" (dict "root" .root "component" "uninstall") | nindent 4 }}
  annotations:
    {{- toYaml .annotations | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {{ .clusterName }}
subjects:
  - kind: ServiceAccount
    name: {{ .name }}
    namespace: {{ .root.Release.Namespace }}
{{- end }}

{{/* The operator's pods as NetworkPolicyPeers (JSON list): the runner ingress policy's source. */}}
{{- define "sandpod.operatorPeers" -}}
{{- $pods := dict "matchLabels" (fromYaml (include "sandpod.selectorLabels" (dict "root" . "component" "operator"))) }}
{{- $namespace := dict "matchLabels" (dict "kubernetes.io/metadata.name" .Release.Namespace) }}
{{- list (dict "podSelector" $pods "namespaceSelector" $namespace) | toJson }}
{{- end }}

{{/* The cluster's own ranges an allowlist may never name, as YAML {what: [cidrs]}; the API
server's include networkPolicies.apiServerEgress.cidrs. Read it with fromYaml. */}}
{{- define "sandpod.egressClusterRanges" -}}
{{- $egress := .Values.egress }}
{{- $apiServer := concat $egress.apiServerCidrs .Values.networkPolicies.apiServerEgress.cidrs | uniq }}
{{- toYaml (dict "nodes" $egress.nodeCidrs "pods" $egress.podCidrs "services" $egress.serviceCidrs "apiServer" $apiServer) }}
{{- end }}

{{/* The narrowed tenant namespaces, as YAML {namespace: [cidrs]}. Read it with fromYaml. */}}
{{- define "sandpod.egressNarrowed" -}}
{{- $narrowed := dict }}
{{- range $namespace, $entry := fromYaml (include "sandpod.tenantNamespaces" .) }}
{{- if $entry.narrowed }}
{{- $_ := set $narrowed $namespace $entry.egressCidrs }}
{{- end }}
{{- end }}
{{- toYaml $narrowed }}
{{- end }}

{{/* The tenant namespaces narrowed to hosts, as YAML {namespace: [host patterns]}. */}}
{{- define "sandpod.egressNarrowedHosts" -}}
{{- $narrowed := dict }}
{{- range $namespace, $entry := fromYaml (include "sandpod.tenantNamespaces" .) }}
{{- if $entry.hostsNarrowed }}
{{- $_ := set $narrowed $namespace $entry.egressHosts }}
{{- end }}
{{- end }}
{{- toYaml $narrowed }}
{{- end }}

{{/* Every range the egress proxy never connects to unless opened: the non-public ranges and
the cluster's own, as a YAML list of CIDRs. Read it with fromYamlArray. */}}
{{- define "sandpod.proxyExcludedRanges" -}}
{{- $ranges := list }}
{{- range fromYamlArray (.Files.Get "files/non-public-ranges.yaml") }}
{{- $ranges = append $ranges .cidr }}
{{- end }}
{{- range $what, $cidrs := fromYaml (include "sandpod.egressClusterRanges" .) }}
{{- $ranges = concat $ranges $cidrs }}
{{- end }}
{{- toYaml ($ranges | uniq) }}
{{- end }}
