#!/usr/bin/env bash
# `make run`: the local cluster, the images, the chart installed with a development tenant, the
# gateway on 127.0.0.1:8080, one execution through kubectl, one through the gateway, and
# `helm test`.
# Leaves everything running; `make down` stops it.
source "$(dirname "${BASH_SOURCE[0]}")/cluster/lib.sh"

RELEASE=sandpod
RELEASE_NAMESPACE=sandpod-system
TENANT=dev
TENANT_NAMESPACE=sandpod-dev
API_KEY_FILE=$STATE_DIR/api-key
JUDGE0_ENV_FILE=$STATE_DIR/judge0.env
E2B_ENV_FILE=$STATE_DIR/e2b.env
HELM=$(component_dir helm "$HELM_VERSION")/helm
IMAGE_ARCHIVES=${SANDPOD_IMAGE_CACHE:-$SANDPOD_CACHE/images}/out

# The content hash of a built image archive: a pod annotation, so that a rebuilt image (same
# tag) rolls its Deployment on the next `make run`.
image_digest() { cat "$IMAGE_ARCHIVES/$1.sha256" 2>/dev/null || echo unknown; }

development_api_key() {
  if ! [ -s "$API_KEY_FILE" ]; then
    printf 'sk-dev-%s' "$(openssl rand -hex 20)" >"$API_KEY_FILE"
    chmod 600 "$API_KEY_FILE"
  fi
  cat "$API_KEY_FILE"
}

# The environment of Judge0's official client (`judge0` on PyPI): its implicit client then talks
# to the gateway's Judge0 API as the development tenant (docs/judge0.md).
write_judge0_env() {
  (
    umask 077
    # Single quotes: the shell (set -a; . judge0.env) and python-dotenv both take them off.
    printf "JUDGE0_CE_ENDPOINT=http://%s/judge0\nJUDGE0_CE_AUTH_HEADERS='{\"X-Auth-Token\": \"%s\"}'\n" \
      "$GATEWAY_ADDRESS" "$(development_api_key)" >"$JUDGE0_ENV_FILE"
  )
}

# The environment of E2B's official SDKs (`e2b`, `e2b-code-interpreter` on PyPI): they then talk
# to the gateway's E2B API and sandboxes as the development tenant (docs/e2b.md).
write_e2b_env() {
  (
    umask 077
    printf 'E2B_API_URL=http://%s/e2b\nE2B_SANDBOX_URL=http://%s/e2b/sandbox\nE2B_API_KEY=%s\n' \
      "$GATEWAY_ADDRESS" "$GATEWAY_ADDRESS" "$(development_api_key)" >"$E2B_ENV_FILE"
  )
}

install_chart() {
  local key_digest values=$STATE_DIR/run-values.yaml
  key_digest=$(printf %s "$(development_api_key)" | sha256sum | cut -d' ' -f1)
  # The CRD is applied from crds/ rather than owned by this release: the test suites apply the
  # same file, and a CRD that Helm owns would be refused to them (and they to Helm).
  kubectl_admin apply --server-side --force-conflicts -f "$REPO_ROOT/crds/" >/dev/null
  cat >"$values" <<EOF
fullnameOverride: sandpod
crds: {enabled: false}
operator:
  # The development install serves its tenant's namespace, so test sessions on the same
  # cluster (which run operators of their own) never share executions with it.
  watchNamespaces: [$TENANT_NAMESPACE]
  podAnnotations: {sandpod.dev/image-digest: "$(image_digest operator)"}
gateway:
  podAnnotations: {sandpod.dev/image-digest: "$(image_digest gateway)"}
egressProxy:
  podAnnotations: {sandpod.dev/image-digest: "$(image_digest egress-proxy)"}
tenants:
  - name: $TENANT
    namespace: $TENANT_NAMESPACE
    apiKeys:
      - name: local
        sha256: $key_digest
    limits: {maxTimeoutSeconds: 60, maxMemory: 1Gi, maxConcurrent: 32, maxSessions: 16,
             requestsPerSecond: 200, requestBurst: 400}
    # A first run_code and a first session start warm (a started sandbox each).
    pools:
      - {name: python, language: python, resources: {cpu: "1", memory: 512Mi}, size: 1}
      - {name: python-sessions, language: python, resources: {cpu: "1", memory: 512Mi}, size: 1, sessions: true}
EOF
  log "installing the sandpod chart (release $RELEASE in $RELEASE_NAMESPACE)"
  "$HELM" upgrade --install "$RELEASE" "$REPO_ROOT/charts/sandpod" --kubeconfig "$KUBECONFIG_ADMIN" \
    --namespace "$RELEASE_NAMESPACE" --create-namespace --values "$values" --wait --timeout 5m >/dev/null
}

# Until the quota controller has counted the tenant namespace's ResourceQuotas, the API server
# refuses every create they limit ("status unknown for quota"), kubectl's included; a quota
# synced before the controller found the CRD is re-created (tests/support/sandpod_testkit/quotas.py).
wait_for_quotas() {
  log "waiting for the ResourceQuotas of $TENANT_NAMESPACE to count what they limit"
  PYTHONPATH="$REPO_ROOT/tests/support" "$VENV/bin/python" -m sandpod_testkit.quotas \
    --kubeconfig "$KUBECONFIG_ADMIN" "$TENANT_NAMESPACE" || die "the ResourceQuotas of $TENANT_NAMESPACE are not counted"
}

