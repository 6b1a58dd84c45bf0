{{/*
Names. The release's full name is used as a prefix for every object; it is the release
name alone when that already contains the chart name, as most charts do.
*/}}
{{- define "localpv.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "localpv.fullname" -}}
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

{{- define "localpv.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels on every object; `labels` is nfs-subdir's value for extra labels.
Called with (dict "root" $ "component" "agent").
*/}}
{{- define "localpv.labels" -}}
helm.sh/chart: {{ include "localpv.chart" .root }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
{{ include "localpv.selectorLabels" . }}
{{- with .root.Values.labels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The immutable subset used in workload selectors; the component keeps the agent,
NFS and node-cleanup pods apart. */}}
{{- define "localpv.selectorLabels" -}}
app.kubernetes.io/name: {{ include "localpv.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/*
Which workloads run. The node agent runs unless `agent.enabled` says otherwise; left
unset (null) it runs only when this is not an NFS release, so an nfs-subdir values
file installs the NFS provisioner alone, and a local-static values file the agent alone.
*/}}
{{- define "localpv.agentEnabled" -}}
{{- if kindIs "bool" .Values.agent.enabled }}
{{- if .Values.agent.enabled }}true{{ end }}
{{- else if not (include "localpv.nfsEnabled" .) }}true
{{- end }}
{{- end }}

{{- define "localpv.nfsEnabled" -}}
{{- if or .Values.nfs.server .Values.buildMode }}true{{ end }}
{{- end }}

{{/* The service account of the agent and the NFS provisioner (one, as in both upstream charts). */}}
{{- define "localpv.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "localpv.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The image: upstream local-static writes one string (rendered as a template, so
"{{ .Chart.AppVersion }}" works); nfs-subdir writes {repository, tag, pullPolicy}.
Both are accepted. Unset (null, the default) it is localpv:<appVersion>: the default is
null rather than a string so that Helm merges an nfs-subdir map without its "skipped
value for localpv.image: Not a table" warning. The cleanup Jobs use the same image
(JOB_CONTAINER_IMAGE). The upstream charts' own images are refused (localpv.refusals).
*/}}
{{- define "localpv.image" -}}
{{- if kindIs "map" .Values.image }}
{{- printf "%s:%s" .Values.image.repository (toString (default .Chart.AppVersion .Values.image.tag)) }}
{{- else }}
{{- tpl (.Values.image | default "localpv:{{ .Chart.AppVersion }}") . }}
{{- end }}
{{- end }}

{{- define "localpv.imagePullPolicy" -}}
{{- if and (kindIs "map" .Values.image) .Values.image.pullPolicy }}
{{- .Values.image.pullPolicy }}
{{- else }}
{{- .Values.imagePullPolicy | default "" }}
{{- end }}
{{- end }}

{{/*
A container probe with exactly one handler, whatever the values say. Called with
(dict "value" .Values.livenessProbe "default" $defaultProbe "name" "livenessProbe").
  - unset (null): the default probe;
  - {} (upstream's `readinessProbe: {}`): no probe;
  - a map naming one handler (httpGet, tcpSocket, exec, grpc): that handler, with the
    default's timings for what it leaves out (so `--set livenessProbe.tcpSocket.port=metrics`
    and upstream 2.9's tcpSocket liveness probe replace our httpGet instead of being merged
    with it, which the API server refuses: "may not specify more than 1 handler type");
  - a map of timings only: the default handler with those timings;
  - two handlers or more: refused, naming them.
Renders the probe's YAML, or nothing.
*/}}
{{- define "localpv.probe" -}}
{{- $handlers := list "httpGet" "tcpSocket" "exec" "grpc" }}
{{- $value := .value }}
{{- if kindIs "invalid" $value }}
{{- with .default }}{{ toYaml . }}{{ end }}
{{- else if not (kindIs "map" $value) }}
{{- fail (printf "%s: expected a map (a Kubernetes probe), {} for none, or null for the default; found %v" .name $value) }}
{{- else if $value }}
{{- $given := list }}
{{- range $handlers }}{{ if hasKey $value . }}{{ $given = append $given . }}{{ end }}{{ end }}
{{- if gt (len $given) 1 }}
{{- fail (printf "%s: sets %s; a probe takes exactly one handler (Kubernetes refuses more). Keep one of them" .name (join " and " $given)) }}
{{- end }}
{{- $probe := omit .default "httpGet" "tcpSocket" "exec" "grpc" }}
{{- if not $given }}
{{- $probe = deepCopy .default }}
{{- end }}
{{- toYaml (merge (deepCopy $value) $probe) }}
{{- end }}
{{- end }}

{{/*
A host directory of the agent that may name its node: `$(NODE_NAME)` in agent.stateDir or
dynamic.kubeletDir stands for the node's name, for hosts where several nodes share one
filesystem (several kubelets on one host, as test clusters run them; a state disk mounted on
every node). A DaemonSet has one pod template, so the hostPath volume cannot name the node:
it is the directory above the first component holding `$(NODE_NAME)`, mounted at the same path
in the container (the kubelet names target paths as it sees them on the host), and the agent
is given the full path with `$(MY_NODE_NAME)`, which the kubelet expands from the pod's own
env (spec.nodeName) in args and env values. Input: dict "key" "path"; output, as JSON:
{"volume": the directory mounted, "path": what the agent is given}. Without `$(NODE_NAME)`,
both are the path itself.
*/}}
{{- define "localpv.perNodeDir" -}}
{{- $path := toString .path }}
{{- if contains "$(NODE_NAME)" $path }}
{{- $above := list }}
{{- $found := false }}
{{- range $part := splitList "/" $path }}
{{- if contains "$(NODE_NAME)" $part }}{{ $found = true }}{{ end }}
{{- if not $found }}{{ $above = append $above $part }}{{ end }}
{{- end }}
{{- dict "volume" (join "/" $above) "path" (replace "$(NODE_NAME)" "$(MY_NODE_NAME)" $path) | toJson }}
{{- else }}
{{- dict "volume" $path "path" $path | toJson }}
{{- end }}
{{- end }}

{{/* Refuse a per-node directory the chart cannot mount: see "localpv.perNodeDir". */}}
{{- define "localpv.perNodeDirRefusals" -}}
{{- $path := toString .path }}
{{- $rest := replace "$(NODE_NAME)" "" $path }}
{{- if contains "$(" $rest }}
{{- fail (printf "%s: expected $(NODE_NAME) as the only variable (the node's name), found %s" .key $path) }}
{{- end }}
{{- if and (contains "$(NODE_NAME)" $path) (eq (get (include "localpv.perNodeDir" . | fromJson) "volume") "") }}
{{- fail (printf "%s: expected $(NODE_NAME) below a directory of the host (that directory is mounted in the agent), found it in the first component of %s" .key $path) }}
{{- end }}
{{- end }}

{{/* A class's directory inside the agent container (upstream: hostDir when unset). */}}
{{- define "localpv.mountDir" -}}
{{- default .hostDir .mountDir }}
{{- end }}

{{/*
The agent container's securityContext. A non-empty `securityContext` is used whole,
except that `privileged` (upstream's legacy toggle) and `runAsUser: 0` are merged in
when it does not set them: the image's default user is unprivileged, and the agent
must be root to read every volume, delete tenants' files and open block devices.
*/}}
{{- define "localpv.agentSecurityContext" -}}
{{- $ctx := dict "privileged" .Values.privileged "runAsUser" 0 }}
{{- if kindIs "map" .Values.securityContext }}
{{- $ctx = merge (deepCopy .Values.securityContext) $ctx }}
{{- end }}
{{- toYaml $ctx }}
{{- end }}

{{/*
The NFS provisioner container's securityContext. Unset (`securityContext: {}`): root, as
upstream runs it (exports are usually root-owned, and a released claim's files, owned by its
pods' users, are deleted or archived), with only the capabilities that takes: DAC_OVERRIDE
(read, write and search any directory) and FOWNER (chmod a directory it adopts, delete in a
sticky directory); RuntimeDefault seccomp and no privilege escalation: the Pod Security
`baseline` level. A non-empty securityContext is used whole, with `runAsUser: 0` merged in
unless it sets runAsUser or runAsNonRoot (non-root and an export through a PVC pass
`restricted`: see the README).
*/}}
{{- define "localpv.nfsSecurityContext" -}}
{{- $ctx := .Values.securityContext | default dict }}
{{- if $ctx }}
{{- if or (hasKey $ctx "runAsUser") $ctx.runAsNonRoot }}
{{- toYaml $ctx }}
{{- else }}
{{- toYaml (merge (deepCopy $ctx) (dict "runAsUser" 0)) }}
{{- end }}
{{- else -}}
runAsUser: 0
allowPrivilegeEscalation: false
capabilities:
  drop: ["ALL"]
  add: ["DAC_OVERRIDE", "FOWNER"]
seccompProfile:
  type: RuntimeDefault
{{- end }}
{{- end }}

{{/*
The CSIDriver's fsGroupPolicy: File, unless the CSIDriver exists already on a Kubernetes
before 1.29, where its spec cannot change (a `helm upgrade` from a build whose CSIDriver had
no fsGroupPolicy, i.e. the default ReadWriteOnceWithFSType, failed on that object with
"spec: ... field is immutable", after updating the others): it keeps the value it has ("" when
the API server dropped the field), and NOTES.txt says how to get File. With `helm template`
(no cluster) lookup finds nothing: File.
*/}}
{{- define "localpv.csiFsGroupPolicy" -}}
{{- $live := lookup "storage.k8s.io/v1" "CSIDriver" "" .Values.dynamic.driverName }}
{{- if and $live (semverCompare "<1.29-0" .Capabilities.KubeVersion.Version) }}
{{- dig "spec" "fsGroupPolicy" "" $live }}
{{- else -}}
File
{{- end }}
{{- end }}

{{/* Whether the agents publish CSIStorageCapacity objects ("true" or ""): dynamic.storageCapacity,
default true. */}}
{{- define "localpv.capacityTracking" -}}
{{- if ternary .Values.dynamic.storageCapacity true (hasKey .Values.dynamic "storageCapacity") }}true{{ end }}
{{- end }}

{{/*
The CSIDriver's storageCapacity: dynamic.storageCapacity, unless the CSIDriver exists already on
a Kubernetes before 1.23, where the field cannot change (it became mutable in 1.23): a `helm
upgrade` from a build whose CSIDriver had no storageCapacity would fail on that object with
"spec: ... field is immutable". It keeps the value it has there ("" when it has none: the
default, false), and NOTES.txt says how to change it. With `helm template` (no cluster) lookup
finds nothing: the value.
*/}}
{{- define "localpv.csiStorageCapacity" -}}
{{- $live := lookup "storage.k8s.io/v1" "CSIDriver" "" .Values.dynamic.driverName }}
{{- if and $live (semverCompare "<1.23-0" .Capabilities.KubeVersion.Version) }}
{{- $kept := dig "spec" "storageCapacity" "" $live }}
{{- if kindIs "bool" $kept }}{{ $kept }}{{ end }}
{{- else -}}
{{ include "localpv.capacityTracking" . | eq "true" }}
{{- end }}
{{- end }}

{{/* The NFS provisioner's PROVISIONER_NAME: keep the old one when migrating (the
StorageClass's provisioner field is immutable and every existing PV names it). */}}
{{- define "localpv.nfsProvisionerName" -}}
{{- default (printf "cluster.local/%s" (include "localpv.fullname" .)) .Values.storageClass.provisionerName }}
{{- end }}

{{/* The pull secrets' names, comma-separated (LOCALPV_JOB_IMAGE_PULL_SECRETS: the agent gives
them to its cleanup Jobs, which run the same image). */}}
{{- define "localpv.imagePullSecretNames" -}}
{{- $names := list }}
{{- range .Values.imagePullSecrets }}
{{- if kindIs "string" . }}{{ $names = append $names . }}{{ else }}{{ $names = append $names .name }}{{ end }}
{{- end }}
{{- join "," $names }}
{{- end }}

{{/* Pull secrets accept both `- name: x` entries and plain names. */}}
{{- define "localpv.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
{{- if kindIs "string" . }}
  - name: {{ . }}
{{- else }}
  - {{ toYaml . | nindent 4 | trim }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* Refuse what this chart does not do, with the reason, instead of rendering something wrong. */}}
{{- define "localpv.refusals" -}}
{{- $image := include "localpv.image" . }}
{{- range $upstream := list "local-volume-provisioner" "local-volume-node-cleanup" "nfs-subdir-external-provisioner" }}
{{- if contains (printf "/%s:" $upstream) (printf "/%s" $image) }}
{{- fail (printf "image: %s is the upstream %s image, which does not run localpv; set image to the localpv image you built (--set image=REGISTRY/localpv:TAG, or image.repository and image.tag)" $image $upstream) }}
{{- end }}
{{- end }}
{{- range .Values.agent.extraArgs }}
{{- if regexMatch "^(-v+|--verbose)$" (toString .) }}
{{- fail (printf "agent.extraArgs: %s is not an option of `localpv agent` (the agent exits \"No such option\"); set agent.logLevel=info or debug instead" .) }}
{{- end }}
{{- end }}
{{- if .Values.enableWindows }}
{{- fail "enableWindows: localpv has no Windows agent; keep the upstream chart's Windows DaemonSet for Windows nodes, or set enableWindows=false" }}
{{- end }}
{{- $surge := dig "rollingUpdate" "maxSurge" 0 (.Values.updateStrategy | default dict) }}
{{- if not (has (toString $surge) (list "0" "0%" "<nil>")) }}
{{- fail (printf "updateStrategy.rollingUpdate.maxSurge: expected 0 (the default); found %v. A surge pod would be a second agent on the node's journal and disks while the old one runs (it would exit at start, holding the rollout); roll out with maxUnavailable instead" $surge) }}
{{- end }}
{{- if .Values.podSecurityPolicy.enabled }}
{{- fail "podSecurityPolicy.enabled: PodSecurityPolicy was removed in Kubernetes 1.25; set it to false and use Pod Security admission" }}
{{- end }}
{{- if include "localpv.agentEnabled" . }}
{{- include "localpv.perNodeDirRefusals" (dict "key" "agent.stateDir" "path" .Values.agent.stateDir) }}
{{- if .Values.dynamic.classes }}
{{- include "localpv.perNodeDirRefusals" (dict "key" "dynamic.kubeletDir" "path" .Values.dynamic.kubeletDir) }}
{{- $state := get (include "localpv.perNodeDir" (dict "path" .Values.agent.stateDir) | fromJson) "volume" }}
{{- $kubelet := get (include "localpv.perNodeDir" (dict "path" .Values.dynamic.kubeletDir) | fromJson) "volume" }}
{{- if eq (clean $state) (clean $kubelet) }}
{{- fail (printf "agent.stateDir: expected a host directory apart from dynamic.kubeletDir's, found both mounted from %s (the directory above $(NODE_NAME))" $state) }}
{{- end }}
{{- end }}
{{- end }}
{{- if and (include "localpv.agentEnabled" .) (not .Values.classes) (not .Values.dynamic.classes) }}
{{- fail "classes: the node agent needs at least one class (name and hostDir); set agent.enabled=false to run only the NFS provisioner" }}
{{- end }}
{{- if and (include "localpv.agentEnabled" .) .Values.dynamic.classes }}
{{- include "localpv.dynamicRefusals" . }}
{{- end }}
{{- include "localpv.podSecurityRefusals" . }}
{{- end }}

{{/*
A release namespace whose Pod Security label would reject the pods: the install would succeed
and no pod would run (the DaemonSet's and Deployment's events say why, and nothing else does).
Only what the chart can see is checked: the namespace's enforce label, read with lookup (not
with `helm template`, nor a cluster-wide default level). The agent and its cleanup Jobs need
`privileged`; the NFS provisioner with its default securityContext needs `baseline`.
*/}}
{{- define "localpv.podSecurityRefusals" -}}
{{- $key := "pod-security.kubernetes.io/enforce" }}
{{- $ns := lookup "v1" "Namespace" "" .Release.Namespace }}
{{- $level := dig "metadata" "labels" $key "" ($ns | default dict) }}
{{- $how := printf "Helm would succeed and no pod would run. Label the namespace: kubectl label --overwrite namespace %s %s=" .Release.Namespace $key }}
{{- if and (include "localpv.agentEnabled" .) (has $level (list "baseline" "restricted")) }}
{{- fail (printf "namespace %s enforces Pod Security %q (label %s), which rejects the node agent and its cleanup Jobs (privileged pods with hostPath volumes): %sprivileged, or run only the NFS provisioner there (agent.enabled=false)" .Release.Namespace $level $key $how) }}
{{- end }}
{{- if and (include "localpv.nfsEnabled" .) (eq $level "restricted") }}
{{- $why := list }}
{{- if not .Values.securityContext }}{{ $why = append $why "runs as root (the default securityContext)" }}{{ end }}
{{- if not (or .Values.nfs.mountOptions .Values.buildMode) }}{{ $why = append $why "mounts an nfs volume (nfs.mountOptions mounts the export through a PersistentVolumeClaim)" }}{{ end }}
{{- if $why }}
{{- fail (printf "namespace %s enforces Pod Security %q (label %s), which rejects the NFS provisioner: it %s. %sbaseline, or give it a non-root securityContext and nfs.mountOptions (chart README, Pod Security Admission)" .Release.Namespace $level $key (join " and " $why) $how) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Dynamic pools and classes that would make a bad volume. The agent refuses the same ConfigMap
(localpv config check says why); here the message names the values, before anything is
installed. Directories are compared cleaned (path.Clean: "//", "/./", a trailing "/").
*/}}
{{- define "localpv.dynamicRefusals" -}}
{{- $pools := .Values.dynamic.pools | default list }}
{{- $names := list }}
{{- range $i, $pool := $pools }}
{{- $names = append $names $pool.name }}
{{- $mine := dict "hostDir" (clean $pool.hostDir) "mountDir" (clean ($pool.mountDir | default $pool.hostDir)) }}
{{- range $j, $other := $pools }}
{{- if lt $j $i }}
{{- $theirs := dict "hostDir" (clean $other.hostDir) "mountDir" (clean ($other.mountDir | default $other.hostDir)) }}
{{- $clash := "" }}
{{- range $key := list "hostDir" "mountDir" }}
{{- if not $clash }}
{{- $a := get $mine $key }}
{{- $b := get $theirs $key }}
{{- $how := "" }}
{{- if eq $a $b }}{{ $how = "the same directory as" }}
{{- else if hasPrefix (printf "%s/" $b) $a }}{{ $how = "inside" }}
{{- else if hasPrefix (printf "%s/" $a) $b }}{{ $how = "containing" }}
{{- end }}
{{- if $how }}
{{- $clash = $key }}
{{- fail (printf "dynamic.pools[%d].%s: expected a directory apart from every other pool's, found %s, %s dynamic.pools[%d].%s (%s): each pool would count only its own images against one disk and take the other's for its own" $i $key $a $how $j $key $b) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- range $i, $class := .Values.dynamic.classes }}
{{- if not (has $class.pool $names) }}
{{- fail (printf "dynamic.classes[%d].pool: expected a pool of dynamic.pools (%s), found %q" $i (join ", " $names) (toString $class.pool)) }}
{{- end }}
{{- if eq ($class.provisioning | default "thin") "thick" }}
{{- range $option := $class.mountOptions }}
{{- if regexMatch "^discard(=.*)?$" (toString $option) }}
{{- fail (printf "dynamic.classes[%d].mountOptions: expected no \"discard\" in a thick class (%s): the filesystem's discards punch holes into its image and make it sparse, so the pool's room is no longer taken; found %s" $i $class.name (join ", " $class.mountOptions)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The directories the per-node overrides (classes[].nodes, dynamic.pools[].nodes) name, to be
mounted in every agent pod as the classes' and pools' own are (one pod spec serves every node;
each agent uses the ones its node gets). Returned as YAML {dirs: [{hostDir, mountDir}]}, without
the mount points the classes and pools already have. One mount point for two host directories
cannot be: refused, naming both.
*/}}
{{- define "localpv.overrideDirs" -}}
{{- $seen := dict }}
{{- range .Values.classes }}{{ $_ := set $seen (include "localpv.mountDir" .) (toString .hostDir) }}{{ end }}
{{- if .Values.dynamic.classes }}
{{- range .Values.dynamic.pools }}{{ $_ := set $seen (toString (.mountDir | default .hostDir)) (toString .hostDir) }}{{ end }}
{{- end }}
{{- $dirs := list }}
{{- $entries := list }}
{{- range $i, $class := .Values.classes }}{{ $entries = append $entries (dict "where" (printf "classes[%d]" $i) "nodes" $class.nodes) }}{{ end }}
{{- if .Values.dynamic.classes }}
{{- range $i, $pool := .Values.dynamic.pools }}{{ $entries = append $entries (dict "where" (printf "dynamic.pools[%d]" $i) "nodes" $pool.nodes) }}{{ end }}
{{- end }}
{{- range $entry := $entries }}
{{- range $j, $node := $entry.nodes }}
{{- if $node.hostDir }}
{{- $mountDir := toString ($node.mountDir | default $node.hostDir) }}
{{- if hasKey $seen $mountDir }}
{{- if ne (get $seen $mountDir) (toString $node.hostDir) }}
{{- fail (printf "%s.nodes[%d].mountDir: expected a mount point of its own in the agent (every node's agent pod mounts every directory), found %s, where %s is mounted already" $entry.where $j $mountDir (get $seen $mountDir)) }}
{{- end }}
{{- else }}
{{- $_ := set $seen $mountDir (toString $node.hostDir) }}
{{- $dirs = append $dirs (dict "hostDir" (toString $node.hostDir) "mountDir" $mountDir) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- toYaml (dict "dirs" $dirs) }}
{{- end }}
