#!/usr/bin/env bash
# The two README commands, each doing its own setup on a fresh machine:
#   ./run.sh demo   instrumented training on scikit-learn's digits, then a summary and a loss plot
#   ./run.sh test   the whole test suite (installs and starts the services tests need)
set -euo pipefail
cd "$(dirname "$0")"

VENV="${OBSERVERS_VENV:-.venv}"
PY="$VENV/bin/python"

setup() {
  if [ ! -x "$PY" ]; then
    python3 -m venv "$VENV"
  fi
  # Reinstall only when the requirements or package metadata changed.
  local stamp="$VENV/.observers-installed"
  local want
  want="$(cat requirements-dev.txt pyproject.toml exporters/*/pyproject.toml | sha256sum | cut -d' ' -f1)"
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    "$PY" -m pip install --quiet --upgrade pip
    "$PY" -m pip install --quiet -r requirements-dev.txt
    "$PY" -m pip install --quiet -e exporters/opentelemetry-exporter-hf-dataset -e .
    echo "$want" > "$stamp"
  fi
}

demo() {
  setup
  export PATH="$PWD/$VENV/bin:$PATH"
  # Local dataset only unless the caller configured an OTLP endpoint.
  export OTEL_TRACES_EXPORTER="${OTEL_TRACES_EXPORTER:-none}"
  export OTEL_METRICS_EXPORTER="${OTEL_METRICS_EXPORTER:-none}"
  export OTEL_LOGS_EXPORTER="${OTEL_LOGS_EXPORTER:-none}"
  export OBSERVERS_DATASET="${OBSERVERS_DATASET:-digits}"
  opentelemetry-instrument python docs/examples/train_digits.py "$@"
  observers summary "observers/$OBSERVERS_DATASET"
  observers plot "observers/$OBSERVERS_DATASET" --left loss --right learning_rate \
    --output "observers/$OBSERVERS_DATASET/loss.png"
  echo "plot: observers/$OBSERVERS_DATASET/loss.png"
}

tests() {
  setup
  if [ -x .ci/install-services.sh ]; then
    .ci/install-services.sh
  fi
  "$PY" -m pytest "$@"
}

case "${1:-}" in
  demo) shift; demo "$@" ;;
  test) shift; tests "$@" ;;
  *) echo "usage: ./run.sh demo|test [args]" >&2; exit 2 ;;
esac