gateway_healthy() { curl -fsS "http://$GATEWAY_ADDRESS/readyz" >/dev/null 2>&1; }

serve_gateway() {
  local service_ip
  service_ip=$(kubectl_admin -n "$RELEASE_NAMESPACE" get service sandpod-gateway \
    -o jsonpath='{.spec.clusterIP}')
  printf '%s:80\n' "$service_ip" >"$GATEWAY_FORWARD_TARGET"
  log "serving the gateway on http://$GATEWAY_ADDRESS"
  stop_daemon gateway-forward  # the Service may be new
  start_gateway_forward
  wait_for "the gateway on $GATEWAY_ADDRESS" 60 gateway-forward gateway_healthy
}

run_with_kubectl() {
  log "running examples/hello.yaml with kubectl apply"
  kubectl_admin -n "$TENANT_NAMESPACE" delete --ignore-not-found -f "$REPO_ROOT/examples/hello.yaml" >/dev/null
  kubectl_admin -n "$TENANT_NAMESPACE" apply -f "$REPO_ROOT/examples/hello.yaml" >/dev/null
  kubectl_admin -n "$TENANT_NAMESPACE" wait --for=condition=Completed cx/hello --timeout=120s >/dev/null
  echo
  echo "== kubectl -n $TENANT_NAMESPACE get cx hello"
  kubectl_admin -n "$TENANT_NAMESPACE" get cx hello
  echo "== its stdout (.status.stdout)"
  kubectl_admin -n "$TENANT_NAMESPACE" get cx hello -o jsonpath='{.status.stdout}'
}

run_through_gateway() {
  echo
  echo "== POST http://$GATEWAY_ADDRESS/v1/executions"
  curl -sS "http://$GATEWAY_ADDRESS/v1/executions" -H "Authorization: Bearer $(development_api_key)" \
    -H 'Content-Type: application/json' \
    -d '{"language": "python", "code": "import sys\nprint(2 + 2)\nprint(\"to stderr\", file=sys.stderr)"}'
  echo
}

# The chart's own check, as its NOTES advise: one execution from a pod in the cluster through the
# gateway's Service, with the key the chart generated for the test (the development tenant's key
# is in the values as a digest only). Prints Helm's verdict and the test's last line.
run_helm_test() {
  local output
  echo
  echo "== helm test $RELEASE -n $RELEASE_NAMESPACE"
  if ! output=$("$HELM" test "$RELEASE" --kubeconfig "$KUBECONFIG_ADMIN" \
    --namespace "$RELEASE_NAMESPACE" --hide-notes --timeout 5m 2>&1); then
    printf '%s\n' "$output"
    die "helm test failed"
  fi
  printf '%s\n' "$output" | grep -E '^(TEST SUITE|Phase):'
  printf '%s\n' "$output" | grep '^ok: '
}

print_next_steps() {
  cat <<EOF

sandpod is running. The development tenant's API key is in .cluster/api-key; the environment of
Judge0's official client (judge0 on PyPI) is in .cluster/judge0.env, E2B's SDKs' in .cluster/e2b.env.
  export KUBECONFIG=$KUBECONFIG_ADMIN PATH=$STATE_DIR/bin:\$PATH
  kubectl -n $TENANT_NAMESPACE apply -f examples/lint.yaml && kubectl -n $TENANT_NAMESPACE get cx
  curl -s $GATEWAY_ADDRESS/v1/executions -H "Authorization: Bearer \$(cat .cluster/api-key)" \\
       -H 'Content-Type: application/json' -d '{"language": "javascript", "code": "console.log(6 * 7)"}'
  curl -s "$GATEWAY_ADDRESS/v1/executions?wait=false" -H "Authorization: Bearer \$(cat .cluster/api-key)" \\
       -H 'Content-Type: application/json' -d '{"language": "bash", "code": "for i in 1 2 3; do echo \$i; sleep 1; done"}'
  curl -sN $GATEWAY_ADDRESS/v1/executions/<id from above>/stream -H "Authorization: Bearer \$(cat .cluster/api-key)"
  curl -s $GATEWAY_ADDRESS/v1/languages -H "Authorization: Bearer \$(cat .cluster/api-key)"
  set -a && . .cluster/judge0.env && set +a && .venv/bin/python -c \
       'import judge0; print(judge0.run(source_code="print(6 * 7)", language=judge0.PYTHON).stdout)'
  set -a && . .cluster/e2b.env && set +a && .venv/bin/python examples/e2b_quickstart.py
  open http://$GATEWAY_ADDRESS/docs for the API, http://$GATEWAY_ADDRESS/mcp for MCP clients
Stop everything: make down
EOF
}

main() {
  local started=$SECONDS
  install_chart
  wait_for_quotas
  serve_gateway
  write_judge0_env
  write_e2b_env
  run_with_kubectl
  run_through_gateway
  run_helm_test
  log "ready in $((SECONDS - started)) s (after the cluster and images)"
  print_next_steps
}

main "$@"
