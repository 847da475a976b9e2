#!/usr/bin/env bash
# The GitHub Action's step (action.yml): submit an analysis (or a plan), wait, expose the
# budget as step outputs, fail the step when the job fails. Reads the action's inputs from
# CURVPLAN_STEP_* variables and appends KEY=VALUE outputs to $GITHUB_OUTPUT.
# Exit codes are the CLI's: 0 succeeded · 1 job failed/cancelled · 2 bad input ·
# 3 service unreachable · 4 timed out.
set -euo pipefail

: "${GITHUB_OUTPUT:?GITHUB_OUTPUT is not set (run inside GitHub Actions or set it)}"
args=()
if [[ -n "${CURVPLAN_STEP_MEASUREMENTS:-}" ]]; then
  args+=(plan "$CURVPLAN_STEP_MEASUREMENTS")
elif [[ -n "${CURVPLAN_STEP_MODEL:-}" ]]; then
  if [[ -n "${CURVPLAN_STEP_SPEC:-}${CURVPLAN_STEP_CHECKPOINT:-}" || -z "${CURVPLAN_STEP_DATA:-}" ]]; then
    echo "::error::'model' (a Hugging Face directory) takes 'data', not 'spec' or 'checkpoint'" >&2
    exit 2
  fi
  args+=(analyze --model "$CURVPLAN_STEP_MODEL" --data "$CURVPLAN_STEP_DATA")
else
  for var in CURVPLAN_STEP_SPEC CURVPLAN_STEP_CHECKPOINT CURVPLAN_STEP_DATA; do
    if [[ -z "${!var:-}" ]]; then
      echo "::error::give 'measurements', 'model' and 'data', or 'spec', 'checkpoint' and 'data'" >&2
      exit 2
    fi
  done
  args+=(analyze --spec "$CURVPLAN_STEP_SPEC" --checkpoint "$CURVPLAN_STEP_CHECKPOINT"
         --data "$CURVPLAN_STEP_DATA")
fi
if [[ "${args[0]}" == analyze ]]; then
  [[ -n "${CURVPLAN_STEP_TARGETS:-}" ]] && args+=(--targets "$CURVPLAN_STEP_TARGETS")
  # One item per line: options KEY=VALUE, intermediate checkpoints, sweep jobs (id or name).
  while IFS= read -r option; do
    [[ -n "$option" ]] && args+=(--option "$option")
  done <<< "${CURVPLAN_STEP_OPTIONS:-}"
  while IFS= read -r path; do
    [[ -n "$path" ]] && args+=(--intermediate "$path")
  done <<< "${CURVPLAN_STEP_INTERMEDIATE:-}"
  while IFS= read -r sweep; do
    [[ -n "$sweep" ]] && args+=(--sweep "$sweep")
  done <<< "${CURVPLAN_STEP_SWEEP:-}"
fi
[[ -n "${CURVPLAN_STEP_NAME:-}" ]] && args+=(--name "$CURVPLAN_STEP_NAME")
[[ -n "${CURVPLAN_STEP_TIMEOUT:-}" ]] && args+=(--timeout "$CURVPLAN_STEP_TIMEOUT")
[[ "${CURVPLAN_STEP_MLFLOW:-false}" == "true" ]] && args+=(--mlflow)
# A re-run of the same workflow run attempt resubmits nothing: the key names the attempt.
if [[ -n "${GITHUB_RUN_ID:-}" ]]; then
  args+=(--idempotency-key "gh-${GITHUB_RUN_ID}-${GITHUB_RUN_ATTEMPT:-1}-${GITHUB_ACTION:-curvplan}")
fi
result="${RUNNER_TEMP:-/tmp}/curvplan-job-$$.json"
status=0
"${CURVPLAN_STEP_CLI:-curvplan}" "${args[@]}" --wait --json --quiet \
  --outputs "$GITHUB_OUTPUT" > "$result" || status=$?
echo "result=$result" >> "$GITHUB_OUTPUT"
case "$status" in
  0) echo "curvplan job succeeded: $(grep -E '^(samples|batch_size)=' "$GITHUB_OUTPUT" | tr '\n' ' ')" ;;
  1) echo "::error::the curvplan job failed (details in $result)" >&2 ;;
  4) echo "::error::the curvplan job did not finish within ${CURVPLAN_STEP_TIMEOUT:-the timeout}" >&2 ;;
  *) echo "::error::curvplan exited with $status" >&2 ;;
esac
exit "$status"
