#!/bin/sh
# Make the ConfigMap `rootrank-rules` from the rule library: one key per rule file plus classes.yaml.
# Re-run after editing rules/; workers pick the new files up through their hot reload (a broken rule
# never replaces the last good set).
#   deploy/k8s/rules-configmap.sh | kubectl apply -n rootrank -f -
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
set --
for f in "$root"/rules/classes.yaml "$root"/rules/*/*.yaml; do
  set -- "$@" --from-file="$f"
done
kubectl create configmap rootrank-rules "$@" --dry-run=client -o yaml
